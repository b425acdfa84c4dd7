"""Hardening fixtures: a raw JSON-RPC driver for the real host process, and helpers.

`RawHost` speaks newline-delimited JSON-RPC to a real `mcphost host` subprocess without any SDK
in between, so tests can send anything (malformed, huge, concurrent) and see every stdout byte.
Its deadlines (a minute for an answer, 90 s for `initialize`) are for hangs only: a host on a
machine busy with other work answers late, not never. A reader thread parses each stdout line
(a line that does not parse is recorded as a purity violation) and validates it against the MCP
SDK's models (mcphost/testing/mcpschema.py; `close()` and the context manager fail on any violation), and
a second thread keeps stderr, so neither pipe ever blocks the host.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest

from mcphost.testing import DevCenter
from mcphost.testing.mcpschema import check_message

HOST_ARGS = ["-m", "mcphost.cli", "host"]
ROOT = Path(__file__).resolve().parents[2]

INIT_PARAMS = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "hardening", "version": "1"},
}


def host_env(binding: dict[str, str], **extra: str) -> dict[str, str]:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), **binding, **extra}
    return env


def run_in_process(
    argv: list[str], env: dict[str, str], module: str = "mcphost.cli"
) -> subprocess.CompletedProcess[bytes]:
    """`python -m <module> <argv>` with `env` as its whole environment, run in this process.

    For sweeps of runs that end while reading options and bindings (bad bindings, refused
    options): the same `main()` the process runs, with `env` as `os.environ`, file descriptors
    1 and 2 and `sys.stdout`/`sys.stderr` captured, and the exit code from its return value or
    `SystemExit`; a spawned interpreter would only add its start-up. A host that accepted its
    binding would start serving this process's stdin: that fails the run instead. Each sweep
    keeps a case or more as a real process (`run`/`subprocess`), so the entry point is covered.
    """
    import mcphost.mcpserve.stdio as stdio

    def refuse_to_serve(*_args: Any, **_kwargs: Any) -> int:
        raise AssertionError(f"{argv}: the binding was accepted and the server started")

    entry = import_module(module).main
    saved_env = dict(os.environ)
    saved_streams = sys.stdout, sys.stderr
    saved_serve = stdio.run
    sys.stdout.flush()
    sys.stderr.flush()
    saved_fds = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdout = io.TextIOWrapper(
                io.FileIO(1, "w", closefd=False), "utf-8", "surrogateescape", write_through=True
            )
            sys.stderr = io.TextIOWrapper(
                io.FileIO(2, "w", closefd=False), "utf-8", "backslashreplace", write_through=True
            )
            os.environ.clear()
            os.environ.update(env)
            stdio.run = refuse_to_serve  # type: ignore[assignment]
            try:
                code = entry(list(argv))
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else (exit_.code is not None)
        finally:
            stdio.run = saved_serve  # type: ignore[assignment]
            os.environ.clear()
            os.environ.update(saved_env)
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdout, sys.stderr = saved_streams
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            os.close(saved_fds[0])
            os.close(saved_fds[1])
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess([module, *argv], int(code or 0), out.read(), err.read())


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_json(data: bytes | str) -> Any:
    """RFC 8259 JSON only: NaN/Infinity (which Python would accept) are rejected."""
    return json.loads(data, parse_constant=_reject_constant)


def rss_kib(pid: int) -> int:
    """Resident set size of `pid` from /proc (KiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def pid_alive(pid: int) -> bool:
    """True while /proc shows `pid` and it is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class RawHost:
    """A real host process driven over raw stdio JSON-RPC."""

    def __init__(self, env: dict[str, str], args: list[str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *(args or HOST_ARGS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.messages: list[dict[str, Any]] = []
        self.bad_lines: list[bytes] = []
        self.by_id: dict[Any, dict[str, Any]] = {}
        self.stderr = bytearray()
        self.schema_violations: list[str] = []
        self.methods: dict[Any, str] = {}  # request id -> method, to pick the result model
        self._cond = threading.Condition()
        self._ids = itertools.count(1_000_000)
        self._out_done = False
        self._out_thread = threading.Thread(target=self._pump_out, daemon=True)
        self._out_thread.start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    # -- pumps -------------------------------------------------------------------------------
    def _pump_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                message = strict_json(line)
                ok = isinstance(message, dict) and message.get("jsonrpc") == "2.0"
                hash(message.get("id"))  # an answer's id is null, a string or a number
            except (ValueError, TypeError):
                ok = False
            with self._cond:
                if not ok:
                    self.bad_lines.append(line)
                else:
                    problem = check_message(message, self.methods.get(message.get("id")))
                    if problem is not None:
                        self.schema_violations.append(problem)
                    self.messages.append(message)
                    if "id" in message and ("result" in message or "error" in message):
                        self.by_id[message["id"]] = message
                self._cond.notify_all()
        with self._cond:
            self._out_done = True
            self._cond.notify_all()

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        while chunk := self.proc.stderr.read1(1 << 16):  # type: ignore[attr-defined]
            self.stderr += chunk

    # -- sending -----------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, message: dict[str, Any]) -> None:
        request_id = message.get("id")
        if type(request_id) in (int, str) and isinstance(message.get("method"), str):
            with self._cond:
                self.methods[request_id] = message["method"]
        self.write(json.dumps(message).encode() + b"\n")

    def next_id(self) -> int:
        return next(self._ids)

    def request(self, method: str, params: dict[str, Any] | None = None) -> int:
        request_id = self.next_id()
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        return request_id

    def wait(self, request_id: Any, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while request_id not in self.by_id:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._out_done:
                    raise AssertionError(
                        f"no answer to id {request_id!r} within {timeout}s "
                        f"(stdout closed: {self._out_done}); stderr tail:\n"
                        + self.stderr[-2000:].decode(errors="replace")
                    )
                self._cond.wait(min(remaining, 0.5))
            return self.by_id.pop(request_id)

    def wait_for(self, done: Any, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Wait until `done(messages)` is true for the messages so far; returns them."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not done(self.messages):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._out_done:
                    raise AssertionError(f"condition not met within {timeout}s")
                self._cond.wait(min(remaining, 0.5))
            return list(self.messages)

    def rpc(self, method: str, params: dict[str, Any] | None = None, timeout: float = 60.0) -> Any:
        return self.wait(self.request(method, params), timeout)

    def initialize(self) -> dict[str, Any]:
        answer = self.rpc("initialize", INIT_PARAMS, timeout=90)
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return answer

    def call(self, tool: str, arguments: dict[str, Any], timeout: float = 60.0) -> tuple[bool, Any]:
        """(is_error, parsed text) of a tools/call; a JSON-RPC error is returned as-is."""
        answer = self.rpc("tools/call", {"name": tool, "arguments": arguments}, timeout)
        if "error" in answer:
            return True, {"rpc_error": answer["error"]}
        result = answer["result"]
        text = result["content"][0]["text"]
        try:
            return bool(result["isError"]), json.loads(text)
        except ValueError:
            return bool(result["isError"]), text

    def alive(self, timeout: float = 60.0) -> None:
        """Prove the host still answers (a ping round trip)."""
        assert "result" in self.rpc("ping", timeout=timeout)

    # -- ending ------------------------------------------------------------------------------
    def close(self, timeout: float = 10.0) -> int:
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"host did not exit within {timeout}s of stdin EOF") from None
        self.check_schema()
        return code

    def check_schema(self) -> None:
        """Fail if any stdout message did not validate against the SDK's models."""
        self._out_thread.join(10)  # the process is gone: let the reader take its last lines
        assert not self.schema_violations, self.schema_violations[:5]

    def all_output(self) -> bytes:
        """Everything the host wrote: stdout messages (re-serialised) plus stderr."""
        with self._cond:
            out = b"\n".join(json.dumps(m).encode() for m in self.messages)
            out += b"\n" + b"".join(self.bad_lines)
        return out + b"\n" + bytes(self.stderr)

    def __enter__(self) -> RawHost:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if self.proc.poll() is None:
            try:
                self.close(5)
            except AssertionError:
                pass
        if exc_type is None and self.proc.poll() is not None:
            self.check_schema()


@pytest.fixture(scope="module")
def center(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCenter]:
    """A center per module: fault tests restart and kill theirs without touching the others."""
    with DevCenter.start(
        tmp_path_factory.mktemp("center"), unix=True, tcp=True, runtime_socket=True, control=True
    ) as running:
        yield running


def walk_keys(value: Any, depth: int = 0) -> Iterator[tuple[int, str, Any]]:
    """Every (depth, key, value) in a JSON document, depth-first: where identity could hide."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield depth, key, item
            yield from walk_keys(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from walk_keys(item, depth + 1)
