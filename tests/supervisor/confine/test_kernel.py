"""Kernel primitives, with real processes and signals.

Whatever changes process-wide state (child subreaper, dumpability, a SIGCHLD handler that reaps
*every* child, `kill_strays` that ends every child) runs in a fresh interpreter started with
multiprocessing's `spawn` (`isolated()`), never in pytest's own process: a pytest worker may
hold children of session fixtures, which a `waitpid(-1)` or `kill_strays` would take.
Waits are on conditions (a zombie appeared, a future resolved), never on sleeps.
"""

from __future__ import annotations

import asyncio
import ctypes
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from mcphost import procfs
from mcphost.supervisor.confine import kernel
from tests.waiting import until

ROOT = os.geteuid() == 0


# -- running a scenario in a fresh process -------------------------------------------------


def _child(conn: Any, fn: Callable[..., Coroutine[Any, Any, Any]], args: tuple[Any, ...]) -> None:
    try:
        conn.send(("ok", asyncio.run(fn(*args))))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


def isolated(
    fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any, timeout: float = 120.0
) -> Any:
    """Run `asyncio.run(fn(*args))` in a new interpreter; return its result or fail with its
    traceback."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn, args))
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout):
            proc.kill()
            raise AssertionError(f"isolated scenario {fn.__name__} did not finish")
        kind, value = parent.recv()
    finally:
        proc.join(30)
    if kind != "ok":
        raise AssertionError(f"isolated scenario {fn.__name__} failed:\n{value}")
    return value


async def until_async(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """`until()` for a scenario on the loop: the loop keeps running (and reaping) meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout:.0f}s")
        await asyncio.sleep(0.01)


def state_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2]


def gone_or_zombie(pid: int) -> bool:
    return state_of(pid) in (None, "Z", "X")


def ppid_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return int(text[text.rindex(")") + 2 :].split()[1])


# A process that forks a grandchild, prints the grandchild's pid and exits: the grandchild is
# orphaned. The grandchild optionally leaves the session (setsid) and ignores SIGTERM, then
# lives until its stdin reaches EOF.
ORPHANER = textwrap.dedent(
    """
    import os, signal, sys
    setsid, ignore_term = sys.argv[1] == "1", sys.argv[2] == "1"
    pid = os.fork()
    if pid == 0:
        if setsid:
            os.setsid()
        if ignore_term:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.write(1, b"%d\\n" % os.getpid())
        os.read(0, 1)
        os._exit(0)
    os._exit(0)
    """
)


def orphaner(setsid: bool, ignore_term: bool) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", ORPHANER, str(int(setsid)), str(int(ignore_term))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    return proc, grandchild


# -- prctl ---------------------------------------------------------------------------------

PR_GET_DUMPABLE, PR_SET_DUMPABLE, PR_GET_CHILD_SUBREAPER = 3, 4, 37  # linux/prctl.h


def _prctl(option: int, arg2: int = 0) -> int:
    """The test's own reading of the flags the supervisor sets (kernel.py only sets them)."""
    result = int(ctypes.CDLL(None, use_errno=True).prctl(option, ctypes.c_ulong(arg2), 0, 0, 0))
    assert result >= 0, os.strerror(ctypes.get_errno())
    return result


def _is_child_subreaper() -> bool:
    value = ctypes.c_int(0)
    _prctl(PR_GET_CHILD_SUBREAPER, ctypes.addressof(value))
    return value.value != 0


def _is_dumpable() -> bool:
    return _prctl(PR_GET_DUMPABLE) == 1


async def _prctl_flags() -> dict[str, bool]:
    before = (_is_child_subreaper(), _is_dumpable())
    kernel.set_child_subreaper()
    kernel.set_non_dumpable()
    return {
        "subreaper_before": before[0],
        "dumpable_before": before[1],
        "subreaper": _is_child_subreaper(),
        "dumpable": _is_dumpable(),
    }


def test_subreaper_and_non_dumpable_flags_are_set() -> None:
    flags = isolated(_prctl_flags)
    assert flags == {
        "subreaper_before": False,
        "dumpable_before": True,
        "subreaper": True,
        "dumpable": False,
    }


async def _environ_readable_by_same_user() -> tuple[bool, bool]:
    if os.geteuid() == 0:  # be an ordinary user, so root's override does not hide the effect
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
        _prctl(PR_SET_DUMPABLE, 1)  # the kernel clears it on a uid change; start from a normal one

    def reads() -> bool:
        # /proc/<pid>/environ shows the environment the process started with; what matters is
        # whether a same-user process may open it at all.
        done = subprocess.run(
            ["/bin/cat", f"/proc/{os.getpid()}/environ"], capture_output=True, timeout=30
        )
        return done.returncode == 0

    before = reads()
    kernel.set_non_dumpable()
    return before, reads()


def test_non_dumpable_keeps_same_user_processes_out_of_our_proc_files() -> None:
    before, after = isolated(_environ_readable_by_same_user)
    assert before is True
    assert after is False


# -- the pre-exec step -----------------------------------------------------------------------

PRINT_PDEATHSIG = (
    "import ctypes, os; v = ctypes.c_int(0); "
    "ctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0); "
    "print(v.value, os.getuid(), os.getgid(), sorted(os.getgroups()))"
)


def test_preexec_arms_the_parent_death_signal() -> None:
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", PRINT_PDEATHSIG],
        preexec_fn=kernel.pdeathsig_preexec(signal.SIGTERM),
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == str(int(signal.SIGTERM)).encode()


def test_preexec_refuses_when_the_parent_is_not_the_expected_one() -> None:
    """The parent died before the prctl (here: simulated by expecting another parent): the child
    must not exec, or it would outlive the supervisor with no signal ever coming."""
    with pytest.raises(subprocess.SubprocessError):
        subprocess.run(
            [sys.executable, "-c", "print('ran')"],
            preexec_fn=kernel.pdeathsig_preexec(signal.SIGTERM, parent=1),
            capture_output=True,
            timeout=60,
        )


# Spawns `sleep` with the pre-exec step (as `sys.argv[1]` when given), prints its pid, waits for
# a line on stdin, then dies without waiting for it.
PDEATH_PARENT = textwrap.dedent(
    """
    import os, signal, subprocess, sys
    from mcphost.supervisor.confine import kernel
    creds = kernel.resolve_user(sys.argv[1]) if len(sys.argv) > 1 else None
    child = subprocess.Popen(["/usr/bin/sleep", "1000"], cwd="/",
                             preexec_fn=kernel.pdeathsig_preexec(signal.SIGTERM, creds=creds))
    print(child.pid, flush=True)
    sys.stdin.readline()
    os._exit(0)
    """
)


def ids_of(pid: int) -> dict[str, list[int]]:
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {key: [int(v) for v in fields[key].split()] for key in ("Uid", "Gid", "Groups")}


def spawn_and_orphan(*user: str) -> tuple[int, dict[str, list[int]]]:
    parent = subprocess.Popen(
        [sys.executable, "-c", PDEATH_PARENT, *user],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=os.getcwd(),
    )
    assert parent.stdin is not None and parent.stdout is not None
    child = int(parent.stdout.readline())
    until(
        lambda: state_of(child) is not None and os.readlink(f"/proc/{child}/exe").endswith("sleep"),
        what="the child exec'd",
    )
    ids = ids_of(child)
    parent.stdin.close()
    parent.wait(60)
    return child, ids


def test_the_child_dies_when_its_parent_dies() -> None:
    child, _ = spawn_and_orphan()
    until(lambda: gone_or_zombie(child), what="the orphaned child got its SIGTERM")


@pytest.mark.skipif(not ROOT, reason="switching user needs root")
def test_the_user_switch_happens_before_the_signal_is_armed() -> None:
    """The kernel clears the parent-death signal on a uid change: it must survive the switch."""
    creds = kernel.resolve_user("nobody")
    assert creds is not None
    child, ids = spawn_and_orphan("nobody")
    assert ids["Uid"] == [creds.uid] * 4
    assert ids["Gid"] == [creds.gid] * 4
    assert 0 not in ids["Groups"]  # root's supplementary groups were dropped
    until(lambda: gone_or_zombie(child), what="the switched child got its SIGTERM")


def test_resolve_user() -> None:
    assert kernel.resolve_user(None) is None
    me = __import__("pwd").getpwuid(os.geteuid()).pw_name
    assert kernel.resolve_user(me) is None  # already that user: no switch
    with pytest.raises(kernel.KernelError, match="no such user"):
        kernel.resolve_user("no-such-user-mcphost")


async def _resolve_user_as_nobody() -> str:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    try:
        kernel.resolve_user("root")
    except kernel.KernelError as exc:
        return str(exc)
    return "no error"


@pytest.mark.skipif(not ROOT, reason="needs root to become another user first")
def test_resolve_user_refuses_a_switch_without_root() -> None:
    message = isolated(_resolve_user_as_nobody)
    assert "needs the supervisor to run as root" in message
    assert "'root'" in message


# -- the reaper ----------------------------------------------------------------------------


async def _reaper_statuses() -> dict[str, Any]:
    reaper = kernel.Reaper()
    reaper.install()
    out: dict[str, Any] = {}
    quick = subprocess.Popen([sys.executable, "-I", "-S", "-c", "raise SystemExit(3)"])
    future = reaper.watch(quick.pid)  # no await since the spawn
    out["exit"] = kernel.describe_status(await asyncio.wait_for(future, 60))
    quick.returncode = 3

    # Exited before anyone watched it: still a zombie (nothing reaps it before we yield).
    early = subprocess.Popen(["/bin/sh", "-c", "kill -9 $$"])
    until(lambda: state_of(early.pid) == "Z", what="the child became a zombie")
    future = reaper.watch(early.pid)
    out["early"] = kernel.describe_status(await asyncio.wait_for(future, 60))
    early.returncode = -9

    try:
        reaper.watch(early.pid)  # reaped already: refused, not a future that never resolves
        out["rewatch"] = "accepted"
    except ChildProcessError:
        out["rewatch"] = "refused"
    try:
        reaper.watch(1)
        out["stranger"] = "accepted"
    except ChildProcessError:
        out["stranger"] = "refused"
    reaper.uninstall()
    return out


def test_the_reaper_resolves_watched_children_even_if_they_exited_first() -> None:
    assert isolated(_reaper_statuses) == {
        "exit": "exit 3",
        "early": "signal 9",
        "rewatch": "refused",
        "stranger": "refused",
    }


async def _orphan_is_reaped() -> dict[str, Any]:
    kernel.set_child_subreaper()
    reaper = kernel.Reaper()
    reaper.install()
    proc, grandchild = orphaner(setsid=False, ignore_term=False)
    await asyncio.wait_for(reaper.watch(proc.pid), 60)
    proc.returncode = 0
    adopted = ppid_of(grandchild) == os.getpid()
    assert proc.stdin is not None
    proc.stdin.close()  # the grandchild exits; only the reaper can collect it
    await until_async(lambda: reaper.orphans_reaped == 1, "the orphan was reaped")
    reaper.uninstall()
    return {"adopted": adopted, "left": state_of(grandchild)}


def test_an_orphaned_grandchild_is_adopted_and_reaped() -> None:
    assert isolated(_orphan_is_reaped) == {"adopted": True, "left": None}


async def _kill_strays() -> dict[str, Any]:
    kernel.set_child_subreaper()
    reaper = kernel.Reaper()
    reaper.install()
    strays, parents = [], []
    for ignore_term in (False, True):
        proc, grandchild = orphaner(setsid=True, ignore_term=ignore_term)
        await asyncio.wait_for(reaper.watch(proc.pid), 60)
        proc.returncode = 0
        parents.append(proc)  # keeps its stdin pipe open: the stray lives until it is ended
        strays.append(grandchild)
    before = procfs.children_of(os.getpid())
    ended = await reaper.kill_strays(grace=0.2)
    after = procfs.children_of(os.getpid())
    reaper.uninstall()
    return {
        "before": sorted(before) == sorted(strays),
        "ended": sorted(ended) == sorted(strays),
        "after": after,
        "left": [state_of(pid) for pid in strays],
    }


def test_kill_strays_ends_children_that_escaped_with_setsid_even_ignoring_sigterm() -> None:
    assert isolated(_kill_strays) == {
        "before": True,
        "ended": True,
        "after": [],
        "left": [None, None],
    }


# -- what a crashed supervisor left: end_leftovers ---------------------------------------------

# A session leader that ignores SIGTERM and forks a member of its session that ignores it too;
# it prints the member's pid, then both live until killed.
STUBBORN_SESSION = textwrap.dedent(
    """
    import os, signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    member = os.fork()
    if member == 0:
        while True:
            time.sleep(3600)
    os.write(1, b"%d\\n" % member)
    while True:
        time.sleep(3600)
    """
)


def test_end_leftovers_ends_a_recorded_session_and_spares_a_reused_pid() -> None:
    from mcphost.supervisor.state import ProcessRecord

    def start(code: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", code],
            stdout=subprocess.PIPE,
            start_new_session=True,
        )

    leader = start(STUBBORN_SESSION)
    other = start("import time\nwhile True:\n    time.sleep(3600)\n")
    try:
        assert leader.stdout is not None
        member = int(leader.stdout.readline())
        records = []
        for proc, skew in ((leader, 0), (other, 1)):  # `other`: its pid, another start time
            started = kernel.proc_starttime(proc.pid)
            assert started is not None
            records.append(
                ProcessRecord(proc.pid, started + skew, proc.pid, proc.pid, "a", "agent")
            )
        assert sorted(kernel.leftovers(records)) == sorted([leader.pid, member])
        ended = asyncio.run(kernel.end_leftovers(records, grace=0.2))
        assert sorted(ended) == sorted([leader.pid, member])
        assert leader.wait(timeout=30) == -signal.SIGKILL  # it ignored the SIGTERM
        until(lambda: gone_or_zombie(member), 30, "the session's member to die")
        assert other.poll() is None  # a pid whose start time differs is someone else
        assert kernel.still_running(records[1])  # its group (the real `other`) is alive
    finally:
        for proc in (leader, other):
            proc.kill()
            proc.wait(timeout=30)
