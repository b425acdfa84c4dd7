"""The stdio wire against a misbehaving client: backpressure, id-less errors, the line cap.

Black-box: each test drives the real `mcphost host` process (and `mcphost relay-tools`, which
serves on the same core) over raw pipes, so the same tests hold whichever protocol core serves
stdio (the SDK server behind our framing, `mcphost.mcpserve`).

- Backpressure: a client writes many `tools/list` requests from a thread and reads nothing
  until the host has stopped reading its stdin (the pipe into the host stays full while the
  host sleeps and reads nothing more). The host's peak RSS (VmHWM) must stay within a bound
  of its RSS after a warm-up measured in the same test; then every answer must arrive, each
  under its own id. A host without backpressure grows until the bound is crossed; the test
  then stops it at once instead of letting it reach gigabytes.
- Error replies to requests whose id cannot be read leave `id` out (MCP's schema: optional on
  errors, never `null`); each stdout message is checked against that schema here, and against
  the TypeScript SDK's own `JSONRPCMessageSchema` where node and tools/node_modules exist.
- A line over the 64 MiB cap is answered under its own id when the id sits at the top level
  of the line's first 64 KiB, without an `id` otherwise, and discarding the rest keeps the
  host's memory bounded.

Figures are printed for the closing report (`pytest -s`).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcphost.testing import DevCenter
from tests.hardening.conftest import (
    HOST_ARGS,
    INIT_PARAMS,
    ROOT,
    RawHost,
    host_env,
    rss_kib,
    strict_json,
)

# deep (make test-slow): stdio framing, caps and backpressure floods.
pytestmark = [pytest.mark.deep, pytest.mark.timeout(180)]

FLOOD = 6_000  # requests in the default run; the slow run sends the 100,000
RSS_BOUND_KIB = 48 * 1024  # peak growth over the warm-up baseline while answers go unread
LINE_CAP = 64 << 20
DISCARD_BOUND_KIB = (LINE_CAP >> 10) + 32 * 1024  # one capped line buffered, plus slack
F_GETPIPE_SZ = 1032
TS_CORE = ROOT / "tools" / "node_modules" / "@modelcontextprotocol" / "core"
FIGURES: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def report_figures() -> Iterator[None]:
    yield
    for name, figure in FIGURES.items():
        print(f"\nstdio wire figures, {name}: {figure}")


# -- the two processes that serve stdio --------------------------------------------------------


Launch = tuple[list[str], dict[str, str]]


@pytest.fixture(params=["host", "relay-tools"])
def served(request: pytest.FixtureRequest, center: DevCenter) -> Iterator[tuple[str, Launch]]:
    """(name, (argv after the interpreter, environment)) of one stdio server."""
    if request.param == "host":
        yield "host", (HOST_ARGS, host_env(center.binding_env("unix")))
        return
    root = Path(tempfile.mkdtemp(prefix="rtw-", dir="/tmp"))
    for sub in ("cfg", "state", "home"):
        (root / sub).mkdir(mode=0o700)
    args = ["-m", "mcphost.cli", "relay-tools", "--configuration-directory", str(root / "cfg")]
    args += ["--state-directory", str(root / "state")]
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "HOME": str(root / "home")}
    yield "relay-tools", (args, env)
    shutil.rmtree(root, ignore_errors=True)


# -- /proc readings ----------------------------------------------------------------------------


def proc_field(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {name} for {pid}")


def bytes_read(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError(f"no rchar for {pid}")


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def all_threads_asleep(pid: int) -> bool:
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:
            continue
    return all(state in "SDI" for state in states)


def pipe_fill(fd: int) -> tuple[int, int]:
    """(bytes waiting in the pipe, its capacity)."""
    waiting = int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"), sys.byteorder)
    return waiting, fcntl.fcntl(fd, F_GETPIPE_SZ)


# -- backpressure ------------------------------------------------------------------------------


def flood_without_reading(launch: Launch, count: int) -> dict[str, Any]:
    """Write `count` tools/list requests without reading; then read and check every answer."""
    argv, env = launch
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            [sys.executable, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
        )
        assert proc.stdin is not None and proc.stdout is not None
        stdin, stdout = proc.stdin, proc.stdout
        try:
            figures = _flood(proc, stdin, stdout, count)
            stdin.close()
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        stderr.seek(0)
        err = stderr.read()
    assert b"Traceback" not in err, err.decode(errors="replace")[-3000:]
    return figures


def _flood(proc: subprocess.Popen[bytes], stdin: Any, stdout: Any, count: int) -> dict[str, Any]:
    def ask(request_id: int, method: str, params: Any = None) -> dict[str, Any]:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        stdin.write(json.dumps(message).encode() + b"\n")
        stdin.flush()
        answer = strict_json(stdout.readline())
        assert answer["id"] == request_id and "result" in answer, answer
        return answer

    ask(-1, "initialize", INIT_PARAMS)
    stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    for n in range(200):  # warm-up: the allocator and every lazy import see a full answer
        ask(-2 - n, "tools/list")
    pid = proc.pid
    baseline = rss_kib(pid)
    read_before = bytes_read(pid)
    payload = b"".join(
        b'{"jsonrpc":"2.0","id":%d,"method":"tools/list"}\n' % n for n in range(count)
    )
    written = threading.Event()
    failure: list[BaseException] = []

    def writer() -> None:
        try:
            stdin.write(payload)
            stdin.flush()
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)
        written.set()

    started = time.monotonic()
    threading.Thread(target=writer, name="flood-writer", daemon=True).start()
    # Wait until the host has stopped reading: the pipe into it is full (or all was written),
    # it reads nothing more, burns no CPU and every thread sleeps, five samples in a row.
    last: tuple[int, int] | None = None
    quiet = 0
    peak = baseline
    while quiet < 5:
        written.wait(0.05)
        rss = rss_kib(pid)
        peak = max(peak, rss)
        if rss - baseline > RSS_BOUND_KIB:
            proc.kill()
            raise AssertionError(
                f"no backpressure: with none of its answers read, the host grew from "
                f"{baseline // 1024} MiB to {rss // 1024} MiB after reading "
                f"{(bytes_read(pid) - read_before) // 1024} KiB of requests "
                f"({time.monotonic() - started:.1f}s)"
            )
        waiting, capacity = pipe_fill(stdin.fileno()) if not written.is_set() else (0, 0)
        sample = (bytes_read(pid), cpu_ticks(pid))
        stalled = written.is_set() or waiting >= capacity
        quiet = quiet + 1 if stalled and sample == last and all_threads_asleep(pid) else 0
        last = sample  # a host that never settles is stopped by the test's timeout
    unread_phase = time.monotonic() - started
    accepted = bytes_read(pid) - read_before
    unread_peak = proc_field(pid, "VmHWM")
    seen: set[int] = set()
    for _ in range(count):
        answer = strict_json(stdout.readline())
        assert answer["jsonrpc"] == "2.0" and answer["result"]["tools"], answer
        assert answer["id"] not in seen
        seen.add(answer["id"])
    assert seen == set(range(count)), "every request is answered under its own id"
    assert written.wait(30) and not failure, failure
    ask(-10_000, "ping")
    peak_kib = proc_field(pid, "VmHWM")
    figures = {
        "requests": count,
        "baseline_rss_mib": round(baseline / 1024, 1),
        "peak_rss_while_unread_mib": round(unread_peak / 1024, 1),
        "peak_rss_mib": round(peak_kib / 1024, 1),
        "request_bytes_accepted_while_unread": accepted,
        "unread_phase_s": round(unread_phase, 2),
        "total_s": round(time.monotonic() - started, 2),
    }
    assert peak_kib - baseline <= RSS_BOUND_KIB, figures
    return figures


def test_a_client_that_does_not_read_cannot_grow_the_server(served: tuple[str, Launch]) -> None:
    name, launch = served
    figures = flood_without_reading(launch, FLOOD)
    FIGURES[f"backpressure {name}"] = figures


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_100000_unread_tools_list_requests_keep_the_host_bounded(center: DevCenter) -> None:
    """The issue's figure: 100,000 `tools/list` from a client that reads nothing at first."""
    figures = flood_without_reading((HOST_ARGS, host_env(center.binding_env("unix"))), 100_000)
    FIGURES["backpressure host, 100,000"] = figures


# -- error replies: MCP's schema ---------------------------------------------------------------


def mcp_schema_problem(message: Any) -> str | None:
    """Why `message` is not a JSON-RPC message MCP's schema (2025-11-25) allows, or None.

    Mirrors the TypeScript SDK's JSONRPCMessageSchema for what a server sends: results and
    errors (an error's `id` is optional but never null; the envelope admits no other member)
    and notifications.
    """
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return "not a JSON-RPC 2.0 object"

    def is_id(value: Any) -> bool:
        return isinstance(value, (str, int)) and not isinstance(value, bool)

    if "error" in message:
        if set(message) - {"jsonrpc", "id", "error"}:
            return f"unknown members {sorted(set(message) - {'jsonrpc', 'id', 'error'})}"
        if "id" in message and not is_id(message["id"]):
            return f"error id {message['id']!r}: omit it or give a string or an integer"
        error = message["error"]
        if not isinstance(error, dict):
            return "error is not an object"
        if not isinstance(error.get("code"), int) or not isinstance(error.get("message"), str):
            return "error needs an integer code and a string message"
        return None
    if "result" in message:
        if not is_id(message.get("id")) or not isinstance(message["result"], dict):
            return "a result needs a string or integer id and an object result"
        return None
    if isinstance(message.get("method"), str) and "id" not in message:
        return None
    return "neither a result, an error nor a notification"


UNREADABLE_IDS = [
    b"{not json",
    b'{"jsonrpc":"2.0","id":',
    b"[]",
    b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]',
    b'"ping"',
    b"42",
    b'{"jsonrpc":"2.0","id":null,"method":"ping"}',
    b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}',
    b'{"jsonrpc":"2.0","id":true,"method":"tools/list"}',
    b'{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}',
    b'{"jsonrpc":"2.0","id":[7],"method":"tools/call","params":{"name":"x"}}',
    b'{"jsonrpc":"2.0","id":NaN,"method":"ping"}',
    b'{"jsonrpc":"2.0","id":{"x":1}}',
    b'\xff\xfe{"jsonrpc":"2.0","id":3,"method":"ping"}',
]


def error_exchange(host: RawHost, lines: list[bytes]) -> list[dict[str, Any]]:
    """Send each line and a ping; return the id-less error each line got (exactly one)."""
    idless: list[dict[str, Any]] = []
    for line in lines:
        before = len(host.messages)
        host.write(line + b"\n")
        ping = host.request("ping")

        def settled(messages: list[dict[str, Any]], ping: int = ping, before: int = before) -> bool:
            new = messages[before:]
            return any(m.get("id") == ping for m in new) and any(
                "error" in m and m.get("id") is None for m in new
            )

        new = host.wait_for(settled, timeout=15)[before:]
        host.by_id.pop(ping, None)
        errors = [m for m in new if "error" in m and m.get("id") != ping]
        assert len(errors) == 1, (line, new)
        idless.append(errors[0])
    return idless


@pytest.fixture(scope="module")
def shared_host(center: DevCenter) -> Iterator[RawHost]:
    """One `mcphost host` for the tests that read only their own replies: the id-less errors,
    the line cap and the TypeScript SDK's schema. Each reads the messages from its own start, so
    a fresh process would prove nothing more. The line-cap test reads the peak RSS (VmHWM, which
    only grows): it comes before any other test sends this host an over-cap line (file order),
    and a peak left by another could only make its bound stricter. The host must exit 0 on
    stdin EOF once all are done, with no traceback on its stderr."""
    with RawHost(host_env(center.binding_env("unix"))) as host:
        host.initialize()
        yield host
        assert host.close() == 0
        assert b"Traceback" not in host.stderr, host.stderr.decode(errors="replace")[-3000:]


def idless_errors(host: RawHost) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the id-less errors, every message) of the unreadable-id exchange on `host`."""
    start = len(host.messages)
    errors = error_exchange(host, UNREADABLE_IDS)
    # requests whose id was readable keep it
    assert host.wait(host.request("nope/x"))["error"]["code"] == -32601
    host.write(b'{"jsonrpc":"2.0","id":"keep-me"}\n')
    assert host.wait("keep-me")["error"]["code"] == -32600
    return errors, host.messages[start:]


def test_errors_to_unreadable_ids_leave_the_id_out(
    request: pytest.FixtureRequest, served: tuple[str, Launch]
) -> None:
    name, (argv, env) = served
    if name == "host":
        host: RawHost = request.getfixturevalue("shared_host")
        errors, messages = idless_errors(host)
    else:
        with RawHost(env, argv) as host:
            host.initialize()
            errors, _ = idless_errors(host)
            assert host.close() == 0
        messages = host.messages  # all this process wrote, from its initialize on
    for line, error in zip(UNREADABLE_IDS, errors, strict=True):
        assert "id" not in error, (line, error)
        assert error["error"]["code"] in (-32700, -32600), (line, error)
    problems = [(m, p) for m in messages if (p := mcp_schema_problem(m))]
    assert not problems and not host.bad_lines, problems[:5]
    FIGURES[f"id-less errors {name}"] = {"lines": len(errors), "messages": len(messages)}


# -- the line cap ------------------------------------------------------------------------------


def over_cap_line(head: bytes, pad: int, tail: bytes = b"") -> bytes:
    return head + b'"pad":"' + b"x" * pad + b'"' + tail + b"}\n"


def test_a_line_over_the_cap_is_answered_under_its_own_id(shared_host: RawHost) -> None:
    host = shared_host
    host.alive()
    baseline = rss_kib(host.proc.pid)
    started = time.monotonic()
    host.write(over_cap_line(b'{"jsonrpc":"2.0","id":7,"method":"ping",', LINE_CAP))
    refused = host.wait(7, timeout=30)
    assert "error" in refused, f"a line over the cap was served: {refused}"
    assert refused["error"]["code"] == -32600
    data = refused["error"]["data"]
    assert data["code"] == "message_too_large" and data["details"]["limit_bytes"] == LINE_CAP
    assert "message" in data  # the remedy
    # a string id after a nested one, and a line far over the cap (discarded as it streams)
    head = b'{"jsonrpc":"2.0","method":"tools/call","params":{"id":1,"arguments":{}},'
    host.write(over_cap_line(head + b'"id":"big-1",', 3 * LINE_CAP))
    assert host.wait("big-1", timeout=60)["error"]["code"] == -32600
    # an id the first 64 KiB do not show: answered without one, never under a guess
    before = len(host.messages)
    host.write(over_cap_line(b'{"jsonrpc":"2.0","method":"ping",', LINE_CAP, b',"id":8'))
    host.alive(timeout=30)
    late = [m for m in host.messages[before:] if "error" in m]
    assert len(late) == 1 and "id" not in late[0], late
    assert 8 not in host.by_id
    host.alive()
    grown = host_peak(host) - baseline
    took = time.monotonic() - started
    assert grown <= DISCARD_BOUND_KIB, f"grew {grown // 1024} MiB discarding over-cap lines"
    assert not host.bad_lines
    FIGURES["line cap"] = {
        "bytes_discarded": 5 * LINE_CAP,
        "rss_growth_mib": round(grown / 1024, 1),
        "seconds": round(took, 2),
    }


def host_peak(host: RawHost) -> int:
    return proc_field(host.proc.pid, "VmHWM")


# -- every reply to bad input, through the TypeScript SDK's schema -----------------------------


def ts_sdk_accepts(messages: list[dict[str, Any]]) -> list[bool]:
    """Each message run through the TypeScript SDK's JSONRPCMessageSchema (zod, strict)."""
    script = (
        "const {JSONRPCMessageSchema: s} = require('@modelcontextprotocol/core');"
        "const lines = require('fs').readFileSync(0, 'utf8').split('\\n').filter(Boolean);"
        "console.log(JSON.stringify(lines.map(l => s.safeParse(JSON.parse(l)).success)));"
    )
    proc = subprocess.run(
        ["node", "-e", script],
        input="\n".join(json.dumps(m) for m in messages).encode(),
        capture_output=True,
        cwd=ROOT / "tools",
        timeout=60,
        check=True,
    )
    return json.loads(proc.stdout)


@pytest.mark.skipif(
    shutil.which("node") is None or not TS_CORE.exists(),
    reason="node or tools/node_modules/@modelcontextprotocol/core missing (`make node`)",
)
def test_every_reply_to_bad_input_passes_the_typescript_sdk_schema(shared_host: RawHost) -> None:
    host = shared_host
    start = len(host.messages)
    error_exchange(host, UNREADABLE_IDS)
    host.write(b'{"jsonrpc":"2.0","id":"big","pad":"' + b"x" * (LINE_CAP + 1) + b'"}\n')
    assert "error" in host.wait("big", timeout=30)
    host.alive()  # the last reply is in before the messages are taken
    messages = host.messages[start:]
    verdicts = ts_sdk_accepts(messages)
    rejected = [m for m, ok in zip(messages, verdicts, strict=True) if not ok]
    assert not rejected, rejected[:5]
