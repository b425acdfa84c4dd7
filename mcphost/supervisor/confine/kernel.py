"""Kernel primitives of the supervisor: prctl wrappers, the child's pre-exec step, and the reaper.

Owns: `prctl` through `ctypes.CDLL(None).prctl` (child subreaper, non-dumpable, parent-death
signal); the function run in an agent's child between fork and exec (enter its cgroup, switch
user, then fence: mcphost/gate.py's steps, the same the tmux pane's gate takes, around
fence.py's command line; then set the parent-death signal, then check the parent is still
alive); and the `Reaper`, the only caller of
`waitpid` in the supervisor: a SIGCHLD handler on the event loop that reaps every child (agents
and the orphans reparented to us as a child subreaper) and resolves the future of a watched pid
with its raw wait status.

The watch race, as chosen: the reaper keeps no status for a pid nobody watches (it logs an
orphan and forgets it, so a reused pid can never inherit an old status). Instead the caller
spawns and calls `watch(pid)` with no `await` in between (`procs.spawn`, mcphost/procs.py, does
both for every child the supervisor starts): the SIGCHLD handler runs as a loop
callback (`loop.add_signal_handler`), so it cannot run before the caller yields, and a child
that already exited is still a zombie when `watch` runs. `watch` checks that with
`waitid(WNOWAIT)` and raises `ChildProcessError` for a pid that is not an unreaped child,
instead of returning a future that would never resolve.

Leftovers of a crash: the parent-death signal reaches only the direct child, and an agent may
ignore SIGTERM; a supervisor killed with SIGKILL cannot end anything. So the supervisor records
every process it starts or adopts (state.py) and, when it starts again, `end_leftovers` ends
every recorded process that is still the same process (same /proc start time), and every member
of a recorded session that provably is still that session, SIGTERM then SIGKILL after the
grace, before anything is spawned (/proc is read through mcphost/procfs.py: the stat parse and
the scan are there, as is `own_children`, through which the supervisor sees escapees reparented
to it and records them too).

For an unfenced agent the parent-death signal stays SIGTERM, not SIGKILL, by choice: it reaches
only the agent's leader, never its descendants (pumps, tools, escapees), so SIGKILL would not
end the tree either; it would only take from a well-behaved agent its chance to end its own
children and save its state, leaving them orphaned. What ignores the SIGTERM (and every
descendant) is ended by the next supervisor's start-up sweep, after the agent's `stop_grace`,
with SIGKILL. A fenced agent's leader is bubblewrap, which ignores SIGTERM (so a stop reaches the
agent, and bubblewrap reports the agent's own exit): its parent-death signal is SIGKILL, and
bubblewrap's init, and with it every process of the agent's PID namespace, escapees included,
ends with it (`--die-with-parent`): nothing of a fenced agent outlives the supervisor.

Must never: let anything else in the supervisor call `waitpid`/`Popen.wait`/`Popen.poll` or use
asyncio's child watchers (`asyncio.create_subprocess_*`): they would race with `waitpid(-1)`.
Must never run Python that imports or allocates much in the child: everything the pre-exec step
needs is resolved in the parent first.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import pwd
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from mcphost.events import emit
from mcphost.gate import LIBC, Switch, checked, enter_cgroup, own_keyring, switch_to
from mcphost.procfs import children_of, read_stat, scan
from mcphost.procs import open_pidfd, wait_pidfd
from mcphost.supervisor.confine.fence import Fence

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36

_prctl_fn = LIBC.prctl  # gate.py's binding: the one libc handle of the child's steps
_prctl_fn.restype = ctypes.c_int


class KernelError(Exception):
    """A kernel facility the supervisor needs is refused, or a plan asks for what it cannot do."""


def _prctl(option: int, arg2: int = 0) -> int:
    args = (ctypes.c_ulong(arg2), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    return checked(int(_prctl_fn(ctypes.c_int(option), *args)), f"prctl({option})")


def set_child_subreaper(on: bool = True) -> None:
    """Adopt orphaned descendants (they are reparented here, not to PID 1)."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0)


def set_non_dumpable() -> None:
    """Same-user processes can no longer read our /proc environ/mem or ptrace us (root can)."""
    _prctl(PR_SET_DUMPABLE, 0)


@dataclass(frozen=True, slots=True)
class Credentials:
    """Whom to run an agent as: resolved in the parent at plan time, applied in the child.
    `user`: the user database's name; None for an agent's own uid (uids.py), which no entry
    names."""

    user: str | None
    uid: int
    gid: int
    groups: tuple[int, ...]


def resolve_user(name: str | None, own_uid: int | None = None) -> Credentials | None:
    """Resolve a plan's `user` (or its own uid, `plan.uid`: then uid and gid are that uid, in
    no other group); None when no switch is needed (neither, or already that uid).

    Raises KernelError when the user does not exist, or when a switch is needed and this process
    is not root (it could not setuid in the child: refuse before spawning, not after).
    """
    if own_uid is not None:
        if os.geteuid() != 0:
            raise KernelError(f"an agent's own uid ({own_uid}) needs the supervisor to run as root")
        return Credentials(user=None, uid=own_uid, gid=own_uid, groups=())
    if name is None:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise KernelError(f"user = {name!r}: no such user on this system") from None
    if entry.pw_uid == os.geteuid() and entry.pw_gid == os.getegid():
        return None
    if os.geteuid() != 0:
        raise KernelError(
            f"user = {name!r} needs the supervisor to run as root to switch to uid "
            f"{entry.pw_uid} (it runs as uid {os.geteuid()}); remove `user` or run it as root"
        )
    groups = tuple(sorted(set(os.getgrouplist(name, entry.pw_gid))))
    return Credentials(user=name, uid=entry.pw_uid, gid=entry.pw_gid, groups=groups)


class ParentGone(Exception):
    """Raised in the child when its parent died before the parent-death signal was armed."""


def pdeathsig_preexec(
    sig: int,
    *,
    parent: int | None = None,
    creds: Credentials | None = None,
    fence: Callable[[], None] | None = None,
    cgroup: tuple[str, ...] = (),
) -> Callable[[], None]:
    """A `preexec_fn`: enter the agent's cgroup (write "0", this process, to each of the
    `cgroup` entry files: cgroups.py, the forked child being single-threaded; first, while still
    the supervisor's user), switch user (if `creds`), enter the fence (if `fence`: gate.py's
    `enter`, as that user; without one, `own_keyring`), arm `sig` on parent death, check the
    parent.

    Order matters: the kernel clears the parent-death signal on a change of uid/gid, so the
    switch (setgroups, setgid, setuid: groups and gid first, while still root) comes before the
    prctl. If the parent (default: the process calling this factory) died before the prctl,
    no signal will ever come: the child raises, so it exits 255 without exec'ing (Popen in a
    live parent raises SubprocessError). The parent-death signal fires when the *thread* that
    forked exits: spawn from the event loop's thread, which lives as long as the supervisor.
    """
    expected = os.getpid() if parent is None else parent
    switch = switch_of(creds)
    # Built here so the child only calls: prctl(int option, unsigned long...).
    args = (
        ctypes.c_int(PR_SET_PDEATHSIG),
        ctypes.c_ulong(int(sig)),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
    )

    def preexec() -> None:
        enter_cgroup(cgroup)
        if switch is not None:
            switch_to(switch)
        # the keyring and Landlock change credentials: before the prctl
        if fence is not None:
            fence()
        else:
            own_keyring()
        if int(_prctl_fn(*args)) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
        if os.getppid() != expected:
            raise ParentGone()

    return preexec


@dataclass(frozen=True, slots=True)
class ChildSetup:
    """How to start one agent's (or `ctl exec`'s) child: argv, working directory, and the
    pre-exec step. Built by `child_setup`."""

    argv: list[str]
    cwd: str
    preexec: Callable[[], None]


def child_setup(
    argv: list[str],
    *,
    cwd: str,
    env: dict[str, str],
    creds: Credentials | None,
    fence: Fence | None,
    cgroup: tuple[str, ...] = (),
) -> ChildSetup:
    """Unfenced: `argv` in `cwd`, switched to `creds` before exec. Fenced: bubblewrap's command
    line around `argv` (fence.py), started in `/` (the working directory is set inside, never
    inherited: `cwd` may lead below a cover), the user switched before bubblewrap where the
    fence says so (`Fence.switch_outside`), else inside by its `setpriv` (a root-run
    bubblewrap needs no user namespace). `cgroup`: the agent's group's entry files
    (`cgroups.entry_file`), entered first. OSError when the fence refuses
    (a bound symlink, a program the agent would not find)."""
    if fence is None:
        preexec = pdeathsig_preexec(signal.SIGTERM, creds=creds, cgroup=cgroup)
        return ChildSetup(list(argv), cwd, preexec)
    switched = creds if fence.switch_outside else None
    # bubblewrap ignores SIGTERM (gate.FORWARDED): its parent-death signal is SIGKILL, and its
    # init, with everything in the agent's namespace, ends with it (--die-with-parent)
    return ChildSetup(
        fence.wrap(list(argv), env, held=cwd),
        "/",
        pdeathsig_preexec(signal.SIGKILL, creds=switched, fence=fence, cgroup=cgroup),
    )


def switch_of(creds: Credentials | None) -> Switch | None:
    """The fence's in-sandbox user switch for `creds` (None: the agent runs as we do)."""
    return None if creds is None else Switch(creds.uid, creds.gid, creds.groups)


def proc_starttime(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks since boot); None when the pid is gone."""
    stat = read_stat(pid)
    return None if stat is None else stat.starttime


class Recorded(Protocol):
    """What `end_leftovers` reads of a recorded process (state.ProcessRecord)."""

    @property
    def pid(self) -> int: ...
    @property
    def starttime(self) -> int: ...
    @property
    def pgid(self) -> int: ...
    @property
    def sid(self) -> int: ...


def still_running(record: Recorded) -> bool:
    """Is the recorded process, or anything in its process group, still there?"""
    stat = read_stat(record.pid)
    if stat is not None and stat.starttime == record.starttime:
        return True
    return group_alive(record.pgid)


def leftovers(records: Iterable[Recorded]) -> dict[int, int]:
    """pid -> start time of every live process that `records` still name: a recorded process
    with the same start time; every member of its session while it lives (the session is then
    provably the same one); and, for a recorded session leader that is gone, every member of its
    session that started after it did (a session id is not reused while the session has a
    member). Never this process, its session, or pid 1."""
    records = list(records)
    if not records:
        return {}
    live = scan()
    own_session = os.getsid(0)
    found: dict[int, int] = {}
    whole: set[int] = set()  # sessions all of whose members count
    after: dict[int, int] = {}  # session -> members started at or after this count
    for record in records:
        current = live.get(record.pid)
        if current is not None and current.starttime == record.starttime:
            found[record.pid] = record.starttime
            if current.session == record.sid:
                whole.add(record.sid)
        elif record.pid == record.sid and current is None:
            after[record.sid] = min(after.get(record.sid, record.starttime), record.starttime)
    for stat in live.values():
        if stat.session in whole or (
            stat.session in after and stat.starttime >= after[stat.session]
        ):
            found[stat.pid] = stat.starttime
    for pid, stat in live.items():
        if pid in found and (pid <= 1 or pid == os.getpid() or stat.session == own_session):
            del found[pid]
    return found


async def end_leftovers(records: Iterable[Recorded], grace: float) -> list[int]:
    """End what `leftovers` finds: SIGTERM, then after `grace` s SIGKILL to whatever is left
    (found again: a member may have forked meanwhile), and wait (30 s at most) until they are
    gone. Signals go through a pidfd opened and checked against the start time, so a reused pid
    is never signalled. Returns the pids it signalled."""
    records = list(records)
    loop = asyncio.get_running_loop()
    signalled: list[int] = []
    fds: dict[int, int] = {}
    try:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 30.0)):
            for pid, starttime in leftovers(records).items():
                if pid not in fds:
                    fd = open_pidfd(pid)
                    if fd is None:
                        continue
                    stat = read_stat(pid)
                    if stat is None or stat.starttime != starttime:  # reused meanwhile
                        os.close(fd)
                        continue
                    fds[pid] = fd
                try:
                    signal.pidfd_send_signal(fds[pid], sig)
                except OSError:
                    continue
                if pid not in signalled:
                    signalled.append(pid)
            if not fds:
                break
            deadline = loop.time() + wait
            pending = list(fds.values())
            if pending:
                await asyncio.gather(
                    *(wait_pidfd(fd, max(0.0, deadline - loop.time())) for fd in pending)
                )
    finally:
        for fd in fds.values():
            os.close(fd)
    return signalled


def killpg_quietly(pgid: int, sig: int) -> None:
    """Signal a process group; a group that is already gone is not an error."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def group_alive(pgid: int) -> bool:
    """Any process (zombies included) still in the group?"""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def group_gone(pgid: int, leader: asyncio.Future[int], deadline: float) -> bool:
    """Wait until the leader is reaped and the group is empty; False at `deadline` (loop time)."""
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(asyncio.shield(leader), max(0.0, deadline - loop.time()))
    except TimeoutError:
        return False
    while group_alive(pgid):  # members left behind: no event tells us, so poll briefly
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def end_group(pgid: int, leader: asyncio.Future[int], grace: float) -> bool:
    """SIGTERM the group; if the leader or a member is still there after `grace` seconds,
    SIGKILL it. Returns once the leader is reaped and the group is empty (or 30 s after the
    SIGKILL); True when it had to kill."""
    loop = asyncio.get_running_loop()
    killpg_quietly(pgid, signal.SIGTERM)
    if await group_gone(pgid, leader, loop.time() + grace):
        return False
    killpg_quietly(pgid, signal.SIGKILL)
    await group_gone(pgid, leader, loop.time() + 30.0)
    return True


def describe_status(status: int) -> str:
    """A raw wait status as `ctl status` shows it: "exit 1" or "signal 9"."""
    code = os.waitstatus_to_exitcode(status)
    return f"exit {code}" if code >= 0 else f"signal {-code}"


class Reaper:
    """Reap every child of this process on SIGCHLD; hand statuses to whoever watches a pid.

    See the module docstring for the watch race. One Reaper per process and loop.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watched: dict[int, asyncio.Future[int]] = {}
        self.orphans_reaped = 0
        # run after a reap that collected a child (records.py looks for orphans it left us)
        self.on_reap: Callable[[], None] | None = None

    def install(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._loop.add_signal_handler(signal.SIGCHLD, self.reap)
        self.reap()  # children that exited before the handler existed

    def uninstall(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_signal_handler(signal.SIGCHLD)
        self._loop = None

    def watch(self, pid: int) -> asyncio.Future[int]:
        """The future of `pid`'s raw wait status. Call it with no `await` since the spawn."""
        existing = self._watched.get(pid)
        if existing is not None:
            return existing
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            raise ChildProcessError(
                errno.ECHILD, f"pid {pid} is not an unreaped child of this process"
            ) from None
        loop = self._loop or asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self._watched[pid] = future
        return future

    def watching(self, pid: int) -> bool:
        """Whether `pid` is watched (a child we spawned or adopted, not reaped yet)."""
        return pid in self._watched

    def reap(self) -> None:
        """Collect every exited child (loops: SIGCHLDs coalesce); then `on_reap`, if any was."""
        reaped = False
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            if pid == 0:
                break
            reaped = True
            future = self._watched.pop(pid, None)
            if future is not None:
                if not future.done():
                    future.set_result(status)
            else:
                self.orphans_reaped += 1
                emit("supervisor.orphan_reaped", pid=pid, exit=describe_status(status))
        if reaped and self.on_reap is not None:
            self.on_reap()

    async def kill_strays(self, grace: float, *, rounds: int = 8) -> list[int]:
        """End every remaining child: SIGTERM, up to `grace` s, then SIGKILL; return their pids.

        Repeats (up to `rounds`) because a killed stray's own children are reparented to us.
        A stray that is a process-group leader (it escaped with setsid) gets the signal on its
        group, unless that group is ours.
        """
        ended: list[int] = []
        me = os.getpid()
        own_group = os.getpgrp()
        for _ in range(rounds):
            pids = children_of(me)
            if not pids:
                break
            waits: dict[int, asyncio.Future[int]] = {}
            for pid in pids:
                try:
                    waits[pid] = self.watch(pid)
                except ChildProcessError:
                    continue
            self.reap()  # a zombie among them: its status is ours now
            live = [pid for pid, fut in waits.items() if not fut.done()]
            for pid in live:
                _signal_stray(pid, signal.SIGTERM, own_group)
            pending = [waits[pid] for pid in live]
            if pending:
                await asyncio.wait([asyncio.shield(f) for f in pending], timeout=grace)
            for pid in live:
                if not waits[pid].done():
                    _signal_stray(pid, signal.SIGKILL, own_group)
            leftover = [asyncio.shield(f) for f in waits.values() if not f.done()]
            if leftover:
                await asyncio.wait(leftover, timeout=max(grace, 5.0))
            ended.extend(waits)
            if live:
                emit("supervisor.strays_killed", pids=live)
        return ended


def _signal_stray(pid: int, sig: int, own_group: int) -> None:
    stat = read_stat(pid)
    try:
        if stat is not None and stat.pgrp == pid and pid != own_group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass
