"""Per-agent output logs: size-rotated files in the agent's log directory, and reading them back.

Owns: `RotatingLog` (append bytes; rotate `agent.log -> agent.log.1 -> ... -> agent.log.<keep>`,
dropping the oldest, before a write would make the current file exceed `max_bytes`; a chunk
larger than `max_bytes` is split, so no file ever exceeds it), `tail` (last N lines across the
current and rotated files, read backwards in blocks) and `follow` (an async iterator of new bytes
that keeps going across rotations). Used by the agent runner and `ctl logs <agent> [--follow]`.

The directory is the supervisor's own (`<state>/logs/<id>/`, homes.py), never inside an agent's
home: an agent owns its home and could swap a directory there for a symlink. `RotatingLog` also
opens its directory once (`O_NOFOLLOW`) and creates, renames and unlinks every file relative to
that descriptor, so even a directory swapped after it was opened redirects nothing.
Must never: hold more than the chunk being written in memory, follow a symlink planted in the
log directory (or in its place), or create a file readable by anyone but the supervisor's user
(0600).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator

_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_BLOCK = 64 * 1024


class RotatingLog:
    """Append-only log file rotated by size, in the directory it opened once (see the module
    docstring); `directory` is created (0700) when missing."""

    def __init__(
        self, directory: str, name: str = "agent.log", *, max_bytes: int, keep: int
    ) -> None:
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        if keep < 0:
            raise ValueError("keep must be 0 or more")
        self.directory = directory
        self.name = name
        self.max_bytes = max_bytes
        self.keep = keep
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self._dir = os.open(directory, _DIR_FLAGS)
        self._fd: int | None = None
        self._size = 0
        try:
            self._open()
        except BaseException:
            os.close(self._dir)
            raise

    @property
    def path(self) -> str:
        return os.path.join(self.directory, self.name)

    def _open(self) -> None:
        fd = os.open(self.name, _OPEN_FLAGS, 0o600, dir_fd=self._dir)
        os.fchmod(fd, 0o600)
        self._fd = fd
        self._size = os.fstat(fd).st_size

    def write(self, data: bytes) -> None:
        """Append `data`, rotating first whenever it would not fit."""
        view = memoryview(data)
        while view:
            room = self.max_bytes - self._size
            if room <= 0 or (self._size > 0 and len(view) > room):
                self.rotate()
                room = self.max_bytes
            piece = view[:room]
            fd = self._fd
            assert fd is not None, "write after close"
            written = os.write(fd, piece)
            self._size += written
            view = view[written:]

    def rotate(self) -> None:
        """Shift the files by one (the oldest beyond `keep` is dropped) and start a new one."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        base = self.name
        if self.keep == 0:
            _unlink(self._dir, base)
        else:
            for index in range(self.keep - 1, 0, -1):
                _rename(self._dir, f"{base}.{index}", f"{base}.{index + 1}")
            _rename(self._dir, base, f"{base}.1")
        self._open()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._dir >= 0:
            os.close(self._dir)
            self._dir = -1


def _rename(dir_fd: int, src: str, dst: str) -> None:
    try:
        os.rename(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def _unlink(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def log_files(directory: str, name: str = "agent.log") -> list[str]:
    """The log's files, newest first: `name`, `name.1`, `name.2`, ... (those that exist)."""
    rotated = []
    prefix = name + "."
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return []
    for entry in entries:
        if entry.startswith(prefix) and entry[len(prefix) :].isdigit():
            rotated.append((int(entry[len(prefix) :]), entry))
    files = [name] if name in entries else []
    files += [entry for _, entry in sorted(rotated)]
    return [os.path.join(directory, f) for f in files]


def tail(directory: str, lines: int, name: str = "agent.log") -> bytes:
    """The last `lines` lines across the current and rotated files (a final partial line counts)."""
    if lines <= 0:
        return b""
    collected: list[bytes] = []  # blocks, newest first
    newlines = 0
    ends_with_newline: bool | None = None

    def enough() -> bool:
        # N complete lines need N + 1 newlines (the one before the first); a partial last line
        # is one of the N and has no newline of its own.
        return ends_with_newline is not None and newlines >= lines + int(ends_with_newline)

    for path in log_files(directory, name):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            position = os.fstat(fd).st_size
            while position > 0 and not enough():
                size = min(_BLOCK, position)
                position -= size
                block = os.pread(fd, size, position)
                if ends_with_newline is None and block:
                    ends_with_newline = block.endswith(b"\n")
                collected.append(block)
                newlines += block.count(b"\n")
        finally:
            os.close(fd)
        if enough():
            break
    parts = b"".join(reversed(collected)).split(b"\n")
    if ends_with_newline:
        return b"\n".join(parts[-lines - 1 : -1]) + b"\n"
    return b"\n".join(parts[-lines:])


async def _open_when_exists(path: str, poll: float) -> int:
    while True:
        try:
            return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            await asyncio.sleep(poll)


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino)


async def follow(
    directory: str,
    name: str = "agent.log",
    *,
    from_start: bool = False,
    poll: float = 0.1,
) -> AsyncGenerator[bytes, None]:
    """Yield bytes appended to the log from now on (or from its start), across rotations.

    Polls every `poll` s when idle. On rotation (the path names a new file) it first drains the
    old file to its end, then continues with the new file from its start. Two rotations within
    one poll skip the file in between (it is then `.2`; `tail` still shows it).
    """
    path = os.path.join(directory, name)
    existed = os.path.lexists(path)
    fd = await _open_when_exists(path, poll)
    try:
        inode = _identity(fd)
        if existed and not from_start:
            os.lseek(fd, 0, os.SEEK_END)
        while True:
            chunk = os.read(fd, _BLOCK)
            if chunk:
                yield chunk
                continue
            try:
                st = os.stat(path, follow_symlinks=False)
                rotated = (st.st_dev, st.st_ino) != inode
            except FileNotFoundError:
                rotated = True
            if not rotated:
                await asyncio.sleep(poll)
                continue
            while chunk := os.read(fd, _BLOCK):  # what the old file got before it was closed
                yield chunk
            os.close(fd)
            fd = -1
            fd = await _open_when_exists(path, poll)
            inode = _identity(fd)
    finally:
        if fd >= 0:
            os.close(fd)
