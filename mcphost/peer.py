"""Kernel identity of a connecting pump: peer credentials, pidfd, and /proc ancestry.

The supervisor decides which agent a connection belongs to from what the kernel says, never
from anything the peer sends: `SO_PEERCRED` (pid, uid, gid at connect time), `SO_PEERPIDFD`
(a pidfd immune to PID reuse, Linux >= 6.5) and the parent chain in `/proc/<pid>/stat`. A
process cannot choose its parent; it is only reparented when its parent dies, to the nearest
child subreaper (the supervisor, a `stop` pid here) or to PID 1, so an escaped descendant's walk
ends at a stop and fails closed.

What it owns: the read of a peer's credentials (`peer_credentials`), the one ancestry walk
(`ancestry`) and its two questions (`find_root`: which agent's root; `descends_from`: below the
supervisor, for its control socket), and the reuse check (`still_same`), all over procfs.py's
stats (`read_stat`: the one parse of `/proc/<pid>/stat`). Roots are keyed by
`(pid, starttime)`, so a PID reused by another process never matches an agent; a parent that
started after its child is a reused PID too, and ends the walk.

What it must never do: trust the peer's environment, arguments or bytes; guess when a read
fails (every doubt returns None or False: fail closed); close a pidfd it handed out (the caller
of `peer_credentials` owns `PeerCred.pidfd` and closes it with `os.close`).

The owner of a loopback TCP connection (`tcp_owner_uid`): the uid of the process's socket at
the other end, asked of the kernel by the exact address pair with `NETLINK_SOCK_DIAG`
(`inet_diag`: one socket looked up, the cost of one syscall whatever the number of connections),
or, where that is refused, read from `/proc/net/tcp` / `/proc/net/tcp6` (`proc_net_tcp_uid`,
the pure parse). Both see the sockets of the supervisor's network namespace, which fenced agents
share. None when neither finds it (the peer already closed, say): the caller refuses it.

Use: `cred = peer_credentials(conn)`, `stat = procfs.read_stat(cred.pid)`,
`find_root(cred.pid, ...)`, then `still_same(cred, stat)`; close `cred.pidfd`.

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
import sys
from collections.abc import Container, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from mcphost.procfs import ProcStat, read_stat

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


def peer_uid(sock: socket.socket) -> int:
    """The connected AF_UNIX peer's uid (`SO_PEERCRED`, at connect time)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return int(_UCRED.unpack(raw)[1])


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


# NETLINK_SOCK_DIAG (linux/sock_diag.h, linux/inet_diag.h): one exact lookup, no dump.
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
_NLMSG_ERROR = 2
_NLM_F_REQUEST = 1
_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_DIAG_HEAD = struct.Struct("=BBBxI")  # family, protocol, extensions, pad, states
_DIAG_PORTS = struct.Struct("!HH")  # the sock id's ports, network order
_DIAG_TAIL = struct.Struct("=III")  # interface, cookie (INET_DIAG_NOCOOKIE: both words ~0)
_DIAG_UID_AT = 4 + 48 + 12  # inet_diag_msg: family..retrans, the sock id, expires/rqueue/wqueue
Address = tuple[str, int]  # an IP literal and a port, as `getsockname()` gives them


def _packed(family: int, host: str) -> bytes:
    return socket.inet_pton(family, host).ljust(16, b"\0")


def _diag_uid(family: int, own: Address, other: Address) -> int | None:
    """`inet_diag`'s uid of the TCP socket whose own address is `own` and whose peer is
    `other`; None when the kernel has none such. Raises `OSError` when it cannot be asked."""
    request = (
        _DIAG_HEAD.pack(family, socket.IPPROTO_TCP, 0, 0xFFFFFFFF)
        + _DIAG_PORTS.pack(own[1], other[1])
        + _packed(family, own[0])
        + _packed(family, other[0])
        + _DIAG_TAIL.pack(0, 0xFFFFFFFF, 0xFFFFFFFF)
    )
    header = _NLMSGHDR.pack(
        _NLMSGHDR.size + len(request), SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0
    )
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as link:
        link.settimeout(1.0)
        link.sendto(header + request, (0, 0))
        reply = link.recv(4096)
    if len(reply) < _NLMSGHDR.size:
        return None
    _, kind, _, _, _ = _NLMSGHDR.unpack_from(reply)
    if kind == _NLMSG_ERROR:
        (error,) = struct.unpack_from("=i", reply, _NLMSGHDR.size)
        if -error in (errno.EPERM, errno.EACCES, errno.EOPNOTSUPP, errno.EINVAL):
            raise OSError(-error, "sock_diag refused the lookup")
        return None  # ENOENT: no such socket (any more)
    if kind != SOCK_DIAG_BY_FAMILY or len(reply) < _NLMSGHDR.size + _DIAG_UID_AT + 4:
        return None
    (uid,) = struct.unpack_from("=I", reply, _NLMSGHDR.size + _DIAG_UID_AT)
    return int(uid)


def _proc_address(field: str) -> tuple[bytes, int]:
    """`0100007F:1F90` (/proc/net/tcp's, each 32-bit word in host order) -> (address, port)."""
    host, _, port = field.partition(":")
    words = [host[i : i + 8] for i in range(0, len(host), 8)]
    raw = b"".join(int(word, 16).to_bytes(4, sys.byteorder) for word in words)
    return raw, int(port, 16)


def proc_net_tcp_uid(text: str, family: int, own: Address, other: Address) -> int | None:
    """The uid of the row of `/proc/net/tcp` (AF_INET) or `/proc/net/tcp6` (AF_INET6) text whose
    local address is `own` and remote address `other`; None when no row is. Pure; rows that do
    not parse are skipped."""
    want = (
        (socket.inet_pton(family, own[0]), own[1]),
        (socket.inet_pton(family, other[0]), other[1]),
    )
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            if (_proc_address(fields[1]), _proc_address(fields[2])) == want:
                return int(fields[7])
        except ValueError:
            continue
    return None


def tcp_owner_uid(own: Address, other: Address) -> int | None:
    """The uid owning the TCP socket at `own` connected to `other`: for a connection a listener
    accepted, `own` is its `getpeername()` and `other` its `getsockname()`, so the answer is
    the connecting process's uid. `NETLINK_SOCK_DIAG` first, `/proc/net/tcp{,6}` where that is
    refused; None when neither finds the socket (fail closed: the caller refuses)."""
    family = socket.AF_INET6 if ":" in own[0] else socket.AF_INET
    try:
        return _diag_uid(family, own, other)
    except OSError:
        pass
    name = "/proc/net/tcp6" if family == socket.AF_INET6 else "/proc/net/tcp"
    try:
        with open(name, encoding="ascii", errors="replace") as file:
            return proc_net_tcp_uid(file.read(), family, own, other)
    except (OSError, ValueError):
        return None
