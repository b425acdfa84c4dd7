"""Spawn and watch: the one way mcphost starts a child process whose exit it must see.

Owns: `spawn` -- `subprocess.Popen` of an argv (no shell; the cwd, environment and stdin,
stdout, stderr given; `close_fds`; optionally a session of its own and a pre-exec step), then,
with no `await` in between, the child's exit as a future of its raw wait status: from the
`watch` given (the supervisor passes its `Reaper.watch`, supervisor/confine/kernel.py) or, without one,
from a pidfd and `waitpid` of that one pid (`own_exit`). The `Popen` object is kept for its
pipes; its `returncode` is set from that status once it comes, so `Popen` itself never waits
or polls (not even from `__del__`). Also the pidfd primitives (`open_pidfd`, `wait_pidfd`) with
which anything waits for a process that is not its child, and `spawn_failure_reason`, how a
spawn that failed is named. And `raise_nofile`: this process's soft `RLIMIT_NOFILE` up to its
hard one, while every child `spawn` starts gets the soft limit back that this process was given
(systemd's 1024: an agent's tree is bounded as the operator's limits say, never by the headroom
the supervisor takes for itself).

Why one home: in the supervisor the Reaper reaps every child with `waitpid(-1)`, and keeps no
status for a pid nobody watches; its SIGCHLD handler runs as an event-loop callback, so nothing
is reaped between `Popen` returning and the watch as long as nothing awaits in between.
`spawn` is synchronous, so that holds by construction for every caller:
- an agent's process (supervisor/agents/runner.py) and `ctl exec`'s command (supervisor/agents/execs.py):
  a session of their own, `kernel.pdeathsig_preexec` (user switch, fence, parent-death signal)
  as the pre-exec step, the Reaper's watch; the caller registers the identity root before its
  own first `await`;
- the tmux CLI (relay/tmux.py): a short-lived client in the caller's session, no pre-exec step,
  the Reaper's watch under the supervisor and `own_exit` in a standalone relay. relay/ may not
  import supervisor/ (import-linter), so the rule stands here, below both.
A tmux pane (supervisor/agents/tmux.py) is not our child (tmux forks it): it is watched through
a pidfd and the status tmux recorded, never spawned here.

Must never: import anything of mcphost (it stands below the relay and the supervisor), yield
between `Popen` returning and the watch, wait for a child through `Popen.wait`/`Popen.poll` or
asyncio's child watchers, or `waitpid` any pid but the one it spawned without a watch.
"""

from __future__ import annotations

import asyncio
import errno
import os
import resource
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

Watch = Callable[[int], "asyncio.Future[int]"]
"""pid -> the future of its raw wait status (as `Reaper.watch`); called right after `Popen`."""

Stdio = int | IO[Any] | None  # a descriptor, subprocess.PIPE / DEVNULL / STDOUT, or inherited


# The soft RLIMIT_NOFILE every child gets back (`raise_nofile`); None: what this process has.
_child_nofile: int | None = None


def raise_nofile() -> tuple[int, int, int]:
    """Raise this process's soft `RLIMIT_NOFILE` to its hard limit (a process may), keeping the
    soft limit it had for the children `spawn` starts. (soft now, hard, soft before)."""
    global _child_nofile
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = soft
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError):
            pass  # an infinite hard limit the kernel's nr_open refuses: keep what we have
    if soft != before and _child_nofile is None:
        _child_nofile = before
    return soft, hard, before


def _with_limits(preexec: Callable[[], None] | None) -> Callable[[], None] | None:
    """`preexec` behind the child's soft `RLIMIT_NOFILE` set back (`raise_nofile`), first,
    before any user switch or fence."""
    limit = _child_nofile
    if limit is None:
        return preexec
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]

    def child() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
        if preexec is not None:
            preexec()

    return child


@dataclass(frozen=True, slots=True)
class Child:
    """A spawned child: its `Popen` (for the pipes only) and its exit (raw wait status)."""

    proc: subprocess.Popen[bytes]
    exit: asyncio.Future[int]

    @property
    def pid(self) -> int:
        return self.proc.pid


def spawn(
    argv: Sequence[str],
    *,
    cwd: str | None,
    env: Mapping[str, str],
    stdin: Stdio,
    stdout: Stdio,
    stderr: Stdio,
    new_session: bool = False,
    preexec: Callable[[], None] | None = None,
    watch: Watch | None = None,
) -> Child:
    """Start `argv` and watch its exit before returning (see the module doc). Raises what
    `Popen` raises (`OSError`; `SubprocessError` when `preexec` failed in the child)."""
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=new_session,
        preexec_fn=_with_limits(preexec),
        close_fds=True,
    )
    # No await since Popen: the reaper must see the pid watched before it can reap it.
    exit_status = watch(proc.pid) if watch is not None else own_exit(proc.pid)

    def exited(future: asyncio.Future[int]) -> None:
        if not future.cancelled():
            proc.returncode = os.waitstatus_to_exitcode(future.result())

    exit_status.add_done_callback(exited)
    return Child(proc, exit_status)


def own_exit(pid: int) -> asyncio.Future[int]:
    """The raw wait status of our child `pid`, reaped by `waitpid(pid)` once its pidfd fires."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    fd = os.pidfd_open(pid)

    def exited() -> None:
        loop.remove_reader(fd)
        os.close(fd)
        try:
            _, status = os.waitpid(pid, 0)  # it exited: this does not block
        except ChildProcessError:
            status = 255 << 8
        if not future.done():
            future.set_result(status)

    loop.add_reader(fd, exited)
    return future


def spawn_failure_reason(program: str, exc: BaseException) -> str:
    """`cannot run <program>: <strerror> [ENOENT]` (naming the path when it is another one)."""
    if isinstance(exc, OSError) and exc.errno is not None:
        name = errno.errorcode.get(exc.errno, str(exc.errno))
        text = f"cannot run {program}: {exc.strerror or os.strerror(exc.errno)} [{name}]"
        if exc.filename is not None and os.fsdecode(exc.filename) != program:
            text += f" ({os.fsdecode(exc.filename)})"
        return text
    return f"cannot run {program}: {exc}"


def open_pidfd(pid: int) -> int | None:
    """A pidfd for `pid` (the caller closes it); None when the process is gone already."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


async def wait_pidfd(fd: int, timeout: float | None) -> bool:
    """Wait until `fd` is readable (a pidfd: the process exited); False after `timeout` s."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await asyncio.wait_for(ready, timeout)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
