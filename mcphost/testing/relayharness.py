"""Test harness for the relay tools: a fake relay on a real Unix socket, a config fixture, and
two ways to drive the real `mcphost relay-tools` process over stdio (the official SDK client, and
a raw JSON-RPC line driver for wire-exact checks, which validates every stdout line against the
MCP SDK's models and fails the test on any violation: mcphost/testing/mcpschema.py).

The fake relay mirrors upstream's `FakeRelay`: it binds the relay socket, answers any Hello with a
`hello_ack` (or a configured rejection), records every request frame, and answers each request
with a canned `{"kind": ...}` response (per operation, optionally per namespace, or computed by a
handler) wrapped in a response frame echoing `request_id`. Requests are served concurrently, so
a handler that sleeps lets later requests overtake earlier ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, MCPError, StdioServerParameters

from mcphost.testing.mcpschema import check_message

Handler = Callable[[dict[str, Any]], Awaitable[Any] | Any]

BUNDLE_PARTY = """\
format-version = 1

[[sessions]]
id = "alpha"
name = "Alpha"
directory = "{root}/work/alpha"
coder = "default"

[[sessions]]
id = "bravo"
directory = "{root}/work/bravo"
coder = "default"

[[sessions]]
id = "charlie"
directory = "{root}/work/charlie"
coder = "acpcoder"
"""

BUNDLE_OTHER = """\
format-version = 1

[[sessions]]
id = "{first}"
directory = "{root}/work/{first}"
coder = "default"
"""

CODERS = """\
format-version = 1

[[coders]]
id = "default"
[coders.tmux]
initial-command = "sh -lc 'exec sleep 45'"

[[coders]]
id = "acpcoder"
[coders.acp]
channel = "stdio"
command = "true"
"""


def listed_bundle(bundle: str, members: list[str]) -> dict[str, Any]:
    """A canonical relay ListedBundle with optional fields present where the relay sets them."""
    return {
        "id": bundle,
        "hosted": True,
        "state": "up",
        "startup_health": "degraded",
        "startup_failure_count": 1,
        "recent_startup_failures": [
            {
                "session_id": members[-1],
                "transport": "acp",
                "code": "runtime_acp_initialize_failed",
                "reason": "initialize failed",
                "timestamp": "2026-05-01T10:00:00Z",
                "sequence": 3,
            }
        ],
        "principals": [
            {"id": f"{m}@{bundle}", "transport": "tmux", "ready": i == 0}
            for i, m in enumerate(members)
        ],
    }


def global_bundle() -> dict[str, Any]:
    return {
        "id": "GLOBAL",
        "hosted": True,
        "state": "up",
        "startup_failure_count": 0,
        "recent_startup_failures": [],
        "principals": [{"id": "user@GLOBAL", "transport": "ui", "ready": True}],
    }


def relay_error(code: str, message: str, details: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        error["details"] = details
    return {"kind": "error", "error": error}


def _default_response(frame: dict[str, Any]) -> Any:
    request = frame["request"]
    op = request.get("operation")
    if op == "list":
        namespace = frame.get("namespace", "party")
        if namespace == "GLOBAL":
            return {"kind": "list", "schema_version": "1", "bundle": global_bundle()}
        return {
            "kind": "list",
            "schema_version": "1",
            "bundle": listed_bundle(namespace, ["alpha", "bravo", "charlie"]),
        }
    return relay_error("internal_unexpected_failure", f"fake relay has no answer for {op}")


@dataclass
class FakeRelay:
    path: Path
    hellos: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    canned: dict[tuple[str, str | None], Any] = field(default_factory=dict)
    handler: Handler | None = None
    hello_reply: dict[str, Any] | None = None
    events_per_request: int = 0
    connections: int = 0
    _server: asyncio.AbstractServer | None = None
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)

    def respond(self, operation: str, response: Any, namespace: str | None = None) -> None:
        self.canned[(operation, namespace)] = response

    def forget(self) -> None:
        """Answer from now on as a fresh relay would: nothing canned, no handler, no extra
        events, no requests recorded. The live connection's record (`connections`, `hellos`,
        `hello_reply`) stays: it describes a connection that is still open."""
        self.requests.clear()
        self.canned.clear()
        self.handler = None
        self.events_per_request = 0

    def operations(self) -> list[str]:
        return [r["request"]["operation"] for r in self.requests]

    async def start(self) -> FakeRelay:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        path = os.fsencode(self.path)
        if len(path) > 100:  # bind through the directory fd, as the client connects
            dirfd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                sock.bind(f"/proc/self/fd/{dirfd}/{self.path.name}")
            finally:
                os.close(dirfd)
        else:
            sock.bind(str(self.path))
        self._server = await asyncio.start_unix_server(self._serve, sock=sock)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def drop_connections(self) -> None:
        for writer in self._writers:
            writer.close()
        self._writers.clear()

    async def _answer(self, frame: dict[str, Any]) -> Any:
        request = frame["request"]
        key_ns = (request.get("operation"), frame.get("namespace"))
        key = (request.get("operation"), None)
        if self.handler is not None:
            result = self.handler(frame)
            if asyncio.iscoroutine(result):
                result = await result
            if result is not ...:
                return result
        for k in (key_ns, key):
            if k in self.canned:
                canned = self.canned[k]
                return canned(frame) if callable(canned) else canned
        return _default_response(frame)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        lock = asyncio.Lock()
        tasks: set[asyncio.Task[None]] = set()

        async def send(obj: dict[str, Any]) -> None:
            async with lock:
                writer.write(json.dumps(obj).encode() + b"\n")
                with contextlib.suppress(Exception):
                    await writer.drain()

        async def handle(frame: dict[str, Any]) -> None:
            response = await self._answer(frame)
            if response is None:
                return  # never answer: lets the client time out
            for i in range(self.events_per_request):
                await send(
                    {
                        "frame": "event",
                        "event": {
                            "event_type": "delivery_outcome",
                            "target_session": "alpha@party",
                            "created_at": "2026-05-01T10:00:05Z",
                            "payload": {"message_id": f"m{i}", "phase": "routed"},
                        },
                    }
                )
            out: dict[str, Any] = {"frame": "response"}
            if "request_id" in frame:
                out["request_id"] = frame["request_id"]
            out["response"] = response
            await send(out)

        try:
            while line := await reader.readline():
                frame = json.loads(line)
                if frame.get("frame") == "hello":
                    self.hellos.append(frame)
                    if self.hello_reply is not None:
                        await send(self.hello_reply)
                        writer.close()
                        return
                    await send(
                        {
                            "frame": "hello_ack",
                            "schema_version": "1",
                            "principal_id": frame["principal_id"],
                        }
                    )
                    continue
                self.requests.append(frame)
                task = asyncio.ensure_future(handle(frame))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        except (ConnectionError, ValueError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


@dataclass
class Env:
    """A configuration root and a state root for one test, under a short /tmp path."""

    root: Path
    config: Path
    state: Path

    @property
    def socket(self) -> Path:
        return self.state / "relay.sock"

    @property
    def inscriptions(self) -> Path:
        return self.state / "inscriptions"

    def args(self, bundle: str | None = "party", session: str | None = "alpha") -> list[str]:
        out = ["--configuration-directory", str(self.config), "--state-directory", str(self.state)]
        if bundle is not None:
            out += ["--bundle", bundle]
        if session is not None:
            out += ["--session-name", session]
        return out

    def process_env(self, **extra: str) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.root / "home"),
            "MCPHOST_LOG_LEVEL": "warning",
        }
        env.update(extra)
        return env

    def inscription_events(self, bundle: str = "party", session: str = "alpha") -> list[dict]:
        path = self.inscriptions / "bundles" / bundle / "sessions" / session / "mcp.log"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]


def make_env(root: Path | None = None) -> Env:
    root = root or Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    config = root / "cfg"
    (config / "bundles").mkdir(parents=True)
    (config / "bundles" / "party.toml").write_text(BUNDLE_PARTY.format(root=root))
    for name in ("alpha", "zeta"):
        (config / "bundles" / f"{name}.toml").write_text(
            BUNDLE_OTHER.format(root=root, first=f"{name}1")
        )
    (config / "coders.toml").write_text(CODERS)
    for member in ("alpha", "bravo", "charlie"):
        (root / "work" / member).mkdir(parents=True)
    state = root / "state"
    state.mkdir(mode=0o700)
    (root / "home").mkdir()
    return Env(root, config, state)


def cleanup(env: Env) -> None:
    shutil.rmtree(env.root, ignore_errors=True)


def server_command(args: list[str]) -> tuple[str, list[str]]:
    return sys.executable, ["-m", "mcphost.cli", "relay-tools", *args]


@contextlib.asynccontextmanager
async def sdk_client(
    env: Env, args: list[str] | None = None, cwd: Path | None = None, **extra_env: str
) -> AsyncIterator[Client]:
    command, argv = server_command(env.args() if args is None else args)
    params = StdioServerParameters(
        command=command, args=argv, env=env.process_env(**extra_env), cwd=cwd or env.root
    )
    async with Client(params, mode="legacy", read_timeout_seconds=15) as client:
        yield client


def tool_json(result: Any) -> Any:
    """The JSON document a tool returned (structuredContent or the text content)."""
    if getattr(result, "structured_content", None):
        return result.structured_content
    return json.loads(result.content[0].text)


async def ok(client: Client, name: str, arguments: dict[str, Any]) -> Any:
    """Call a tool that must succeed; its JSON document."""
    result = await client.call_tool(name, arguments)
    assert not result.is_error, result
    return tool_json(result)


async def error_of(client: Client, name: str, arguments: dict[str, Any]) -> tuple[int, Any]:
    """Call a tool that must fail with a JSON-RPC error; its code and `data`."""
    with pytest.raises(MCPError) as info:
        await client.call_tool(name, arguments)
    return info.value.error.code, info.value.error.data


class RawServer:
    """Drive the server with raw JSON-RPC lines, to see omission vs null exactly."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self._next = 100
        self._waiters: dict[Any, asyncio.Future[dict[str, Any]]] = {}
        self._methods: dict[Any, str] = {}
        self.schema_violations: list[str] = []
        self._reader = asyncio.ensure_future(self._read())
        self.lines: list[bytes] = []

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            self.lines.append(line)
            message = json.loads(line)
            problem = check_message(message, self._methods.get(message.get("id")))
            if problem is not None:
                self.schema_violations.append(problem)
            fut = self._waiters.pop(message.get("id"), None)
            if fut is not None and not fut.done():
                fut.set_result(message)

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._next += 1
        rid = self._next
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiters[rid] = fut
        self._methods[rid] = method
        await self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        return await asyncio.wait_for(fut, 15)

    async def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        await self.proc.stdin.drain()

    async def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return await self.request("tools/call", {"name": name, "arguments": arguments})


@contextlib.asynccontextmanager
async def raw_server(
    env: Env, args: list[str] | None = None, **extra_env: str
) -> AsyncIterator[RawServer]:
    command, argv = server_command(env.args() if args is None else args)
    proc = await asyncio.create_subprocess_exec(
        command,
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=env.process_env(**extra_env),
        cwd=env.root,
    )
    server = RawServer(proc)
    completed = False
    try:
        init = await server.request(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        )
        assert "result" in init, init
        await server.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        yield server
        completed = True
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server._reader, 5)  # the last lines, up to stdout EOF
        server._reader.cancel()
    if completed:
        assert not server.schema_violations, server.schema_violations[:5]
