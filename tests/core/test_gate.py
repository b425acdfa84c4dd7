"""The child's entry steps and the tmux pane's gate (mcphost/gate.py), run as the pane runs it.

The gate is started exactly as agents/tmux.py starts it (`python -I -S gate.py FIFO ARGV...`, so
without site-packages: it must need nothing but the standard library), handed its message on a
FIFO as the runner writes it (`fenced_message`, `NO_FENCE`, `with_cgroup`, `with_switch`), and
the program it execs reports what it got: the same pid, a session keyring of its own, no new
privileges, the forwarded signals ignored, the cgroup entry written, the user switched. Each
way it refuses has its status: 2 (usage), 1 (the runner gave up: EOF), 126 (a step failed),
127 (no such program). The fence's bubblewrap around it: tests/supervisor/confine/test_fence.py.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from mcphost import gate
from mcphost.gate import NO_FENCE, Switch, fenced_message, with_cgroup, with_switch
from mcphost.supervisor.agents.tmux import GATE
from tests.waiting import until

ROOT = os.geteuid() == 0
# What the exec'd program reports: its pid, session keyring, NoNewPrivs and ignored signals.
REPORT = f"""
import ctypes, json, os
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines())
keyring = ctypes.CDLL(None).syscall({gate.SYS_KEYCTL}, 0, -3, 0)  # KEYCTL_GET_KEYRING_ID
print(json.dumps({{"pid": os.getpid(), "keyring": keyring,
                  "no_new_privs": status["NoNewPrivs"].strip(),
                  "ignored": int(status["SigIgn"], 16)}}))
"""
PROGRAM = [sys.executable, "-c", REPORT]


def ignored(report: dict[str, int]) -> set[int]:
    """The signals the reporting program ignores (its `SigIgn` mask)."""
    return {n for n in range(1, 65) if report["ignored"] >> (n - 1) & 1}


def forwarded() -> set[int]:
    return {int(getattr(signal, f"SIG{name}")) for name in gate.FORWARDED}


def session_keyring() -> int:
    return int(ctypes.CDLL(None).syscall(gate.SYS_KEYCTL, 0, -3, 0))


def open_writer(fifo: Path, gated: subprocess.Popen[bytes]) -> int | None:
    """The FIFO's write end once the gate has opened it to read (None before: ENXIO)."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENXIO and gated.poll() is None:
            return None
        raise


def run_gate(
    tmp_path: Path, message: bytes | None, argv: Sequence[str] = PROGRAM
) -> tuple[int, str, str, int]:
    """Start the gate on a fresh FIFO, then write `message` (None: close it unwritten, as a
    runner that gave up); its status, stdout, stderr and pid."""
    fifo = tmp_path / "pane.gate"
    os.mkfifo(fifo, 0o600)
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", GATE, str(fifo), *argv],
        stdin=subprocess.PIPE,  # not /dev/null: a switching gate chowns its terminal, fd 0
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    writer = until(lambda: open_writer(fifo, proc), what="the gate opens its FIFO")
    try:
        if message is not None:
            os.write(writer, message)
    finally:
        os.close(writer)
    out, err = proc.communicate()
    return proc.returncode, out.decode(), err.decode(), proc.pid


def test_the_gate_is_this_module_run_as_a_script() -> None:
    assert Path(GATE) == Path(gate.__file__).resolve()


def test_without_a_fence_the_argv_runs_as_it_is_with_a_keyring_of_its_own(
    tmp_path: Path,
) -> None:
    code, out, err, pid = run_gate(tmp_path, NO_FENCE)
    assert code == 0, err
    got = json.loads(out)
    assert got["pid"] == pid  # exec'd: the pane's pid is the agent's
    assert got["keyring"] != session_keyring()
    assert got["no_new_privs"] == "0" and not forwarded() & ignored(got)  # nothing else


@pytest.mark.parametrize("forward", [False, True])
def test_a_fenced_message_enters_then_execs_its_own_argv(tmp_path: Path, forward: bool) -> None:
    """The message's argv (bubblewrap's command line, here the report itself) runs, not the
    gate's ARGV; after `enter`: no new privileges, and with `forward` the signals bubblewrap
    must pass on ignored (the agent gets them back by `env --default-signal`)."""
    message = fenced_message(PROGRAM, gate.landlock_abi(), forward)
    code, out, err, pid = run_gate(tmp_path, message, argv=["/nonexistent/never-run"])
    assert code == 0, err
    got = json.loads(out)
    assert got["pid"] == pid and got["keyring"] != session_keyring()
    assert got["no_new_privs"] == "1"
    assert forwarded() & ignored(got) == (forwarded() if forward else set()), ignored(got)


def test_the_cgroup_is_entered_first(tmp_path: Path) -> None:
    """The gate writes "0" (itself) to each entry file: here plain files stand in for them."""
    entries = (tmp_path / "cgroup.procs", tmp_path / "tasks")
    for entry in entries:
        entry.write_text("")
    message = with_cgroup(NO_FENCE, tuple(str(e) for e in entries))
    code, _out, err, _pid = run_gate(tmp_path, message)
    assert code == 0, err
    assert [e.read_text() for e in entries] == ["0", "0"]


def test_a_cgroup_it_cannot_enter_runs_nothing(tmp_path: Path) -> None:
    message = with_cgroup(NO_FENCE, (str(tmp_path / "gone" / "cgroup.procs"),))
    code, out, err, _pid = run_gate(tmp_path, message)
    assert (code, out) == (126, "")
    assert "mcphost: cannot enter the agent's cgroup" in err


@pytest.mark.skipif(not ROOT, reason="switching to another uid needs root")
def test_the_user_is_switched_before_the_program_runs(tmp_path: Path) -> None:
    uid = 0x7000_1234  # an own uid of the default range: no user of the machine
    message = with_switch(NO_FENCE, Switch(uid, uid, (uid,)))
    code, out, err, _pid = run_gate(tmp_path, message, argv=["sh", "-c", "id -u; id -g; id -G"])
    assert code == 0, err
    assert out.split() == [str(uid)] * 3


@pytest.mark.skipif(ROOT, reason="root may switch")
def test_a_switch_it_may_not_make_runs_nothing(tmp_path: Path) -> None:
    message = with_switch(NO_FENCE, Switch(0x7000_1234, 0x7000_1234, ()))
    code, out, err, _pid = run_gate(tmp_path, message)
    assert (code, out) == (126, "")
    assert "mcphost: cannot switch to the agent's uid" in err


def test_a_runner_that_gave_up_ends_the_gate_with_1(tmp_path: Path) -> None:
    code, out, _err, _pid = run_gate(tmp_path, None)
    assert (code, out) == (1, "")


def test_a_program_that_is_not_there_is_127(tmp_path: Path) -> None:
    code, out, err, _pid = run_gate(tmp_path, NO_FENCE, argv=["/nonexistent/agent"])
    assert (code, out) == (127, "")
    assert "mcphost: cannot run /nonexistent/agent" in err


def test_without_a_fifo_and_a_command_it_says_how_to_run_it() -> None:
    done = subprocess.run([sys.executable, "-I", "-S", GATE, "fifo"], capture_output=True)
    assert done.returncode == 2
    assert done.stderr.decode() == gate.GATE_USAGE + "\n"


def test_the_message_fields_are_added_only_when_there_is_something_to_add() -> None:
    assert with_cgroup(NO_FENCE, ()) == NO_FENCE
    assert with_switch(NO_FENCE, None) == NO_FENCE
    fenced = fenced_message(["bwrap", "--", "agent"], 6, True)
    assert fenced.endswith(b"\n") and fenced.count(b"\n") == 1  # one line: the gate reads to it
    both = with_switch(with_cgroup(fenced, ("/g/cgroup.procs",)), Switch(5, 6, (7, 8)))
    assert json.loads(both) == {
        "argv": ["bwrap", "--", "agent"],
        "abi": 6,
        "forward": True,
        "cgroup": ["/g/cgroup.procs"],
        "switch": [5, 6, [7, 8]],
    }
