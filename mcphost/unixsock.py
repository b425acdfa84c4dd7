"""A private listening Unix socket: the binding rules of the supervisor's and the relay's sockets.

Owns: `listen(path, mode, backlog)` -> `Listening`, and `SocketPathError` (the path and a stable
`reason`); the socket-path rule, `fits` (`SUN_PATH_MAX`) and `address` (a path that does not fit
reached through its directory's fd), which every client and server here uses (the relay tools'
client, the relay's tmux servers, the reference center's harness). Binding, in order:
1. make room at `path`: nothing there is fine; anything but a socket is refused
   (`not_a_socket`), never deleted; a socket is probed with a non-blocking connect: refused (or
   gone) means stale, and it is unlinked; accepted, or a full backlog (`EAGAIN`), means someone
   listens (`in_use`), and it is left alone; any other failure is `unprobeable` (its `errno`);
2. bind, then chmod `mode` *before* `listen()`: until then a connect is refused, so no peer ever
   sees a looser mode, whatever the umask;
3. lstat: the file must still be a socket (`replaced` otherwise); the caller's `check` sees that
   stat here, still before listen (the control socket's owner check);
4. remember the inode (st_dev, st_ino), listen, non-blocking.
`Listening.unlink()` removes the file only while it is still that inode (a socket another
server bound there since is left alone), at most once; `close()` closes the socket, then
unlinks. A path longer than `SUN_PATH_MAX` bytes is bound and probed through
`/proc/self/fd/<dirfd>/<name>` (the directory's fd), as the relay tools' client connects.
`mcphost/attach.py` (the stdlib-only pump) has no copy of the rule: it connects to the path it
is given, which the supervisor keeps short.

Errors: the refusals above are `SocketPathError`; an `OSError` from bind, chmod or listen (a
missing directory, a path too long even so) propagates as it is. Callers translate both into
their own errors and messages (`HubError`, `ControlInUse`, `RelayBindError`) and keep their own
checks (the control socket's lock and owner, the relay directory's privacy).

Must never: delete anything but a socket nothing listens on, let a connect succeed before the
mode is set, or unlink a socket file this `Listening` did not bind. Standard library only:
`mcphost/relay/` imports it, and it imports nothing of mcphost.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from collections.abc import Callable, Iterator

SUN_PATH_MAX = 107  # bytes of `sun_path` (108 on Linux) less its terminating NUL

NOT_A_SOCKET = "not_a_socket"
IN_USE = "in_use"
UNPROBEABLE = "unprobeable"
REPLACED = "replaced"

_SAYS = {
    NOT_A_SOCKET: "exists and is not a socket",
    IN_USE: "is a socket something listens on",
    UNPROBEABLE: "is a socket that cannot be probed",
    REPLACED: "was replaced while it was being bound",
}


class SocketPathError(Exception):
    """`path` cannot be bound: `reason` is one of NOT_A_SOCKET, IN_USE, UNPROBEABLE, REPLACED;
    `errno` is the probe's failure for UNPROBEABLE (else None)."""

    def __init__(self, path: str, reason: str, err: int | None = None) -> None:
        self.path = path
        self.reason = reason
        self.errno = err
        says = _SAYS.get(reason, reason)
        super().__init__(f"{path} {says}" + (f" ({self.errname})" if err is not None else ""))

    @property
    def errname(self) -> str:
        """The probe's errno by name (`EACCES`), or `unknown`."""
        return errno.errorcode.get(self.errno or 0, "unknown")


class Listening:
    """A bound, listening socket at `path` and the inode it bound there."""

    def __init__(self, path: str, sock: socket.socket, inode: tuple[int, int]) -> None:
        self.path = path
        self.sock = sock
        self.inode: tuple[int, int] | None = inode

    def unlink(self) -> None:
        """Remove the socket file if it is still the one bound here (once: then forget it)."""
        inode, self.inode = self.inode, None
        if inode is None:
            return
        try:
            info = os.lstat(self.path)
        except OSError:
            return
        if (info.st_dev, info.st_ino) == inode and stat.S_ISSOCK(info.st_mode):
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def close(self) -> None:
        """Close the socket, then unlink its file (if still ours)."""
        self.sock.close()
        self.unlink()


def fits(path: str) -> bool:
    """Whether `path` fits `sun_path` as it is (the one socket-path rule)."""
    return len(os.fsencode(path)) <= SUN_PATH_MAX


@contextlib.contextmanager
def address(path: str) -> Iterator[str]:
    """`path`, or `/proc/self/fd/<dirfd>/<name>` while it is too long for `sun_path`."""
    if fits(path):
        yield path
        return
    directory, name = os.path.split(path)
    dirfd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{dirfd}/{name}"
    finally:
        os.close(dirfd)


def clear_stale(path: str) -> None:
    """Make room at `path`: unlink a socket nothing listens on; refuse anything else."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise SocketPathError(path, NOT_A_SOCKET)
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        with address(path) as where:
            probe.connect(where)
    except (ConnectionRefusedError, FileNotFoundError):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # stale: nobody listens
        return
    except BlockingIOError:  # a full backlog: someone listens
        pass
    except OSError as exc:
        raise SocketPathError(path, UNPROBEABLE, exc.errno) from None
    finally:
        probe.close()
    raise SocketPathError(path, IN_USE)


def listen(
    path: str,
    *,
    mode: int = 0o600,
    backlog: int = 128,
    check: Callable[[os.stat_result], None] | None = None,
) -> Listening:
    """Bind `path` (stale socket replaced), chmod `mode`, run `check`, then listen."""
    clear_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with address(path) as where:
            sock.bind(where)
        # before listen(): until then a connect is refused, so no peer sees a looser mode
        os.chmod(path, mode)
        info = os.lstat(path)
        if not stat.S_ISSOCK(info.st_mode):
            raise SocketPathError(path, REPLACED)
        if check is not None:
            check(info)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return Listening(path, sock, (info.st_dev, info.st_ino))
