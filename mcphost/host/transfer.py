"""The transfer machinery behind the file tools: streaming byte movers, progress, `.part` files.

Owns: blocking descriptor work off the event loop (`Jobs`, a small shared thread pool), MCP
progress for transfers (`Progress`), the upload body (`FileReader`: chunks of an open file,
hashed in the same pass, growth and shrinkage detected), the download side (`receive`: the
body into a descriptor, hashed in the same pass, within the size cap; `create_temp`,
`sweep_stale_parts` and `place` for the `.mcphost-<16 hex>.part` file), and the failures of
these steps (`file_too_large`, `download_incomplete`, `destination_write_failed`).

Upload leaves are opened `O_NONBLOCK` (a FIFO cannot hang us) and must be regular files by
`fstat` on the open descriptor. Bytes are read from that descriptor only, hashed in the same
pass as they are sent, and the size and mtime are re-checked at the end: a file that changed
while being sent fails with `file_changed_during_upload` and the transfer is never completed.

Downloads are checked for containment before any HTTP. After a 200, missing parents are created
(mode 0700) one `mkdirat` at a time, bytes go to `.mcphost-<16 hex>.part` created
`O_EXCL|O_NOFOLLOW` mode 0600 in the destination directory and held under `flock(LOCK_EX)`
until placed, are fsynced, then `link`ed into place (refusing an existing destination
atomically) or `rename`d over it with `overwrite`. On any failure or cancellation the temp file
and any directories this call created are removed. Before a download creates its temp file, the
destination directory is swept: a `.part` of exactly this pattern that nobody holds locked (the
leftover of a killed host) is removed; a locked one is a download in flight and is left alone.

Paths come resolved from `mcphost.host.workspace` (a directory descriptor and a leaf name);
this module opens nothing by a model-given path and talks to no center.
Must never: buffer a whole file in memory, close a descriptor or remove a temp file under a
running job, touch a `.part` that a live download holds locked, or leave a partial download at
the destination.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import fcntl
import hashlib
import os
import re
import secrets
import stat
import time
from collections.abc import AsyncIterator
from typing import Any

from mcphost import events
from mcphost.errors import FileFailure
from mcphost.host.workspace import (
    Resolved,
    Walker,
    check_destination,
    destination_exists,
    file_failure,
)
from mcphost.surface import CallContext
from mcphost.tuning import Tuning

CHUNK = 1 << 20
MAX_DOWNLOAD_ENV = Tuning.env_name("max_download_bytes")
PROGRESS_INTERVAL = 0.25
_TEMP_PREFIX = ".mcphost-"
_TEMP_NAME = re.compile(r"\.mcphost-[0-9a-f]{16}\.part")  # exactly what this host creates


# -- blocking work off the event loop ------------------------------------------------------

_POOL: concurrent.futures.ThreadPoolExecutor | None = None


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="mcphost-files")
    return _POOL


class Jobs:
    """Blocking descriptor work (read, write, hash) in threads, so the loop keeps moving bytes.

    Holds the thread futures themselves (not asyncio wrappers, which report "done" as soon as
    the awaiting task is cancelled while the thread is still running), so `drain()` really waits:
    a descriptor is never closed, and a temp file never unlinked, under a running job.
    """

    def __init__(self) -> None:
        self.running: list[concurrent.futures.Future[Any]] = []

    def submit(self, fn: Any, *args: Any) -> asyncio.Future[Any]:
        job = _pool().submit(fn, *args)
        self.running.append(job)
        return asyncio.wrap_future(job)

    async def wait(self) -> None:
        """Wait for every submitted job; re-raise the first failure."""
        jobs, self.running = self.running, []
        try:
            for job in jobs:
                await asyncio.wrap_future(job)
        finally:
            self.running = [job for job in jobs if not job.done()] + self.running

    async def drain(self) -> None:
        """Wait for running jobs even under cancellation, re-raised once they have finished.

        Under anyio a cancelled scope cancels again at every wait, so a cancel that arrives
        during a running job is re-raised here: callers put their cleanup in a `finally`
        around this call, never after it."""
        cancelled = False
        for job in self.running:
            while not job.done():
                try:
                    await asyncio.wait([asyncio.wrap_future(job)])
                except asyncio.CancelledError:
                    cancelled = True
        self.running = []
        if cancelled:
            raise asyncio.CancelledError


# -- progress -----------------------------------------------------------------------------


class Progress:
    def __init__(self, ctx: CallContext, total: int | None, verb: str) -> None:
        self.ctx = ctx
        self.total = total
        self.verb = verb
        self.last = 0.0
        self.sent = -1  # the last progress sent: MCP requires each one to be higher

    async def __call__(self, done: int, *, final: bool = False) -> None:
        if self.ctx.progress_token is None or done <= self.sent:
            return
        now = time.monotonic()
        if not final and now - self.last < PROGRESS_INTERVAL:
            return
        self.last = now
        self.sent = done
        total = f" of {self.total}" if self.total is not None else ""
        await self.ctx.progress(done, self.total, f"{self.verb} {done}{total} bytes")


# -- upload: the bytes of one open file ----------------------------------------------------


class Changed(Exception):
    """The file changed size while it was being read; `why` says how."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class FileReader:
    """The bytes of an open regular file of `size` bytes, as an upload body.

    Reads from the descriptor only, hashes in the same pass, and reads the next chunk in a
    thread while this one is sent. One byte past the declared size is asked for, so growth is
    seen without a second read; growth or shrinkage raises `Changed` and the transfer is never
    completed. The HTTP client may wrap that exception in its own failure, so the reason is
    also kept in `changed`. `drain()` must run before the descriptor is closed."""

    def __init__(self, fd: int, size: int, report: Progress) -> None:
        self.fd = fd
        self.size = size
        self.report = report
        self.digest = hashlib.sha256()
        self.sent = 0
        self.changed: str | None = None
        self.jobs = Jobs()

    def _read(self, limit: int) -> bytes:
        chunk = os.read(self.fd, limit)
        self.digest.update(chunk)
        return chunk

    def _read_ahead(self) -> asyncio.Future[bytes]:
        return self.jobs.submit(self._read, min(CHUNK, self.size - self.sent + 1))

    async def chunks(self) -> AsyncIterator[bytes]:
        pending = self._read_ahead()
        while True:
            chunk = await pending
            self.jobs.running.clear()
            if not chunk:
                break
            self.sent += len(chunk)
            if self.sent > self.size:
                self.changed = "it grew"
                raise Changed(self.changed)
            pending = self._read_ahead()  # read and hash the next chunk while this one is sent
            yield chunk
            await self.report(self.sent)
        if self.sent < self.size:
            self.changed = "it shrank"
            raise Changed(self.changed)

    async def drain(self) -> None:
        await self.jobs.drain()


# -- download: the temp file and its placing ------------------------------------------------


def create_temp(dir_fd: int) -> tuple[str, int]:
    """A new `.mcphost-<random>.part` in `dir_fd`, mode 0600, held under an exclusive `flock`
    until the download is placed or removed: the lock is what tells a sweeper (this host or
    another) that the file is in flight. Taken right after creation, then the name is checked
    to still be ours, so a sweeper that won the moment in between costs only a retry."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(16):
        name = f"{_TEMP_PREFIX}{secrets.token_hex(8)}.part"
        fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            mine = os.fstat(fd)
            now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                return name, fd
        except OSError:
            pass  # a sweeper holds or removed it; it removes the name, we take another
        os.close(fd)
    raise OSError(errno.EAGAIN, "could not create a temporary file")


def sweep_stale_parts(dir_fd: int, root: str) -> list[str]:
    """Remove `.mcphost-<16 hex>.part` files in `dir_fd` that no download holds locked: the
    leftovers of a host killed mid-download. A file whose lock is held (a download in flight,
    in this host or another) is left alone, and nothing of any other name is touched."""
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(dir_fd) if _TEMP_NAME.fullmatch(n)]
    except OSError:
        return removed
    for name in names:
        try:
            fd = os.open(
                name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
            )
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by a live download: OSError
            now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino):
                os.unlink(name, dir_fd=dir_fd)  # still under our lock: nobody can be using it
                removed.append(name)
        except OSError:
            continue
        finally:
            os.close(fd)
    if removed:
        events.emit("mcp.files.stale_temp_removed", root=root, names=removed)
    return removed


def place(w: Walker, resolved: Resolved, temp: str | None, *, overwrite: bool) -> None:
    """Move the finished temp file to the leaf, via the directory descriptor only."""
    assert temp is not None
    fd = resolved.parent_fd
    if overwrite:
        try:
            os.rename(temp, resolved.leaf, src_dir_fd=fd, dst_dir_fd=fd)
        except IsADirectoryError:
            raise file_failure(
                "destination_is_directory",
                f"{w.given!r} ({resolved.display}) became a directory during the download; "
                "nothing was written",
                path=w.given,
                root=w.root,
            ) from None
        return
    try:
        os.link(temp, resolved.leaf, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
    except FileExistsError:
        raise destination_exists(w, resolved) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
            raise
        # no hard links here (some FUSE/vfat mounts): re-check, then rename
        check_destination(w, resolved, overwrite=False)
        os.rename(temp, resolved.leaf, src_dir_fd=fd, dst_dir_fd=fd)
        return
    os.unlink(temp, dir_fd=fd)


async def receive(
    response: Any, fd: int, cap: int, given: str, report: Progress, jobs: Jobs
) -> tuple[int, str]:
    """Stream the body into `fd`, hashing in the same pass, enforcing `cap`."""
    digest = hashlib.sha256()
    total = response.content_length
    size = 0
    pending: list[bytes] = []
    pending_size = 0

    def write_all(batch: bytes) -> None:
        view = memoryview(batch)
        while view:
            view = view[os.write(fd, view) :]

    async def hand_off(chunks: list[bytes]) -> None:
        await jobs.wait()  # the previous batch is on disk and hashed
        batch = b"".join(chunks)
        jobs.submit(digest.update, batch)  # hashing and writing run side by side,
        jobs.submit(write_all, batch)  # while the loop keeps receiving the next batch

    async for chunk in response.content.iter_chunked(CHUNK):
        size += len(chunk)
        if size > cap:
            raise too_large(given, cap, total)
        pending.append(chunk)
        pending_size += len(chunk)
        if pending_size >= CHUNK:
            await hand_off(pending)
            pending, pending_size = [], 0
            await report(size)
    if pending:
        await hand_off(pending)
    await jobs.wait()
    if total is not None and size != total:
        raise file_failure(
            "download_incomplete",
            f"the center announced {total} bytes for {given!r} but sent {size}; nothing was "
            "written. Retry the download",
            announced=total,
            received=size,
        )
    return size, digest.hexdigest()


def too_large(given: str, cap: int, announced: int | None) -> FileFailure:
    return file_failure(
        "file_too_large",
        f"{given!r} is larger than this host's download limit of {cap} bytes"
        + (f" ({announced} bytes)" if announced is not None else "")
        + f"; nothing was written. The operator can raise {MAX_DOWNLOAD_ENV}",
        limit_bytes=cap,
        size=announced,
        variable=MAX_DOWNLOAD_ENV,
    )


def write_failed(w: Walker, exc: OSError) -> FileFailure:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        why = "the disk is full or over quota"
    elif exc.errno == errno.EROFS:
        why = "the file system is read-only"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        why = "permission denied"
    else:
        why = exc.strerror or "I/O error"
    return file_failure(
        "destination_write_failed",
        f"{w.given!r} could not be written in the workspace {w.root} ({why}); nothing was "
        "left behind",
        path=w.given,
        root=w.root,
        reason=errno.errorcode.get(exc.errno or 0, "unknown"),
    )
