"""The bundle's tmux server, with real tmux: sessions, capture, paste and submit, readiness, exit.

The stand-in agent is a small interactive program in a pane: it puts its terminal in raw mode,
turns bracketed paste on (as a coding agent's TUI does) and prompts `[n]> `, n being how many
inputs it has taken. An input ends at a "\\r" outside a paste; it appends `repr()` of the input's
bytes (markers included, without the final "\\r") to a log file, prints a summary and the next
prompt. So a test waits for `[n]> ` with the readiness gate itself and then reads exactly what
the pane received. No sleeps: every wait is on an outcome (the gate, a pidfd, a reaper future).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from mcphost.relay.envelope import Address, Envelope, join_batch, render
from mcphost.relay.panes import (
    NEVER_SETTLED,
    NOT_READY,
    RAWW_MAX_BYTES,
    READY,
    UNREACHABLE,
    UNRESPONSIVE,
    Gate,
    RawTextTooLarge,
    check_raw_text,
    deliver,
    prompt_text,
    raw_write,
)
from mcphost.relay.tmux import NoSuchSession, TmuxServer, watch_exit
from mcphost.unixsock import SUN_PATH_MAX

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

STANDIN = r"""
import os, sys, termios
log = open(sys.argv[1], "a", buffering=1)
attrs = termios.tcgetattr(0)
attrs[0] &= ~(termios.ICRNL | termios.INLCR | termios.IGNCR | termios.IXON)
attrs[3] &= ~(termios.ICANON | termios.ECHO)
attrs[6][termios.VMIN], attrs[6][termios.VTIME] = 1, 0
termios.tcsetattr(0, termios.TCSANOW, attrs)
START, END = b"\x1b[200~", b"\x1b[201~"
n = 0
out = sys.stdout
out.write("\x1b[?2004h[0]> ")
out.flush()
buf, pos, pasting = b"", 0, False
while True:
    data = os.read(0, 65536)
    if not data:
        break
    buf += data
    while True:
        if pasting:
            end = buf.find(END, pos)
            if end < 0:
                break
            pos, pasting = end + len(END), False
            continue
        start, enter = buf.find(START, pos), buf.find(b"\r", pos)
        if enter >= 0 and (start < 0 or enter < start):
            line, buf, pos = buf[:enter], buf[enter + 1:], 0
            log.write(repr(line) + "\n")
            text = line.replace(START, b"").replace(END, b"")
            if text.startswith(b"exit "):
                sys.exit(int(text[5:]))
            n += 1
            out.write(f"\ngot {len(line)} bytes\n[{n}]> ")
            out.flush()
        elif start >= 0:
            pos, pasting = start + len(START), True
        else:
            break
"""

QUICK = Gate(quiet_ms=100, poll_ms=10, timeout_ms=60_000)


def prompt_gate(n: int, **kwargs: Any) -> Gate:
    """Ready when the stand-in has taken `n` inputs and waits at its prompt (cursor at 5)."""
    fields: dict[str, Any] = {
        "quiet_ms": 100,
        "poll_ms": 10,
        "timeout_ms": 60_000,
        "prompt_regex": rf"^\[{n}\]>$",
        "idle_column": 5,
    }
    fields.update(kwargs)
    return Gate(**fields)


def received(log: Path) -> list[bytes]:
    """What the stand-in took, one entry per submitted input."""
    if not log.exists():
        return []
    return [ast.literal_eval(line) for line in log.read_text().splitlines()]


def pasted(text: str) -> bytes:
    """`text` as a bracketed paste arrives: markers around it, LF turned into CR."""
    return b"\x1b[200~" + text.encode().replace(b"\n", b"\r") + b"\x1b[201~"


@contextlib.asynccontextmanager
async def hosted(runtime_dir: Path) -> AsyncIterator[TmuxServer]:
    server = TmuxServer(runtime_dir)
    try:
        yield server
    finally:
        for name, owned in (await server.sessions()).items():
            if owned:
                await server.kill_session(name, grace=2.0)
        await server.kill_server()


async def standin(server: TmuxServer, name: str, log: Path) -> int:
    pid = await server.new_session(
        name, [sys.executable, "-c", STANDIN, str(log)], log.parent, {"LC_ALL": "C.UTF-8"}
    )
    assert await prompt_gate(0).wait(server, name) == READY
    return pid


def alive(pid: int) -> bool:
    """Running (a zombie is not: it has exited and only waits for its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def tmux_processes(runtime_dir: Path) -> list[int]:
    """Live processes that are a tmux of this runtime directory (by cwd or socket argument)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or not alive(int(entry)):
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if not cmdline or not os.path.basename(cmdline[0]).startswith(b"tmux"):
            continue
        if cwd == str(runtime_dir) or str(runtime_dir / "tmux.sock").encode() in cmdline:
            found.append(int(entry))
    return found


# -- delivery ------------------------------------------------------------------------------


async def test_an_envelope_arrives_intact_as_one_submitted_input(tmp_path: Path) -> None:
    log = tmp_path / "bravo.log"
    async with hosted(tmp_path / "run") as server:
        await standin(server, "bravo", log)
        envelope = render(
            Envelope(
                uuid.uuid4(),
                datetime.now(UTC),
                Address("alpha@party", 'Alice "A"'),
                Address("bravo@party"),
                "Hello Bravo,\nplease look at ünïcødé ✓ and this; too.\n\nThanks",
                cc=(Address("carol@party", "Carol"),),
                subject="Review",
            )
        )
        outcome = await deliver(server, "bravo", prompt_gate(0), lambda: envelope)
        assert (outcome.outcome, outcome.reason_code) == ("delivered", None)
        assert await prompt_gate(1).wait(server, "bravo") == READY
        assert received(log) == [pasted(envelope)]  # one input: markers, body, then the \r
        assert (await server.capture("bravo", 2)) == [
            f"got {len(pasted(envelope))} bytes",
            "[1]>",
        ]


async def test_a_batch_of_envelopes_is_one_input(tmp_path: Path) -> None:
    log = tmp_path / "bravo.log"
    async with hosted(tmp_path / "run") as server:
        await standin(server, "bravo", log)
        now = datetime.now(UTC)
        envelopes = [
            render(Envelope(uuid.uuid4(), now, Address(f"{who}@party"), Address("bravo@party"), m))
            for who, m in (("alpha", "first"), ("carol", "second"))
        ]
        batch = join_batch(envelopes)
        assert (
            await deliver(server, "bravo", prompt_gate(0), lambda: batch)
        ).outcome == "delivered"
        assert await prompt_gate(1).wait(server, "bravo") == READY
        assert received(log) == [pasted(batch)]


async def test_raww_without_enter_leaves_the_text_unsubmitted(tmp_path: Path) -> None:
    log = tmp_path / "bravo.log"
    async with hosted(tmp_path / "run") as server:
        await standin(server, "bravo", log)
        assert (await raw_write(server, "bravo", "first", no_enter=True)).outcome == "delivered"
        assert (await raw_write(server, "bravo", "second")).outcome == "delivered"
        assert await prompt_gate(1).wait(server, "bravo") == READY
        # One input holding both pastes: the first was never submitted on its own.
        assert received(log) == [pasted("first") + pasted("second")]
        assert (await raw_write(server, "bravo", "")).outcome == "delivered"  # a bare Enter
        assert await prompt_gate(2).wait(server, "bravo") == READY
        assert received(log)[1] == b""


async def test_raww_cap_is_32_kib_of_utf8(tmp_path: Path) -> None:
    assert check_raw_text("x" * RAWW_MAX_BYTES) == RAWW_MAX_BYTES
    assert check_raw_text("é" * (RAWW_MAX_BYTES // 2)) == RAWW_MAX_BYTES
    with pytest.raises(RawTextTooLarge) as too_large:
        check_raw_text("é" * (RAWW_MAX_BYTES // 2) + "x")
    assert too_large.value.code == "validation_invalid_params"
    assert too_large.value.details == {"max_bytes": 32768, "bytes": 32769}
    log = tmp_path / "bravo.log"
    async with hosted(tmp_path / "run") as server:
        await standin(server, "bravo", log)
        with pytest.raises(RawTextTooLarge):  # refused before anything reaches the pane
            await raw_write(server, "bravo", "y" * (RAWW_MAX_BYTES + 1))
        text = "".join(chr(ord("a") + i % 26) for i in range(RAWW_MAX_BYTES))
        assert (await raw_write(server, "bravo", text)).outcome == "delivered"
        assert await prompt_gate(1).wait(server, "bravo") == READY
        assert received(log) == [pasted(text)]  # the oversized one never arrived


async def test_delivery_to_a_missing_or_dead_target_is_not_submitted(tmp_path: Path) -> None:
    async with hosted(tmp_path / "run") as server:
        await server.start()
        outcome = await deliver(server, "ghost", QUICK, lambda: "x\n")
        assert (outcome.outcome, outcome.reason_code) == ("not_submitted", UNREACHABLE)
        assert (await raw_write(server, "ghost", "x")).reason_code == UNREACHABLE
        pid = await server.new_session("quitter", [sys.executable, "-c", "pass"], tmp_path, {})
        assert await watch_exit(server, "quitter", pid) == 0
        outcome = await deliver(server, "quitter", QUICK, lambda: "x\n")
        assert (outcome.outcome, outcome.reason_code) == ("not_submitted", UNREACHABLE)
        assert (await raw_write(server, "quitter", "x")).outcome == "not_submitted"


# -- capture and readiness ------------------------------------------------------------------


async def test_capture_returns_the_last_lines_without_the_blank_bottom(tmp_path: Path) -> None:
    script = "for i in range(50): print(f'line {i}')\ninput('> ')"
    async with hosted(tmp_path / "run") as server:
        await server.new_session("lines", [sys.executable, "-c", script], tmp_path, {})
        gate = Gate(quiet_ms=100, poll_ms=10, timeout_ms=60_000, prompt_regex=r"^>$")
        assert await gate.wait(server, "lines") == READY
        assert await server.capture("lines", 3) == ["line 48", "line 49", ">"]
        assert await server.capture("lines", 1) == [">"]
        everything = [f"line {i}" for i in range(50)] + [">"]
        assert await server.capture("lines", 1000) == everything  # history included
        assert await server.capture("lines", 51) == everything
        with pytest.raises(ValueError):
            await server.capture("lines", 0)
        for probe in (server.capture("nobody", 10), server.cursor_x("nobody")):
            with pytest.raises(NoSuchSession):  # never empty formats for a missing target
                await probe
        with pytest.raises(NoSuchSession):
            await server.pane_state("line")  # exact names: not a prefix of "lines"


async def test_the_gate_needs_quiet_prompt_and_column(tmp_path: Path) -> None:
    log = tmp_path / "bravo.log"
    async with hosted(tmp_path / "run") as server:
        await standin(server, "bravo", log)
        assert await server.cursor_x("bravo") == 5
        assert await Gate(quiet_ms=50, poll_ms=10).wait(server, "bravo") == READY
        assert await prompt_gate(0, idle_column=None).wait(server, "bravo") == READY
        # Settled, but not on this prompt / not at this column: not ready, until the timeout.
        assert await prompt_gate(7, timeout_ms=500).wait(server, "bravo") == NOT_READY
        assert await prompt_gate(0, idle_column=4, timeout_ms=500).wait(server, "bravo") == (
            NOT_READY
        )
        # The regex sees the last N non-empty lines joined with "\n".
        await raw_write(server, "bravo", "one")
        assert await prompt_gate(1).wait(server, "bravo") == READY
        two_lines = prompt_gate(1, prompt_regex=r"(?m)^got \d+ bytes\n\[1\]>$", inspect_lines=2)
        assert await two_lines.wait(server, "bravo") == READY
        one_line = prompt_gate(1, prompt_regex=r"got", inspect_lines=1, timeout_ms=500)
        assert await one_line.wait(server, "bravo") == NOT_READY
    assert prompt_text(["a", "", "  ", "b", "c", ""], 2) == "b\nc"
    assert prompt_text(["", "x"], 5) == "x"


async def test_a_pane_that_keeps_printing_never_becomes_ready(tmp_path: Path) -> None:
    chatter = "import itertools, time\nfor i in itertools.count():\n    print(i, flush=True)\n"
    chatter += "    time.sleep(0.005)\n"
    async with hosted(tmp_path / "run") as server:
        await server.new_session("chatty", [sys.executable, "-c", chatter], tmp_path, {})
        loop = asyncio.get_running_loop()
        started = loop.time()
        gate = Gate(quiet_ms=300, poll_ms=10, timeout_ms=1000)
        state = await gate.wait(server, "chatty")
        assert state == NEVER_SETTLED
        assert loop.time() - started >= 1.0  # it waited its whole bound
        outcome = await deliver(server, "chatty", gate, lambda: "never\n")
        assert (outcome.outcome, outcome.reason_code) == ("timeout", NEVER_SETTLED)


async def test_a_silent_pane_times_out_unresponsive_with_a_prime_bound(tmp_path: Path) -> None:
    async with hosted(tmp_path / "run") as server:
        await server.new_session("mute", ["sleep", "600"], tmp_path, {"PATH": os.defpath})
        gate = Gate(quiet_ms=50, poll_ms=10, prompt_regex=">", prime_timeout_ms=300)
        assert await gate.wait(server, "mute") == UNRESPONSIVE
        outcome = await deliver(server, "mute", gate, lambda: "x\n")
        assert (outcome.outcome, outcome.reason_code) == ("timeout", UNRESPONSIVE)


# -- sessions, exits, cleanup ---------------------------------------------------------------


async def test_the_pane_gets_exactly_its_argv_and_env(tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    script = (
        "import json, os, sys\n"
        "json.dump({'argv': sys.argv[1:], 'env': dict(os.environ), 'cwd': os.getcwd(),"
        " 'pid': os.getpid(), 'sid': os.getsid(0)}, open(os.environ['OUT'], 'w'))\n"
        "print('done')\ninput()\n"
    )
    argv = [sys.executable, "-c", script, "a;", ";", "b\\;", "#{pid}", "$HOME", "two words"]
    workdir = tmp_path / "we#{ird};"
    workdir.mkdir()
    # LC_ALL set: Python would otherwise coerce a C locale and add LC_CTYPE itself (PEP 538).
    env = {"OUT": str(out), "SECRET_TOKEN": "s3cr3t value;", "EMPTY": "", "LC_ALL": "C.UTF-8"}
    os.environ["MCPHOST_TEST_LEAK"] = "must not reach the pane"
    try:
        async with hosted(tmp_path / "run") as server:
            pid = await server.new_session("envy", argv, workdir, env, width=100, height=30)
            gate = Gate(quiet_ms=50, poll_ms=10, timeout_ms=60_000, prompt_regex="done")
            assert await gate.wait(server, "envy") == READY
            seen = json.loads(out.read_text())
            assert await server.pane_pid("envy") == pid == seen["pid"] == seen["sid"]
            assert await server.run("display-message", "-p", "-t", "=envy:", "#{pane_width}")
    finally:
        del os.environ["MCPHOST_TEST_LEAK"]
    assert seen["argv"] == argv[3:]
    assert seen["cwd"] == str(workdir)
    tmux_own = {"TERM", "TERM_PROGRAM", "TERM_PROGRAM_VERSION", "TMUX", "TMUX_PANE", "PWD"}
    tmux_own |= {"SHELL", "PATH"}
    assert {k: seen["env"][k] for k in env} == env
    assert set(seen["env"]) - set(env) <= tmux_own, set(seen["env"]) - set(env) - tmux_own
    assert "MCPHOST_TEST_LEAK" not in seen["env"] and "HOME" not in seen["env"]


async def test_ownership_guards_kill_session_and_kill_server(tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    async with hosted(runtime) as server:
        assert await server.sessions() == {}
        assert await server.kill_server()  # no server: nothing to do
        pid = await server.new_session("mine", ["sleep", "600"], tmp_path, {"PATH": os.defpath})
        assert oct(os.stat(runtime).st_mode & 0o777) == "0o700"
        with pytest.raises(Exception, match="already exists"):
            await server.new_session("mine", ["sleep", "1"], tmp_path, {})
        foreign = await server.run("new-session", "-d", "-s", "foreign", "sleep 600")
        assert foreign.returncode == 0
        assert await server.sessions() == {"mine": True, "foreign": False}
        assert await server.has_session("mine") and not await server.has_session("min")
        assert not await server.kill_session("foreign")  # not ours: left alone
        assert await server.has_session("foreign")
        assert not await server.kill_server()  # an owned session remains
        server_pid = await server.server_pid()
        assert server_pid is not None and alive(server_pid) and alive(pid)
        assert await server.kill_session("mine")
        assert not alive(pid) and not await server.has_session("mine")
        assert not await server.kill_session("mine")
        assert await server.kill_server()
        assert not alive(server_pid)
        assert tmux_processes(runtime) == []
        assert not os.path.exists(server.socket_path)
        assert await server.server_pid() is None and await server.sessions() == {}


async def test_kill_session_kills_a_pane_that_ignores_the_hangup(tmp_path: Path) -> None:
    stubborn = "import signal\nsignal.signal(signal.SIGHUP, signal.SIG_IGN)\nprint('on')\ninput()"
    async with hosted(tmp_path / "run") as server:
        pid = await server.new_session("stubborn", [sys.executable, "-c", stubborn], tmp_path, {})
        gate = Gate(quiet_ms=50, poll_ms=10, timeout_ms=60_000, prompt_regex="on")
        assert await gate.wait(server, "stubborn") == READY
        assert await server.kill_session("stubborn", grace=0.2)
        assert not alive(pid)


async def test_watch_exit_reports_the_pane_status(tmp_path: Path) -> None:
    log = tmp_path / "bravo.log"
    async with hosted(tmp_path / "run") as server:
        pid = await standin(server, "bravo", log)
        watcher = asyncio.ensure_future(watch_exit(server, "bravo", pid))
        assert (await raw_write(server, "bravo", "exit 3")).outcome == "delivered"
        assert await watcher == 3
        assert (await server.pane_state("bravo")).exit == 3
        assert await Gate(timeout_ms=60_000).wait(server, "bravo") == UNREACHABLE
        # Already gone before anyone watched: still 3, read from tmux.
        early = await server.new_session(
            "early", [sys.executable, "-c", "raise SystemExit(3)"], tmp_path, {}
        )
        assert await watch_exit(server, "early", early) == 3
        # Killed by a signal: negative, as os.waitstatus_to_exitcode says it.
        victim = await server.new_session("victim", ["sleep", "600"], tmp_path, {"PATH": "/bin"})
        assert (await server.pane_state("victim")).exit is None
        watcher = asyncio.ensure_future(watch_exit(server, "victim", victim))
        os.kill(victim, signal.SIGKILL)
        assert await watcher == -signal.SIGKILL
        # A session that is gone, or a pid that is not the pane's: None.
        assert await server.kill_session("victim")
        assert await watch_exit(server, "victim", victim) is None
        assert await watch_exit(server, "early", early + 1) is None


async def test_a_long_runtime_path_uses_the_bare_socket_name(tmp_path: Path) -> None:
    runtime = tmp_path / ("d" * 80) / ("e" * 80) / "bundle"
    async with hosted(runtime) as server:
        assert len(server.socket_path.encode()) > SUN_PATH_MAX
        log = tmp_path / "long.log"
        pid = await standin(server, "agent-with-a-rather-long-session-name_0123456789", log)
        assert os.path.exists(server.socket_path)
        assert await server.capture("agent-with-a-rather-long-session-name_0123456789", 1) == [
            "[0]>"
        ]
        assert await server.kill_session("agent-with-a-rather-long-session-name_0123456789")
        assert not alive(pid)
        assert await server.kill_server()
        assert tmux_processes(runtime) == []


def test_names_and_env_keys_are_checked() -> None:
    server = TmuxServer("/nonexistent/run")

    async def scenario() -> None:
        for bad in ("", "a.b", "a:b", "-x", "a b", "x" * 129):
            with pytest.raises(ValueError):
                await server.new_session(bad, ["true"], "/", {})
        with pytest.raises(ValueError):
            await server.new_session("ok", ["true"], "/", {"BAD-NAME": "x"})
        with pytest.raises(ValueError):
            await server.new_session("ok", [], "/", {})
        with pytest.raises(ValueError):
            Gate(prompt_regex="(unclosed")

    asyncio.run(scenario())


# -- under the supervisor's reaper ------------------------------------------------------------


async def _under_reaper(runtime_dir: str) -> dict[str, Any]:
    from mcphost.procfs import read_stat
    from mcphost.supervisor.confine import kernel
    from tests.supervisor.confine.test_kernel import until_async

    kernel.set_child_subreaper()
    reaper = kernel.Reaper()
    reaper.install()
    try:
        server = TmuxServer(runtime_dir, watch=reaper.watch)
        pid = await server.new_session(
            "agent", [sys.executable, "-c", "print('up'); input()"], runtime_dir, {}
        )
        gate = Gate(quiet_ms=50, poll_ms=10, timeout_ms=60_000, prompt_regex="up")
        ready = await gate.wait(server, "agent")
        server_pid = await server.server_pid()
        assert server_pid is not None
        stat = read_stat(server_pid)
        result = {
            "ready": ready,
            "server_parent_is_us": stat is not None and stat.ppid == os.getpid(),
            "missing": await server.has_session("nobody"),  # exit status 1, via the reaper
            "present": await server.has_session("agent"),
            "pane_is_tmux_child": (read_stat(pid) or stat).ppid == server_pid,
        }
        before = reaper.orphans_reaped
        result["killed"] = await server.kill_session("agent")
        result["server_killed"] = await server.kill_server()
        await until_async(lambda: reaper.orphans_reaped > before, "the tmux server reaped")
        return result
    finally:
        reaper.uninstall()


def test_under_the_supervisors_reaper_statuses_and_the_server_are_ours(tmp_path: Path) -> None:
    from tests.supervisor.confine.test_kernel import isolated

    result = isolated(_under_reaper, str(tmp_path / "run"))
    assert result == {
        "ready": READY,
        "server_parent_is_us": True,
        "missing": False,
        "present": True,
        "pane_is_tmux_child": True,
        "killed": True,
        "server_killed": True,
    }
