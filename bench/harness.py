"""Measurement tools shared by the benchmarks: a raw JSON-RPC stdio client, statistics, RSS.

The raw client is deliberately thin (asyncio subprocess, one line per message, ids matched by a
reader task) so that what it measures is the server, not the client. It drives every MCP server
under test the same way.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

INIT_PARAMS = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "mcphost-bench", "version": "1"},
}


@dataclass
class Stats:
    median: float
    p99: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats:
        ordered = sorted(samples)
        p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
        q = statistics.quantiles(ordered, n=4) if len(ordered) >= 4 else [ordered[0]] * 3
        return cls(statistics.median(ordered), p99, q[0], q[2], len(ordered))

    def fmt(self, unit: str = "ms", scale: float = 1000.0) -> str:
        return (
            f"{self.median * scale:.2f} {unit} "
            f"(IQR {self.low * scale:.2f}–{self.high * scale:.2f}, n={self.n})"
        )


def peak_rss_mb(pid: int) -> float:
    """VmHWM (peak resident set) of a live process, in MB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class RawMcp:
    """One MCP server subprocess driven over stdio with plain JSON-RPC lines."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.env = {**os.environ, **(env or {})}
        self.proc: asyncio.subprocess.Process | None = None
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self.spawned_at = 0.0

    async def start(self) -> float:
        """Spawn and initialize; return seconds from spawn to the initialize reply."""
        self.spawned_at = time.perf_counter()
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=self.env,
            limit=1 << 26,
        )
        self._reader = asyncio.create_task(self._read())
        await self.request("initialize", INIT_PARAMS)
        elapsed = time.perf_counter() - self.spawned_at
        await self.notify("notifications/initialized")
        return elapsed

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            message = json.loads(line)
            future = self._waiting.pop(message.get("id"), None)
            if future is not None and not future.done():
                future.set_result(message)
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(RuntimeError(f"{self.argv} closed stdout (exited?)"))

    async def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        await self._send(
            {"jsonrpc": "2.0", "method": method, **({"params": params} if params else {})}
        )

    async def request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        request_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        await self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        return await future

    async def call(self, tool: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        reply = await self.request("tools/call", {"name": tool, "arguments": arguments})
        if "error" in reply or reply["result"].get("isError"):
            raise RuntimeError(f"{tool} failed: {json.dumps(reply)[:500]}")
        return reply

    async def call_json(self, tool: str, arguments: Mapping[str, Any]) -> Any:
        """Call a tool and parse its text result as JSON."""
        reply = await self.call(tool, arguments)
        return json.loads(reply["result"]["content"][0]["text"])

    async def _send(self, message: Mapping[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        await self.proc.stdin.drain()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 5)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        if self._reader is not None:
            self._reader.cancel()


async def call_samples(call: Any, count: int, warmup: int = 20) -> list[float]:
    """Run `await call()` sequentially; the seconds each took, after a warm-up."""
    for _ in range(warmup):
        await call()
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    return samples


async def time_calls(call: Any, count: int, warmup: int = 20) -> Stats:
    """`call_samples`, summarised."""
    return Stats.of(await call_samples(call, count, warmup))


def python() -> str:
    return sys.executable
