"""Two file rules every writer of private state shares: a private directory, an atomic write.

Owns:
- `private_dir(path, parents=, mode=)`: create the directory (0700) if missing; refuse
  (`NotPrivate`) a symlink, a non-directory or a directory another uid owns; then set its mode
  to `mode` where it differs (0700 by default; None leaves it to the caller). Used by the relay
  host, the relay's tmux servers (bundle and agent), the principal store and the supervisor's
  state directory. Not here: a home (its owner may be the agent's user: `supervisor.homes`),
  the relay socket's directory (an operator's, checked only for "writable by no one else":
  `relay.server`), and the workspace walk (`host.workspace`).
- `write_atomic(path, data, mode=)`: a unique temp sibling created `O_CREAT|O_EXCL|O_NOFOLLOW`
  and `fchmod`ed to `mode` (whatever the umask), written in full, fsynced, renamed over `path`,
  then the directory fsynced. An `OSError` before the rename leaves `path` untouched (the temp
  is removed); after it, `NotDurable` says the new content is in place but maybe not on disk.
  A reader never sees half a file, and a secret is never briefly readable by others. Used by
  the principal store, the relay host's generated TOML, configgen's `write_private` (and so the
  supervisor's homes) and the reference center's files.

Errors: `NotPrivate(path, reason)` (`str()` is "<path> <reason>"), `NotDurable` (an `OSError`)
and the `OSError`s of the calls themselves; callers translate them into their own failures. Must never: follow a symlink at the final component, chmod a directory
it has not checked is ours, or leave a temp file behind on failure. Standard library only:
every floor imports it, and it imports nothing of mcphost (`mcphost/attach.py`, the stdlib-only
pump, keeps no copy: it writes no files).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat


class NotPrivate(Exception):
    """`path` is not a directory of ours: `reason` says why (a symlink or not a directory,
    another owner)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path} {reason}")
        self.path = path
        self.reason = reason


class NotDurable(OSError):
    """The rename happened but the directory fsync failed: `str()` is the cause. An `OSError`
    (its `errno` is the fsync's), so a caller that cares only about failure needs no new clause;
    one that must tell "not written" from "written, durability unknown" catches it first."""

    def __str__(self) -> str:
        return self.strerror or type(self).__name__


def private_dir(
    path: str | os.PathLike[str], *, parents: bool = False, mode: int | None = 0o700
) -> None:
    """Make `path` a directory of ours (created 0700, with its parents if `parents`), mode
    `mode`; `NotPrivate` for a symlink, a non-directory or another uid's directory."""
    where = os.fspath(path)
    if parents:
        os.makedirs(where, mode=0o700, exist_ok=True)
    else:
        with contextlib.suppress(FileExistsError):
            os.mkdir(where, 0o700)
    info = os.lstat(where)
    if not stat.S_ISDIR(info.st_mode):
        raise NotPrivate(where, "is not a directory (symlink?)")
    if info.st_uid != os.geteuid():
        raise NotPrivate(where, f"is owned by uid {info.st_uid}, not {os.geteuid()}")
    if mode is not None and stat.S_IMODE(info.st_mode) != mode:
        os.chmod(where, mode)


def write_atomic(path: str | os.PathLike[str], data: str | bytes, mode: int = 0o600) -> None:
    """Replace `path` with `data` (str as UTF-8), mode `mode`, atomically (see the module doc)."""
    directory, name = os.path.split(os.path.abspath(os.fspath(path)))
    payload = data.encode("utf-8") if isinstance(data, str) else data
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        temp = f".{name}.{secrets.token_hex(8)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp, flags, mode, dir_fd=dir_fd)
        try:
            try:
                os.fchmod(fd, mode)
                view = memoryview(payload)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            if isinstance(exc, OSError) and not isinstance(exc, NotDurable):
                # named by the file the caller asked for, not the temporary sibling's name
                target = os.path.join(directory, name)
                raise type(exc)(exc.errno, exc.strerror, target) from None
            raise
        try:
            os.fsync(dir_fd)
        except OSError as exc:
            raise NotDurable(exc.errno, exc.strerror or type(exc).__name__) from None
    finally:
        os.close(dir_fd)
