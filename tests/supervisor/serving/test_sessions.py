"""SessionHub black-box: a real hub on a real Unix socket, real `HostSurface`s, the real center.

The hub runs in its own process (tests/supervisor/sessions_harness.py) with one shared admin
client for every session; clients attach through the real pump (`python -I -S attach.py`)
driven by the official MCP SDK client, or as raw sockets where the test needs every byte.
Proven here:
- two sessions of two agents reach the center each with its own `agent_id` and generation,
  through the one shared client (both surfaces hold it);
- a peer `identify` refuses gets `refused <code> <message>` and a closed socket, no session (the
  pump prints the message and exits 3); an `identify` or `surface_for` that crashes gets its own
  refusal (`internal_unexpected_failure`, `surface_unavailable`), on a hub in this process;
- `close_where` ends an older generation's session (the client reads the stream's end) while a
  newer one keeps answering, on the shared client the closed surface did not close;
- a client that floods requests without reading stops being read: the hub's process stays
  within a bound while another session keeps answering, and every request is answered later;
- the socket's mode is the one asked for, a stale socket is replaced, a regular file refused,
  a served socket never taken over, and `aclose` unlinks the socket.

The tests about sessions share one hub (`shared_hub`; the test process is `agent-1` at the first
generation, which no session of these tests uses for center calls): each starts with no session
open and leaves none, and reads only deltas of `surfaces`. The tests about the socket file, and
so about a hub's start and end, start their own.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import count
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from mcphost.testing import DevCenter
from tests.waiting import until

# deep (make test-slow): the session hub: caps, floods, generations.
pytestmark = [pytest.mark.deep, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[3]
ATTACH = ROOT / "mcphost" / "attach.py"
FLOOD = 6_000
RSS_BOUND_KIB = 48 * 1024  # as the stdio test: peak growth over the warm-up baseline
GENERATIONS = count(1)  # the center fences a generation below one it has seen: always go up
PARENT_AS = f"agent-1:{next(GENERATIONS)}"  # the test process, to the shared hub (the oldest)
INIT = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "sessions-test", "version": "1"},
}


@pytest.fixture(scope="module")
def center(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCenter]:
    with DevCenter.start(tmp_path_factory.mktemp("center"), unix=True, control=True) as running:
        yield running


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="mh-sess-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Harness:
    """The hub's process: commands on its stdin, answers on its stdout."""

    def __init__(self, proc: subprocess.Popen[str], socket_path: Path) -> None:
        self.proc = proc
        self.socket = socket_path

    def ask(self, command: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def quit(self) -> int:
        assert self.ask("quit") == "bye"
        return self.proc.wait(30)


@contextmanager
def hub(
    center: DevCenter, base: Path, *, parent_as: str | None = None, mode: int = 0o600
) -> Iterator[Harness]:
    roots = {"agent-1": str(center.agent_root), "agent-2": str(base / "agent-2")}
    Path(roots["agent-2"]).mkdir(exist_ok=True)
    config = {
        "socket": str(base / "center.sock"),
        "mode": mode,
        "admin_url": center.admin_url("unix"),
        "token_file": str(center.state_dir / "worker-token"),
        "roots": roots,
        "parent_as": parent_as,
    }
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MCPHOST_LOG_FILE": str(base / "events.log")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.supervisor.sessions_harness", json.dumps(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=(base / "harness.stderr").open("w"),
        text=True,
        env=env,
        cwd=ROOT,
    )
    harness = Harness(proc, Path(config["socket"]))
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline().strip()
        assert ready == "ready", (base / "harness.stderr").read_text()[-3000:]
        yield harness
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def shared_hub(center: DevCenter) -> Iterator[Harness]:
    """One hub for the tests about sessions (the test process attaches as `PARENT_AS`).

    A fresh hub per test would prove nothing more: its configuration is the same, each test
    starts with no session open (`hub_now`) and counts only what it opens. At the module's end
    `quit` (aclose) must succeed.
    """
    base = Path(tempfile.mkdtemp(prefix="mh-sess-", dir="/tmp"))
    try:
        with hub(center, base, parent_as=PARENT_AS) as harness:
            yield harness
            assert harness.quit() == 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


def no_sessions(harness: Harness) -> bool:
    return harness.ask("count agent-1") == "count 0" and harness.ask("count agent-2") == "count 0"


@pytest.fixture
def hub_now(shared_hub: Harness) -> Iterator[Harness]:
    """The shared hub with no session open; every session the test opened ended after it."""
    until(lambda: no_sessions(shared_hub), 60, "an earlier test's sessions to end")
    yield shared_hub
    until(lambda: no_sessions(shared_hub), 60, "this test's sessions to end")


def surfaces(harness: Harness) -> tuple[int, int]:
    """(surfaces built so far, how many of them hold the one shared client)."""
    word, built, shared = harness.ask("surfaces").split()
    assert word == "surfaces"
    return int(built), int(shared)


def pump(socket_path: Path, as_agent: str | None) -> StdioServerParameters:
    env = {"PATH": os.environ["PATH"]}
    if as_agent is not None:
        env["MCPHOST_TEST_AS"] = as_agent
    return StdioServerParameters(
        command=sys.executable, args=["-I", "-S", str(ATTACH), str(socket_path)], env=env
    )


def text_of(result: Any) -> Any:
    return json.loads(result.content[0].text)


def calls_to(center: DevCenter, tool: str) -> list[dict[str, Any]]:
    return [e for e in center.requests(1000) if e.get("route") == f"/admin/agent-tools/{tool}"]


def generation_of(entry: dict[str, Any]) -> str | None:
    return {k.lower(): v for k, v in entry["headers"].items()}.get("x-ac-mcp-generation")


class Raw:
    """A raw client socket from this process (the harness names it `parent_as`)."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rb")
        self.status = self.file.readline()

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def answer(self) -> dict[str, Any]:
        line = self.file.readline()
        assert line, "the stream ended"
        return dict(json.loads(line))

    def initialize(self) -> None:
        self.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INIT})
        assert "result" in self.answer()
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def close(self) -> None:
        self.file.close()
        self.sock.close()


# -- identity through one shared client ---------------------------------------------------------


@pytest.mark.anyio
async def test_two_agents_reach_the_center_each_as_itself_through_one_shared_client(
    center: DevCenter, hub_now: Harness
) -> None:
    g1, g2 = next(GENERATIONS), next(GENERATIONS)
    harness = hub_now
    built, shared = surfaces(harness)
    before = len(calls_to(center, "get_my_work"))
    async with (
        Client(pump(harness.socket, f"agent-1:{g1}"), mode="legacy") as one,
        Client(pump(harness.socket, f"agent-2:{g2}"), mode="legacy") as two,
    ):
        assert harness.ask("count agent-1") == "count 1"
        assert harness.ask("count agent-2") == "count 1"
        first = await one.call_tool("get_my_work", {"agent_id": "agent-2"})
        second = await two.call_tool("get_my_work", {})
        assert first.is_error, "an agent_id argument is refused, never used"
        first = await one.call_tool("get_my_work", {})
        assert not first.is_error and not second.is_error, (first, second)
        assert surfaces(harness) == (built + 2, shared + 2), "both surfaces hold the one client"
    heard = calls_to(center, "get_my_work")[before:]
    assert sorted((e["body"]["agent_id"], generation_of(e)) for e in heard) == [
        ("agent-1", str(g1)),
        ("agent-2", str(g2)),
    ]


# -- refusal ------------------------------------------------------------------------------------


def test_a_refused_peer_gets_the_refused_line_and_no_session(hub_now: Harness) -> None:
    harness = hub_now
    built = surfaces(harness)
    probe = (
        "import socket,sys\n"
        "s=socket.socket(socket.AF_UNIX);s.connect(sys.argv[1])\n"
        "f=s.makefile('rb');sys.stdout.write(repr((f.readline(),f.read())))\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", probe, str(harness.socket)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"]},
    )
    line, rest = eval(out.stdout)  # a repr of two bytes objects, written just above
    assert line.startswith(b"refused not_in_fleet process ") and line.endswith(b"\n"), line
    assert rest == b"", "the socket is closed after the refused line"
    attach = subprocess.run(
        [sys.executable, "-I", "-S", str(ATTACH), str(harness.socket)],
        input=b'{"jsonrpc":"2.0","id":0,"method":"ping"}\n',
        capture_output=True,
        timeout=60,
        env={"PATH": os.environ["PATH"], "MCPHOST_TEST_AS": "agent-9:1"},
    )
    assert attach.returncode == 3, attach
    assert attach.stdout == b""
    assert b"mcphost attach: " in attach.stderr and b"(not_in_fleet)" in attach.stderr
    assert harness.ask("count agent-1") == "count 0"
    assert surfaces(harness) == built, "no surface is built for a refusal"


def test_refused_connects_are_logged_at_a_bounded_rate_with_a_count(
    center: DevCenter, short_dir: Path
) -> None:
    """A local user hammering a 0666 attach socket: 300 refused connects write at most
    `REFUSED_LOG_BURST` lines per window, then one line with the count of the rest."""
    from mcphost.supervisor.serving.sessions import REFUSED_LOG_BURST

    log = short_dir / "events.log"

    def named(event: str) -> list[dict[str, Any]]:
        lines = log.read_text().splitlines() if log.exists() else []
        return [e for e in map(json.loads, lines) if e.get("event") == event]

    with hub(center, short_dir, parent_as=None, mode=0o666) as harness:
        for _ in range(300):  # this process is no agent: each is refused
            line, _rest = read_status(harness.socket)
            assert line.startswith(b"refused not_in_fleet "), line
        (summary,) = until(
            lambda: named("supervisor.session.refused_suppressed"), 60, "the suppressed count"
        )
        logged = named("supervisor.session.refused")
        assert 0 < len(logged) <= REFUSED_LOG_BURST * 2, len(logged)  # one window, or two
        assert len(logged) + summary["suppressed"] >= 300 - REFUSED_LOG_BURST, summary
        assert harness.quit() == 0
    assert (
        len(logged) + sum(e["suppressed"] for e in named("supervisor.session.refused_suppressed"))
        == 300
    )


def read_status(path: Path) -> tuple[bytes, bytes]:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(path))
        stream = sock.makefile("rb")
        return stream.readline(), stream.read()


@pytest.mark.anyio
async def test_a_crashing_hook_is_refused_with_its_own_code_and_the_hub_carries_on(
    short_dir: Path,
) -> None:
    from mcphost.supervisor.serving.sessions import Attached, SessionHub

    crashes = ["identify"]

    def identify(cred: object) -> Attached:
        if crashes and crashes.pop() == "identify":
            raise RuntimeError("identify broke")
        return Attached("agent-1", 1)

    def surface_for(attached: Attached) -> Any:
        raise RuntimeError("surface_for broke")

    hub = SessionHub(str(short_dir / "hub.sock"), identify=identify, surface_for=surface_for)
    await hub.start()
    try:
        line, rest = await asyncio.to_thread(read_status, short_dir / "hub.sock")
        assert line == (
            b"refused internal_unexpected_failure the supervisor failed to identify this "
            b"process; its log has the details\n"
        )
        assert rest == b""
        line, rest = await asyncio.to_thread(read_status, short_dir / "hub.sock")
        assert line == (
            b"refused surface_unavailable the tools of agent agent-1 could not be set up; the "
            b"supervisor's log has the details\n"
        )
        assert rest == b""
    finally:
        await hub.aclose()


# -- closing an older generation ---------------------------------------------------------------


@pytest.mark.anyio
async def test_closing_an_older_generation_ends_its_session_while_another_stays(
    hub_now: Harness,
) -> None:
    g_new = next(GENERATIONS)  # newer than the test process's own (PARENT_AS)
    harness = hub_now
    old = Raw(harness.socket)
    assert old.status == f"ok {PARENT_AS.replace(':', ' ')}\n".encode()
    old.initialize()
    async with Client(pump(harness.socket, f"agent-1:{g_new}"), mode="legacy") as new:
        assert not (await new.call_tool("get_my_work", {})).is_error
        assert harness.ask("count agent-1") == "count 2"
        assert harness.ask(f"close agent-1 {g_new}") == "closed 1"
        assert harness.ask("count agent-1") == "count 1"
        assert old.file.read() == b"", "the old session's client sees the stream end"
        old.close()
        # the closed surface ran aclose(); the shared client it used is still open
        again = await new.call_tool("get_my_work", {})
        assert not again.is_error, again
        assert harness.ask(f"close agent-1 {g_new}") == "closed 0"


# -- backpressure per session -------------------------------------------------------------------


def status_kib(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {name} for {pid}")


def activity(pid: int) -> tuple[int, int]:
    """(bytes the process has read, its CPU ticks)."""
    rchar = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/io").read_text().splitlines()
        if line.startswith("rchar:")
    )
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return rchar, int(fields[11]) + int(fields[12])


def reset_peak(pid: int) -> None:
    """Reset the process's peak RSS (VmHWM) to its current RSS (Linux 4.0+; where the kernel
    refuses, VmHWM stays the lifetime peak, which only makes the bound harder to meet)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        pass


def asleep(pid: int) -> bool:
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:
            continue
    return all(state in "SDI" for state in states)


@pytest.mark.anyio
async def test_a_client_that_floods_without_reading_stays_bounded_and_others_keep_answering(
    hub_now: Harness,
) -> None:
    generation = next(GENERATIONS)
    harness = hub_now
    pid = harness.proc.pid
    flood = Raw(harness.socket)  # the test process: agent-1 (PARENT_AS)
    assert flood.status == f"ok {PARENT_AS.replace(':', ' ')}\n".encode()
    flood.initialize()
    async with Client(pump(harness.socket, f"agent-2:{generation}"), mode="legacy") as other:
        assert not (await other.call_tool("get_my_work", {})).is_error
        for n in range(200):  # warm-up: every lazy import and the allocator see an answer
            flood.send({"jsonrpc": "2.0", "id": -1 - n, "method": "tools/list"})
            assert flood.answer()["id"] == -1 - n
        baseline = status_kib(pid, "VmRSS")
        reset_peak(pid)  # VmHWM from here on: this test's peak, not an earlier test's
        payload = b"".join(
            b'{"jsonrpc":"2.0","id":%d,"method":"tools/list"}\n' % n for n in range(FLOOD)
        )
        written = threading.Event()
        failure: list[BaseException] = []

        def writer() -> None:
            try:
                flood.sock.sendall(payload)
            except BaseException as exc:
                failure.append(exc)
            written.set()

        # a small send buffer, so what the kernel holds cannot pass for backpressure
        flood.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 * 1024)
        threading.Thread(target=writer, name="flood", daemon=True).start()
        # the hub stops reading this session: it reads nothing more, burns no CPU, sleeps
        last: tuple[int, int] | None = None
        quiet = 0
        while quiet < 5:
            written.wait(0.05)
            grown = status_kib(pid, "VmRSS") - baseline
            assert grown <= RSS_BOUND_KIB, f"no backpressure: grew {grown // 1024} MiB"
            sample = activity(pid)
            quiet = quiet + 1 if sample == last and asleep(pid) else 0
            last = sample
        stalled = not written.is_set()
        # the other session is served meanwhile, on the same shared client
        answer = await other.call_tool("get_my_work", {})
        assert not answer.is_error, answer
        seen = set()
        for _ in range(FLOOD):
            got = flood.answer()
            assert got["result"]["tools"], got
            seen.add(got["id"])
        assert seen == set(range(FLOOD)), "every request is answered under its own id"
        assert written.wait(30) and not failure, failure
        peak = status_kib(pid, "VmHWM") - baseline
        assert peak <= RSS_BOUND_KIB, f"peak growth {peak // 1024} MiB"
        assert stalled, "the flood was never held up: the hub read it all unanswered"
    flood.close()


# -- the socket file ----------------------------------------------------------------------------


def test_the_socket_mode_is_as_asked_a_stale_socket_is_replaced_and_aclose_unlinks(
    center: DevCenter, short_dir: Path
) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(short_dir / "center.sock"))  # bound, never listening: a dead server's file
    stale.close()
    with hub(center, short_dir, mode=0o660) as harness:
        info = os.lstat(harness.socket)
        assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o660
        assert harness.quit() == 0
        assert not harness.socket.exists(), "aclose unlinks the socket"


def test_a_file_that_is_not_a_socket_is_never_replaced(center: DevCenter, short_dir: Path) -> None:
    (short_dir / "center.sock").write_text("precious")
    with pytest.raises(AssertionError, match="is not a socket"), hub(center, short_dir):
        pass
    assert (short_dir / "center.sock").read_text() == "precious"


def test_a_socket_someone_serves_is_never_taken_over(center: DevCenter, hub_now: Harness) -> None:
    first = hub_now  # serving; its `quit` at the module's end must still succeed
    with pytest.raises(AssertionError, match="already running"), hub(center, first.socket.parent):
        pass
    assert first.ask("count agent-1") == "count 0", "the first hub still serves"
