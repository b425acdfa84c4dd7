"""Reading /proc: one process's stat, every process's, and a process's children.

Owns: the pure parse of `/proc/<pid>/stat` (`parse_stat` -> `ProcStat`: pid, parent, process
group, session, start time, CPU ticks, resident pages), the read of one (`read_stat`), the one
scan of /proc (`scan`: every live process's stat, by pid), the children of a process
(`children_of`, from a scan; `own_children`, this process's, from
`/proc/self/task/<tid>/children` where the kernel has it), and the small read they use
(`read_text`: `os.open` and one `os.read`, a third of `open()`'s cost, which a scan pays per
process).

Used by: the identity of a connecting pump (peer.py: its ancestry walk and reuse check), the
supervisor's kernel side (supervisor/confine/kernel.py: start times, a crash's leftovers, the
reaper's strays; supervisor/records.py: the escapees it records) and the agents' usage
(supervisor/confine/usage.py: their process trees).

The stat line is `pid (comm) state ppid pgrp session ...`, and the command name is the
process's own to choose (`prctl(PR_SET_NAME)`, or its program's file name): it may hold spaces,
parentheses and newlines, so the fields are taken after the LAST `)`; the bytes are decoded as
latin-1, which never fails.

Must never: import anything of mcphost or outside the standard library (it stands on the ground
floor, below peer.py); raise for a process that vanished or cannot be read (it is None, or
absent from a scan); take anything from the command name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PROC = "/proc"


@dataclass(frozen=True, slots=True)
class ProcStat:
    """What mcphost reads of one `/proc/<pid>/stat` (fields counted from 1, as proc(5) does)."""

    pid: int  # 1
    ppid: int  # 4
    pgrp: int  # 5
    session: int  # 6
    starttime: int  # 22: clock ticks after boot; (pid, starttime) names one process for all time
    cpu_ticks: int  # 14..17: utime + stime + cutime + cstime (its own, and its waited children's)
    rss_pages: int  # 24


def parse_stat(text: str) -> ProcStat:
    """Parse the text of `/proc/<pid>/stat`. Pure; raises ValueError when it is not one.

    The command name sits in parentheses and may itself hold spaces, parentheses and newlines,
    so the fields are taken after the LAST `)`: state (3), ppid (4), pgrp (5), session (6), ...,
    utime..cstime (14..17), starttime (22), rss (24).
    """
    head, closing, tail = text.rpartition(")")
    pid_text, opening, _comm = head.partition(" (")
    if not closing or not opening:
        raise ValueError("not a /proc/<pid>/stat line: no '(comm)'")
    fields = tail.split()
    if len(fields) < 22:
        raise ValueError(f"not a /proc/<pid>/stat line: {len(fields)} fields after comm")
    try:
        return ProcStat(
            pid=int(pid_text),
            ppid=int(fields[1]),
            pgrp=int(fields[2]),
            session=int(fields[3]),
            starttime=int(fields[19]),
            cpu_ticks=sum(int(f) for f in fields[11:15]),
            rss_pages=int(fields[21]),
        )
    except ValueError:
        raise ValueError("not a /proc/<pid>/stat line: a field is not a number") from None


def state_of(text: str) -> str:
    """The state field (3) of a `/proc/<pid>/stat` text: R, S, D, Z (a zombie: exited, not yet
    waited for), T, ...; taken after the LAST `)`, as `parse_stat` takes every field. Pure;
    raises ValueError when it is not one."""
    fields = text.rpartition(")")[2].split()
    if not fields:
        raise ValueError("not a /proc/<pid>/stat line: no state after '(comm)'")
    return fields[0]


def read_text(path: str, size: int = 4096) -> str | None:
    """The first `size` bytes of a small kernel file (a /proc or cgroup file: one read), as
    latin-1; None when it cannot be opened or read (a process gone since)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, size).decode("latin-1")
    except OSError:
        return None
    finally:
        os.close(fd)


def read_stat(pid: int, proc: str = PROC) -> ProcStat | None:
    """The stat of a live process, or None when it is gone (or cannot be read or parsed)."""
    return _stat_at(f"{proc}/{int(pid)}/stat")


def _stat_at(path: str) -> ProcStat | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        return parse_stat(text)
    except ValueError:
        return None


def scan(proc: str = PROC) -> dict[int, ProcStat]:
    """Every process's stat, by pid, from one listing of `proc`: what vanished since the
    listing, or cannot be read, is simply not there."""
    try:
        names = os.listdir(proc)
    except OSError:
        return {}
    found = {}
    for name in names:
        if name.isdigit():
            stat = _stat_at(f"{proc}/{name}/stat")
            if stat is not None:
                found[stat.pid] = stat
    return found


def children_of(parent: int, proc: str = PROC) -> list[int]:
    """Pids whose parent is `parent`, from a scan (zombies included), in order."""
    return sorted(stat.pid for stat in scan(proc).values() if stat.ppid == parent)


def own_children() -> list[int]:
    """This process's children (of every thread), from `/proc/self/task/<tid>/children`; a
    scan of /proc where the kernel has no such file."""
    if not os.path.exists(f"{PROC}/self/task/{os.getpid()}/children"):
        return children_of(os.getpid())
    pids: set[int] = set()
    for tid in os.listdir(f"{PROC}/self/task"):
        try:  # read whole: one child per few bytes, any number of them
            with open(f"{PROC}/self/task/{tid}/children", "rb") as handle:
                pids.update(int(p) for p in handle.read().split())
        except OSError:  # a thread that ended while we read: its children are elsewhere now
            continue
    return sorted(pids)
