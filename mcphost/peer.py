"""Kernel identity of a connecting pump: peer credentials, pidfd, and /proc ancestry.

The supervisor decides which agent a connection belongs to from what the kernel says, never
from anything the peer sends: `SO_PEERCRED` (pid, uid, gid at connect time), `SO_PEERPIDFD`
(a pidfd immune to PID reuse, Linux >= 6.5) and the parent chain in `/proc/<pid>/stat`. A
process cannot choose its parent; it is only reparented when its parent dies, to the nearest
child subreaper (the supervisor, a `stop` pid here) or to PID 1, so an escaped descendant's walk
ends at a stop and fails closed.

What it owns: the pure parse of `/proc/<pid>/stat` (`parse_stat`), the thin reads around it
(`read_stat`, `peer_credentials`), the one ancestry walk (`ancestry`) and its two questions
(`find_root`: which agent's root; `descends_from`: below the supervisor, for its control
socket), and the reuse check (`still_same`). Roots are keyed by `(pid, starttime)`, so a PID reused by another process never
matches an agent; a parent that started after its child is a reused PID too, and ends the walk.

What it must never do: trust the peer's environment, arguments or bytes; guess when a read
fails (every doubt returns None or False: fail closed); close a pidfd it handed out (the caller
of `peer_credentials` owns `PeerCred.pidfd` and closes it with `os.close`).

Use: `cred = peer_credentials(conn)`, `stat = read_stat(cred.pid)`, `find_root(cred.pid, ...)`,
then `still_same(cred, stat)`; close `cred.pidfd`.

Limits: the peer's pid is 0 when it lives in another PID namespace (SO_PEERCRED cannot name
it) or had exited on a kernel that refuses it a pidfd; `find_root` then answers None. The walk
reads each stat at a slightly different moment; `still_same` after the walk covers the peer.
Without a pidfd (kernels before 6.5), a peer that exits and whose PID is reused between the
connect and the first `read_stat` cannot be told apart; with one, that window is closed.
"""

from __future__ import annotations

import errno
import signal
import socket
import struct
from collections.abc import Container, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

# Linux >= 6.5; 77 on x86-64 and arm64 (asm-generic); Python 3.11 has no constant.
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)
MAX_DEPTH = 64
_UCRED = struct.Struct("3i")


@dataclass(frozen=True, slots=True)
class PeerCred:
    pid: int
    uid: int
    gid: int
    pidfd: int | None  # owned by the caller: close it with os.close


@dataclass(frozen=True, slots=True)
class ProcStat:
    pid: int
    ppid: int
    pgrp: int
    session: int
    starttime: int  # clock ticks after boot; (pid, starttime) names one process for all time


def peer_credentials(sock: socket.socket) -> PeerCred:
    """The connected AF_UNIX peer's pid, uid and gid, and a pidfd for it when the kernel has one.

    The pidfd (close-on-exec) belongs to the caller, who must close it. It is None on kernels
    without `SO_PEERPIDFD` (ENOPROTOOPT). A peer that has already exited gets, on recent kernels
    (6.18 here), a pidfd of the exited process, for which `still_same` is False; kernels that
    refuse one (ESRCH, or EINVAL on early 6.x) leave its PID open to reuse, so the pid is then
    reported as 0, which `find_root` never matches. Either way: fail closed.
    """
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    try:
        pidfd: int | None = sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError as exc:
        pidfd = None
        if exc.errno != errno.ENOPROTOOPT:
            pid = 0
    return PeerCred(pid=pid, uid=uid, gid=gid, pidfd=pidfd)


def parse_stat(text: str) -> ProcStat:
    """Parse the text of `/proc/<pid>/stat`. Pure; raises ValueError when it is not one.

    The command name sits in parentheses and may itself hold spaces, parentheses and newlines,
    so the fields are taken after the LAST `)`: state (3), ppid (4), pgrp (5), session (6), ...,
    starttime (22).
    """
    head, closing, tail = text.rpartition(")")
    pid_text, opening, _comm = head.partition(" (")
    if not closing or not opening:
        raise ValueError("not a /proc/<pid>/stat line: no '(comm)'")
    fields = tail.split()
    if len(fields) < 20:
        raise ValueError(f"not a /proc/<pid>/stat line: {len(fields)} fields after comm")
    try:
        return ProcStat(
            pid=int(pid_text),
            ppid=int(fields[1]),
            pgrp=int(fields[2]),
            session=int(fields[3]),
            starttime=int(fields[19]),
        )
    except ValueError:
        raise ValueError("not a /proc/<pid>/stat line: a field is not a number") from None


def read_stat(pid: int) -> ProcStat | None:
    """The stat of a live process, or None when it is gone (or cannot be read or parsed)."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as file:
            raw = file.read()
        return parse_stat(raw.decode("latin-1"))  # comm is bytes; latin-1 never fails
    except (OSError, ValueError):
        return None


class BrokenWalk(Exception):
    """The ancestry walk broke off: a stat vanished mid-walk, a parent started after its child
    (its PID was reused: the real parent is gone), or 64 steps passed."""


def ancestry(pid: int, *, stop: Container[int] = ()) -> Iterator[ProcStat]:
    """The stats of `pid`, its parent, its parent's parent, ...: the one pid -> ppid walk.

    Ends (nothing more) at pid <= 1 or at a pid in `stop`, which is never yielded; raises
    `BrokenWalk` when the walk cannot be trusted (each caller fails closed its own way).
    """
    child_start: int | None = None
    for _ in range(MAX_DEPTH):
        if pid <= 1 or pid in stop:
            return
        stat = read_stat(pid)
        if stat is None or stat.pid != pid:
            raise BrokenWalk(f"process {pid} vanished mid-walk")
        if child_start is not None and stat.starttime > child_start:
            raise BrokenWalk(f"process {pid} started after its child: a reused pid")
        yield stat
        child_start = stat.starttime
        pid = stat.ppid
    raise BrokenWalk(f"more than {MAX_DEPTH} ancestors")


def find_root(pid: int, roots: Mapping[tuple[int, int], T], *, stop: Container[int]) -> T | None:
    """Walk pid -> ppid (`ancestry`) and return `roots[(pid, starttime)]` of the first process
    that is one.

    None (fail closed) at pid <= 1, at a pid in `stop` (the supervisor: orphans reparented to
    it are nobody's), after 64 steps, when a stat vanishes mid-walk, or when a parent started
    after its child (its PID was reused: the real parent is gone).
    """
    try:
        for stat in ancestry(pid, stop=stop):
            hit = roots.get((stat.pid, stat.starttime))
            if hit is not None:
                return hit
    except BrokenWalk:
        pass
    return None


def descends_from(pid: int, ancestor: int) -> bool:
    """Is process `pid` a descendant of `ancestor` (`ancestry`)? A walk that breaks off counts
    as one (the caller refuses descendants: fail closed); pid <= 1 is not one."""
    try:
        return any(stat.ppid == ancestor for stat in ancestry(pid))
    except BrokenWalk:
        return True


def still_same(cred: PeerCred, stat: ProcStat) -> bool:
    """Is the peer still the process `stat` describes? Call it after reading `stat`.

    With a pidfd: the pidfd still reaches a live process (a pidfd never follows a reused PID,
    and while that process lives its PID cannot be reused, so `stat`, read for the same pid,
    was its own). Without one: the starttime read again is unchanged.
    """
    if stat.pid != cred.pid:
        return False
    if cred.pidfd is not None:
        try:
            signal.pidfd_send_signal(cred.pidfd, 0)
        except OSError:
            return False
        return True
    again = read_stat(cred.pid)
    return again is not None and again.starttime == stat.starttime
