"""Lifecycle beyond tests/blackbox/test_process.py: shutdown with calls in flight, and orphans.

test_process.py already proves an idle host exits 0 on EOF, SIGTERM and SIGINT.
Here: the same with a call in flight (EOF delivers the pending answer, signals do not wait for
it), SIGHUP, and a parent killed with SIGKILL — both when the host sees EOF because the parent
held its stdin, and when someone else keeps stdin open so only the parent-death watch can
notice. The proof of "no orphan" is /proc: the host's pid is gone (or a zombie).
Nothing here bounds wall time (a busy machine would fail it): each test waits for its
condition, and `make bench` (bench/lifecycle.py) reports how long each exit takes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from mcphost.testing import DevCenter
from tests.hardening.conftest import INIT_PARAMS, ROOT, RawHost, host_env, pid_alive
from tests.waiting import arrived, count, until

WORK = "/admin/agent-tools/get_my_work"

# deep (make test-slow): signals and parent death with calls in flight.
pytestmark = [pytest.mark.deep, pytest.mark.timeout(120)]


def wait_gone(pid: int, within: float) -> float:
    started = time.monotonic()
    while pid_alive(pid):
        if time.monotonic() - started > within:
            raise AssertionError(f"host {pid} still alive {within}s after its parent died")
        time.sleep(0.02)
    return time.monotonic() - started


def test_eof_with_a_call_in_flight_delivers_the_answer_then_exits_0(center: DevCenter) -> None:
    with center.faults(delay_ms={"get_my_work": 200}):
        host = RawHost(host_env(center.binding_env("unix")))
        host.initialize()
        before = count(center, WORK)
        pending = host.request("tools/call", {"name": "get_my_work", "arguments": {}})
        until(arrived(center, WORK, before), what="the call reaching the center")
        assert host.close(timeout=30) == 0  # EOF while the center still holds the call
        assert "result" in host.wait(pending, timeout=5), "EOF must not drop a pending answer"
        assert not host.bad_lines


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_with_a_call_in_flight_exits_0_promptly(center: DevCenter, sig: int) -> None:
    with center.faults(delay_ms={"get_my_work": 5000}):
        host = RawHost(host_env(center.binding_env("unix")))
        host.initialize()
        before = count(center, WORK)
        pending = host.request("tools/call", {"name": "get_my_work", "arguments": {}})
        until(arrived(center, WORK, before), what="the call reaching the center")
        host.proc.send_signal(sig)  # stdin stays open: only the signal can end it
        assert host.proc.wait(timeout=30) == 0
        # had the host awaited the call (5 s at the center), its answer would be on stdout
        until(lambda: host._out_done, what="the host's stdout closing")
        # the SDK session may close the call with an error; it must not have waited for a result
        answer = host.by_id.get(pending, {})
        assert "result" not in answer, "a signal must not wait for the call in flight"
        assert b"Traceback" not in host.stderr and not host.bad_lines


PARENT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    stdin = int(sys.argv[1]) if len(sys.argv) > 2 else subprocess.PIPE
    host = subprocess.Popen(
        [sys.executable, "-m", "mcphost.cli", "host"],
        stdin=stdin, stderr=subprocess.DEVNULL,  # stdout: the test's pipe, for the reply
        pass_fds=(stdin,) if isinstance(stdin, int) and stdin > 2 else (),
    )
    print(host.pid, flush=True)
    if host.stdin is not None:
        host.stdin.write(sys.argv[-1].encode() + b"\\n")
        host.stdin.flush()
    time.sleep(120)
    """
)
INITIALIZE = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT_PARAMS})


@pytest.mark.parametrize("stdin_holder", ["parent", "someone_else"])
def test_a_parent_killed_with_sigkill_leaves_no_orphaned_host(
    center: DevCenter, stdin_holder: str
) -> None:
    env = host_env(center.binding_env("unix"))
    args = [sys.executable, "-c", PARENT]
    pass_fds: tuple[int, ...] = ()
    read_end = write_end = -1
    if stdin_holder == "someone_else":
        read_end, write_end = os.pipe()  # this test keeps the write end: no EOF for the host
        args.append(str(read_end))
        pass_fds = (read_end,)
    args.append(INITIALIZE)
    parent = subprocess.Popen(
        args, stdout=subprocess.PIPE, env=env, pass_fds=pass_fds, cwd=str(ROOT)
    )
    try:
        assert parent.stdout is not None
        host_pid = int(parent.stdout.readline())
        if read_end >= 0:
            os.close(read_end)
            os.write(write_end, INITIALIZE.encode() + b"\n")
        reply = json.loads(parent.stdout.readline())  # serving: its watch has the parent
        assert reply["id"] == 1 and "result" in reply, reply
        assert pid_alive(host_pid)
        with open(f"/proc/{host_pid}/stat") as stat:
            assert int(stat.read().rsplit(")", 1)[1].split()[1]) == parent.pid
        parent.send_signal(signal.SIGKILL)
        parent.wait(5)
        took = wait_gone(host_pid, within=30)  # the time itself is reported, not bounded
        print(f"\norphan check ({stdin_holder}): host gone {took:.2f}s after parent SIGKILL")
    finally:
        if write_end >= 0:
            os.close(write_end)
        if parent.poll() is None:
            parent.kill()
