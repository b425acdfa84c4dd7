"""Workspace containment and the byte movers behind `upload_file` and `download_file`.

Owns: resolving model-given paths inside `AC_MCP_AGENT_ROOT`, the streaming upload (three center
steps, SHA-256 in the same pass as the PUT), the atomic download (temp file + fsync + rename),
progress and cancellation for both, and `workspace_problem()` for `mcphost check`.

Containment method (why it cannot be raced)
-------------------------------------------
A path is never handed to the kernel as a string to resolve. Instead:

1. The given path is split *lexically*: NUL, empty paths and undecodable names are refused
   (`path_invalid`); an absolute path must lie under the root (compared component by component,
   so `/rootEvil` is not under `/root`), and is made relative to it; `.` and empty components
   (`a//b`) are dropped; `..` pops one component and refuses to pop past the root
   (`path_escapes_workspace`). Because step 2 refuses every symlink, lexical `..` handling equals
   what the kernel would do, and the result is a list of plain names.
2. The root is opened once per call as an `O_DIRECTORY` descriptor. Each name is then opened
   *relative to the previous directory's descriptor* (`dir_fd=`) with `O_NOFOLLOW`, so a
   component that is — or has just been swapped for — a symlink fails with `ELOOP`/`ENOTDIR`
   instead of being followed. Such a failure is classified with `fstatat(..., AT_SYMLINK_NOFOLLOW)`
   and `readlinkat`: a link whose target lies outside is `path_escapes_workspace`, any other link
   `path_through_symlink`. Symlinks are never followed, not even ones that point back inside.
3. Every later operation (open of the leaf, `mkdir`, temp-file creation, `link`/`rename`, unlink)
   uses the parent directory's descriptor, never a path string. A directory renamed or swapped
   for a symlink after we opened it cannot redirect us: we hold the descriptor of the directory
   that was inside the root when we walked it. (That directory may itself be *moved* elsewhere
   by a process with write access to the workspace; that process could equally copy the file
   out itself, so this grants it nothing.)

This is `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` done by hand, since Python exposes no
`openat2`. The root itself is operator configuration and is opened normally (its own path may
contain symlinks).

Upload leaves are opened `O_NONBLOCK` (a FIFO cannot hang us) and must be regular files by
`fstat` on the open descriptor. Bytes are read from that descriptor only, hashed in the same
pass as they are sent, and the size and mtime are re-checked at the end: a file that changed
while being sent fails with `file_changed_during_upload` and the transfer is never completed.

Downloads are checked for containment before any HTTP. After a 200, missing parents are created
one `mkdirat` at a time, bytes go to `.mcphost-<random>.part` created `O_EXCL|O_NOFOLLOW` mode
0600 in the destination directory, are fsynced, then `link`ed into place (refusing an existing
destination atomically) or `rename`d over it with `overwrite`. On any failure or cancellation
the temp file and any directories this call created are removed.

Must never: follow a symlink under the root, open a model-given path string relative to the
process's working directory, buffer a whole file in memory, complete an upload whose bytes
changed, or leave a partial download at the destination.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import hashlib
import mimetypes
import os
import re
import secrets
import stat
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from mcphost.binding import AgentBinding
from mcphost.catalog.files import DownloadFile, UploadFile
from mcphost.catalog.model import StrictInput
from mcphost.errors import ToolFailure
from mcphost.host.server import HostSurface, local_handler
from mcphost.mcpwire.protocol import CallContext, ToolResult

CHUNK = 1 << 20
MAX_DOWNLOAD_ENV = "MCPHOST_MAX_DOWNLOAD_BYTES"
DEFAULT_MAX_DOWNLOAD = 4 << 30
MAX_PATH_BYTES = 4096
PROGRESS_INTERVAL = 0.25
FILE_URI_PREFIX = "ac://files/"
_ULID = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_PREFIX = ".mcphost-"


# -- failures -------------------------------------------------------------------------------


def _fail(code: str, message: str, **details: Any) -> ToolFailure:
    return ToolFailure(code, message, details)


def _escapes(given: str, root: str, why: str) -> ToolFailure:
    return _fail(
        "path_escapes_workspace",
        f"{given!r} is outside the workspace {root} ({why}); give a path inside the "
        "workspace, relative to it or absolute under it",
        path=given,
        root=root,
        reason=why,
    )


def _invalid(given: str, root: str, why: str) -> ToolFailure:
    return _fail(
        "path_invalid",
        f"{given!r} is not a usable path ({why}); give a plain file path inside the workspace "
        f"{root}",
        path=given,
        root=root,
        reason=why,
    )


def workspace_problem(binding: AgentBinding) -> ToolFailure | None:
    """Why the file tools cannot work for `binding`, or None when the root is usable. Pure
    apart from one `open` of the root (for `mcphost check`)."""
    try:
        fd = _open_root(binding)
    except ToolFailure as failure:
        return failure
    os.close(fd)
    return None


def _open_root(binding: AgentBinding) -> int:
    root = binding.agent_root
    if not root:
        raise _fail(
            "workspace_root_unset",
            "the file tools need a workspace root and this host has none: the operator must "
            "set AC_MCP_AGENT_ROOT to the agent's workspace directory",
            variable="AC_MCP_AGENT_ROOT",
        )
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise _fail(
            "workspace_root_missing",
            f"the workspace root {root} (AC_MCP_AGENT_ROOT) does not exist; the operator must "
            "create it or fix the variable",
            root=root,
            variable="AC_MCP_AGENT_ROOT",
        ) from None
    except OSError as exc:
        raise _fail(
            "workspace_root_unusable",
            f"the workspace root {root} (AC_MCP_AGENT_ROOT) cannot be opened as a directory "
            f"({exc.strerror}); the operator must fix it",
            root=root,
            variable="AC_MCP_AGENT_ROOT",
            reason=errno.errorcode.get(exc.errno or 0, "unknown"),
        ) from None


# -- lexical layer (pure) -------------------------------------------------------------------


def split_inside(given: str, root: str, real_root: str | None = None) -> list[str]:
    """The names leading from `root` to `given`, or a `ToolFailure`. Pure.

    `root` is absolute and normalised. An absolute `given` must lie under `root` (or under
    `real_root`, the root's symlink-free spelling, when given). The result has no `.`, `..` or
    empty names; an empty list means the root itself.
    """
    if not given:
        raise _invalid(given, root, "empty path")
    if "\0" in given:
        raise _invalid(given, root, "contains a NUL byte")
    try:
        encoded = os.fsencode(given)
    except UnicodeError:
        raise _invalid(given, root, "not encodable as a file name") from None
    if len(encoded) > MAX_PATH_BYTES:
        raise _invalid(given, root, f"longer than {MAX_PATH_BYTES} bytes")
    if given.startswith("/"):
        parts = given.split("/")
        for base in (root, real_root):
            if base is None:
                continue
            base_parts = base.rstrip("/").split("/") if base != "/" else [""]
            lexical = _normalise(parts)
            if lexical is not None and lexical[: len(base_parts) - 1] == base_parts[1:]:
                parts = lexical[len(base_parts) - 1 :]
                break
        else:
            raise _escapes(given, root, "absolute path not under the root")
    else:
        parts = given.split("/")
    out: list[str] = []
    for name in parts:
        if name in ("", "."):
            continue
        if name == "..":
            if not out:
                raise _escapes(given, root, "'..' leads above the root")
            out.pop()
            continue
        if len(os.fsencode(name)) > 255:
            raise _invalid(given, root, "a name is longer than 255 bytes")
        out.append(name)
    return out


def _normalise(parts: list[str]) -> list[str] | None:
    """Absolute components with `.`/`..` applied; `..` at `/` stays at `/` (as the kernel does)."""
    out: list[str] = []
    for name in parts:
        if name in ("", "."):
            continue
        if name == "..":
            if out:
                out.pop()
            continue
        out.append(name)
    return out


def parse_file_ref(value: str) -> str:
    """`ac://files/<ULID>` or a bare ULID -> the ULID, or `invalid_file_uri`. Pure."""
    text = value.strip()
    ulid = text[len(FILE_URI_PREFIX) :] if text.startswith(FILE_URI_PREFIX) else text
    if text.startswith("ac://") and not text.startswith(FILE_URI_PREFIX):
        ulid = ""
    if not _ULID.fullmatch(ulid.upper()):
        raise _fail(
            "invalid_file_uri",
            f"{value!r} is not a file reference; give ac://files/<ULID> (26 characters, as "
            "upload_file, list_files or an attachment gave it) or the bare ULID",
            file=value,
        )
    return ulid.upper()


def max_download_bytes(env: dict[str, str] | None = None) -> int:
    raw = (os.environ if env is None else env).get(MAX_DOWNLOAD_ENV, "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    return DEFAULT_MAX_DOWNLOAD


def guess_mime(filename: str, head: bytes) -> str:
    """MIME type from the name, else a small content sniff, else application/octet-stream."""
    guessed, _ = mimetypes.guess_type(filename, strict=False)
    if guessed:
        return guessed
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    if head and b"\0" not in head:
        try:
            head.decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.start < len(head) - 3:  # a cut multi-byte char at the end is still text
                return "application/octet-stream"
        return "text/plain"
    return "application/octet-stream"


_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
    (b"PK\x03\x04", "application/zip"),
    (b"\x1f\x8b", "application/gzip"),
    (b"\x7fELF", "application/x-executable"),
)


# -- descriptor walk ----------------------------------------------------------------------


@dataclass
class Resolved:
    """An open parent directory inside the root and the leaf name under it."""

    given: str
    root: str
    names: list[str]
    parent_fd: int
    leaf: str
    missing: list[str] = field(default_factory=list)  # parents still to create (download)
    made: list[tuple[int, str]] = field(default_factory=list)  # (dir fd, name) we created

    @property
    def display(self) -> str:
        return os.path.join(self.root, *self.names)


class Walker:
    """Walks names from the root descriptor; every hop `openat(..., O_NOFOLLOW)`."""

    def __init__(self, binding: AgentBinding, given: str) -> None:
        self.given = given
        self.root = binding.agent_root or ""
        self.root_fd = _open_root(binding)
        self.fds: list[int] = [self.root_fd]

    def close(self) -> None:
        for fd in reversed(self.fds):
            with suppress(OSError):
                os.close(fd)
        self.fds.clear()

    def names(self) -> list[str]:
        real = os.path.realpath(self.root)
        return split_inside(self.given, self.root, real if real != self.root else None)

    def link_failure(self, dir_fd: int, name: str, depth: list[str]) -> ToolFailure | None:
        """If `name` under `dir_fd` is a symlink, the failure to report for it."""
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return None
        if not stat.S_ISLNK(info.st_mode):
            return None
        try:
            target = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            target = ""
        where = "/".join([*depth, name])
        if not self.lexically_inside(depth, target):
            return _escapes(self.given, self.root, f"{where} is a symlink leading outside")
        return _fail(
            "path_through_symlink",
            f"{self.given!r} goes through the symlink {where} (-> {target}); the file tools "
            "never follow symlinks. Give the real path inside the workspace instead",
            path=self.given,
            root=self.root,
            symlink=where,
        )

    def symlink_failure(self, dir_fd: int, name: str, depth: list[str]) -> ToolFailure:
        """The failure for a component seen as a symlink, even if it changed since."""
        link = self.link_failure(dir_fd, name, depth)
        if link is not None:
            return link
        where = "/".join([*depth, name])
        return _fail(
            "path_through_symlink",
            f"{self.given!r}: {where} was a symlink when it was opened (it is changing under "
            "us); the file tools never follow symlinks. Give the real path inside the workspace",
            path=self.given,
            root=self.root,
            symlink=where,
        )

    def lexically_inside(self, depth: list[str], target: str) -> bool:
        """Whether a link at `depth` pointing at `target` would stay inside (message only)."""
        if not target:
            return True
        if target.startswith("/"):
            try:
                split_inside(target, self.root, os.path.realpath(self.root))
            except ToolFailure:
                return False
            return True
        stack = list(depth)
        for name in target.split("/"):
            if name in ("", "."):
                continue
            if name == "..":
                if not stack:
                    return False
                stack.pop()
            else:
                stack.append(name)
        return True

    def open_dir(self, dir_fd: int, name: str, depth: list[str]) -> int:
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            raise self.classify(exc, dir_fd, name, depth, want_dir=True) from None
        self.fds.append(fd)
        return fd

    def classify(
        self, exc: OSError, dir_fd: int, name: str, depth: list[str], *, want_dir: bool
    ) -> ToolFailure:
        try:  # one lstat decides, so a name flipping again cannot confuse the verdict
            now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except OSError:
            now = 0
        if stat.S_ISLNK(now):
            return self.symlink_failure(dir_fd, name, depth)
        where = "/".join([*depth, name])
        if exc.errno == errno.ENOENT:
            return _fail(
                "path_not_found",
                f"{self.given!r} does not exist in the workspace {self.root} ({where} is "
                "missing); check the path (relative paths start at the workspace root)",
                path=self.given,
                root=self.root,
                missing=where,
            )
        if exc.errno in (errno.ENOTDIR, errno.ELOOP) and stat.S_ISDIR(now):
            return _fail(
                "path_changed",
                f"{self.given!r}: {where} was replaced while it was being resolved (it was not "
                "a plain directory when opened, e.g. a symlink was swapped in); nothing was "
                "touched. Retry once the workspace is stable",
                path=self.given,
                root=self.root,
                component=where,
            )
        if exc.errno == errno.ENOTDIR:
            return _fail(
                "path_not_a_directory",
                f"{self.given!r}: {where} is not a directory, so nothing can be under it",
                path=self.given,
                root=self.root,
                component=where,
            )
        if exc.errno in (errno.EACCES, errno.EPERM):
            return _fail(
                "path_permission_denied",
                f"{self.given!r}: permission denied on {where}",
                path=self.given,
                root=self.root,
            )
        if exc.errno == errno.ENAMETOOLONG:
            return _invalid(self.given, self.root, "a name is too long")
        if exc.errno == errno.ELOOP:
            return self.symlink_failure(dir_fd, name, depth)
        return _fail(
            "path_unusable",
            f"{self.given!r}: {where} cannot be opened ({exc.strerror})",
            path=self.given,
            root=self.root,
            reason=errno.errorcode.get(exc.errno or 0, "unknown"),
        )

    def parent(self, *, create_missing: bool = False) -> Resolved:
        """Open every directory above the leaf; missing ones are recorded (download) or fail."""
        names = self.names()
        if not names:
            return Resolved(self.given, self.root, names, self.root_fd, "")
        fd = self.root_fd
        depth: list[str] = []
        missing: list[str] = []
        for index, name in enumerate(names[:-1]):
            try:
                fd = self.open_dir(fd, name, depth)
            except ToolFailure as failure:
                if failure.code == "path_not_found" and create_missing:
                    missing = names[index:-1]
                    break
                raise
            depth.append(name)
        return Resolved(self.given, self.root, names, fd, names[-1], missing)

    def make_missing(self, resolved: Resolved) -> None:
        """Create the recorded missing parents, one `mkdirat` + `O_NOFOLLOW` open at a time."""
        fd = resolved.parent_fd
        depth = resolved.names[: len(resolved.names) - 1 - len(resolved.missing)]
        for name in resolved.missing:
            try:
                os.mkdir(name, 0o777, dir_fd=fd)
                resolved.made.append((fd, name))
            except FileExistsError:
                pass  # raced with another creator: the O_NOFOLLOW open below decides
            except OSError as exc:
                raise self.classify(exc, fd, name, depth, want_dir=True) from None
            fd = self.open_dir(fd, name, depth)
            depth.append(name)
        resolved.parent_fd = fd
        resolved.missing = []

    def undo_made(self, resolved: Resolved) -> None:
        for dir_fd, name in reversed(resolved.made):
            with suppress(OSError):
                os.rmdir(name, dir_fd=dir_fd)
        resolved.made.clear()


@contextmanager
def walker(binding: AgentBinding, given: str) -> Iterator[Walker]:
    w = Walker(binding, given)
    try:
        yield w
    finally:
        w.close()


def open_for_upload(w: Walker) -> tuple[Resolved, int, os.stat_result]:
    """The leaf as an open regular-file descriptor (O_NOFOLLOW, O_NONBLOCK) and its fstat."""
    resolved = w.parent()
    if not resolved.leaf:
        raise _not_regular(w, "the workspace root", "directory")
    depth = resolved.names[:-1]
    try:
        pre = os.stat(resolved.leaf, dir_fd=resolved.parent_fd, follow_symlinks=False)
    except OSError as exc:
        raise w.classify(exc, resolved.parent_fd, resolved.leaf, depth, want_dir=False) from None
    if stat.S_ISLNK(pre.st_mode):
        raise w.symlink_failure(resolved.parent_fd, resolved.leaf, depth)
    if not stat.S_ISREG(pre.st_mode):
        raise _not_regular(w, resolved.display, _kind(pre.st_mode))
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(resolved.leaf, flags, dir_fd=resolved.parent_fd)
    except OSError as exc:
        raise w.classify(exc, resolved.parent_fd, resolved.leaf, depth, want_dir=False) from None
    w.fds.append(fd)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise _not_regular(w, resolved.display, _kind(info.st_mode))
    os.set_blocking(fd, True)
    return resolved, fd, info


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "named pipe"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISLNK, "symlink"),
    ):
        if test(mode):
            return name
    return "special file"


def _not_regular(w: Walker, shown: str, kind: str) -> ToolFailure:
    return _fail(
        "path_not_regular_file",
        f"{w.given!r} ({shown}) is a {kind}, not a regular file; only regular files can be "
        "uploaded (archive a directory first)",
        path=w.given,
        root=w.root,
        kind=kind,
    )


def check_destination(w: Walker, resolved: Resolved, *, overwrite: bool) -> None:
    """Refuse a destination that is the root, a directory, a symlink, special, or exists."""
    if not resolved.leaf:
        raise _fail(
            "destination_is_directory",
            f"{w.given!r} is the workspace root; give a file path such as downloads/name.ext",
            path=w.given,
            root=w.root,
        )
    if resolved.missing:
        return
    try:
        info = os.stat(resolved.leaf, dir_fd=resolved.parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise w.classify(
            exc, resolved.parent_fd, resolved.leaf, resolved.names[:-1], want_dir=False
        ) from None
    if stat.S_ISLNK(info.st_mode):
        raise w.symlink_failure(resolved.parent_fd, resolved.leaf, resolved.names[:-1])
    if stat.S_ISDIR(info.st_mode):
        raise _fail(
            "destination_is_directory",
            f"{w.given!r} ({resolved.display}) is a directory; give a file path inside it, "
            "e.g. <dir>/<name>",
            path=w.given,
            root=w.root,
        )
    if not stat.S_ISREG(info.st_mode):
        raise _fail(
            "destination_not_regular_file",
            f"{w.given!r} ({resolved.display}) is a {_kind(info.st_mode)}; it will not be "
            "replaced, choose another destination",
            path=w.given,
            root=w.root,
        )
    if not overwrite:
        raise _destination_exists(w, resolved)


def _destination_exists(w: Walker, resolved: Resolved) -> ToolFailure:
    return _fail(
        "destination_exists",
        f"{w.given!r} ({resolved.display}) already exists and was left untouched; pass "
        "overwrite: true to replace it, or choose another dest_path",
        path=w.given,
        root=w.root,
    )


# -- blocking work off the event loop ------------------------------------------------------

_POOL: concurrent.futures.ThreadPoolExecutor | None = None


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="mcphost-files")
    return _POOL


class _Jobs:
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
        """Wait for running jobs even under cancellation (re-raised after they finish)."""
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


# -- upload -------------------------------------------------------------------------------


class _Changed(Exception):
    """The file changed size while it was being read."""


def _changed(w: Walker, shown: str, why: str) -> ToolFailure:
    return _fail(
        "file_changed_during_upload",
        f"{w.given!r} ({shown}) changed while it was being uploaded ({why}); nothing was "
        "stored. Wait until whatever writes it has finished, then upload again",
        path=w.given,
        reason=why,
    )


@local_handler("upload_file")
async def upload_file(surface: HostSurface, params: StrictInput, ctx: CallContext) -> ToolResult:
    assert isinstance(params, UploadFile)
    agent_id = surface.binding.agent_id
    with walker(surface.binding, params.path) as w:
        resolved, fd, info = open_for_upload(w)
        size = info.st_size
        filename = resolved.leaf
        mime = guess_mime(filename, os.pread(fd, 512, 0))
        scope = {"scope": params.scope, "scope_id": params.scope_id} if params.scope else {}
        opened = await surface.admin.call(
            "/admin/agent-tools/upload_file",
            {
                "agent_id": agent_id,
                "filename": filename,
                "content_type": mime,
                "size": size,
                **scope,
            },
        )
        session = _json_object(opened.body, "upload_file")
        transfer_id = str(session.get("transfer_id") or "")
        if not transfer_id or "/" in transfer_id:
            raise _fail(
                "admin_protocol_error",
                "the center opened no usable upload session (no transfer_id); retry once, "
                "then report it",
            )
        digest = hashlib.sha256()
        sent = 0
        changed: list[str] = []
        report = Progress(ctx, size, "uploaded")
        jobs = _Jobs()

        def read_chunk(limit: int) -> bytes:
            chunk = os.read(fd, limit)
            digest.update(chunk)
            return chunk

        def read_ahead() -> asyncio.Future[bytes]:
            # one byte past the declared size, so growth is seen without a second read
            return jobs.submit(read_chunk, min(CHUNK, size - sent + 1))

        async def body() -> AsyncIterator[bytes]:
            nonlocal sent
            pending = read_ahead()
            while True:
                chunk = await pending
                jobs.running.clear()
                if not chunk:
                    break
                sent += len(chunk)
                if sent > size:
                    changed.append("it grew")
                    raise _Changed()
                pending = read_ahead()  # read and hash the next chunk while this one is sent
                yield chunk
                await report(sent)
            if sent < size:
                changed.append("it shrank")
                raise _Changed()

        try:
            async with surface.admin.stream(
                "PUT",
                f"/admin/files/transfer/{transfer_id}",
                data=body(),
                headers={
                    "Content-Type": "application/octet-stream",
                    "Content-Length": str(size),
                },
                params={"agent_id": agent_id},
            ) as response:
                await response.read()
        except (ToolFailure, _Changed):
            if changed:
                raise _changed(w, resolved.display, changed[0]) from None
            raise
        finally:
            await jobs.drain()  # the descriptor closes after this, never under a read
        after = os.fstat(fd)
        if after.st_size != size or after.st_mtime_ns != info.st_mtime_ns:
            raise _changed(w, resolved.display, "it was modified")
        sha256 = digest.hexdigest()
        done = await surface.admin.call(
            f"/admin/files/transfer/{transfer_id}/complete",
            {"agent_id": agent_id, "sha256": sha256, "size": size, **scope},
        )
        await report(sent, final=True)
        completed = _json_object(done.body, "complete")
        result: dict[str, Any] = {
            "file_uri": completed.get("file_uri") or session.get("file_uri"),
            "filename": filename,
            "mime_type": mime,
            "size": size,
            "sha256": sha256,
        }
        if completed.get("reference_id"):
            result["reference_id"] = completed["reference_id"]
        if params.scope:
            result["scope"], result["scope_id"] = params.scope, params.scope_id
        return _ok(result)


def _json_object(body: bytes, step: str) -> dict[str, Any]:
    import json

    try:
        value = json.loads(body)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise _fail(
            "admin_protocol_error",
            f"the center's {step} reply was not a JSON object; retry once, then report it",
        )
    return value


def _ok(result: dict[str, Any]) -> ToolResult:
    import json

    return ToolResult(text=json.dumps(result, ensure_ascii=False), structured=result)


# -- download -----------------------------------------------------------------------------

_ADMISSION_CODES = ("agent_not_bound_to_worker", "stale_generation")


def _download_failure(failure: ToolFailure, file_id: str) -> ToolFailure:
    if failure.code.startswith("auth_") or failure.code in _ADMISSION_CODES:
        return failure
    center = {"center_error": failure.code, "file": FILE_URI_PREFIX + file_id}
    if failure.status == 403:
        return ToolFailure(
            "file_not_reachable",
            f"{failure.message or 'the center refused this file'} — you can download files "
            "you uploaded or that are attached to a scope you belong to",
            {**failure.details, **center},
            status=403,
        )
    if failure.status == 404:
        return ToolFailure(
            "file_not_found",
            f"{failure.message or 'no such file'} — check the ac://files URI (list_files shows "
            "a scope's files)",
            {**failure.details, **center},
            status=404,
        )
    return failure


@local_handler("download_file")
async def download_file(surface: HostSurface, params: StrictInput, ctx: CallContext) -> ToolResult:
    assert isinstance(params, DownloadFile)
    file_id = parse_file_ref(params.file)
    cap = max_download_bytes()
    with walker(surface.binding, params.dest_path) as w:
        resolved = w.parent(create_missing=True)
        check_destination(w, resolved, overwrite=params.overwrite)
        temp: str | None = None
        temp_fd = -1
        jobs = _Jobs()
        kept = False
        report = Progress(ctx, None, "downloaded")
        try:
            try:
                async with surface.admin.stream(
                    "GET",
                    f"/admin/files/{file_id}",
                    params={"agent_id": surface.binding.agent_id},
                    headers={"Accept": "*/*"},
                ) as response:
                    mime = response.headers.get("Content-Type", "application/octet-stream")
                    announced = report.total = response.content_length
                    if announced is not None and announced > cap:
                        raise _too_large(params.file, cap, announced)
                    w.make_missing(resolved)
                    if resolved.made:
                        check_destination(w, resolved, overwrite=params.overwrite)
                    temp = f"{_TEMP_PREFIX}{secrets.token_hex(8)}.part"
                    temp_fd = os.open(
                        temp,
                        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                        0o600,
                        dir_fd=resolved.parent_fd,
                    )
                    size, sha256 = await _receive(response, temp_fd, cap, params.file, report, jobs)
            except ToolFailure as failure:
                raise _download_failure(failure, file_id) from None
            await jobs.submit(os.fsync, temp_fd)
            os.close(temp_fd)
            temp_fd = -1
            _place(w, resolved, temp, overwrite=params.overwrite)
            kept = True
            with suppress(OSError):
                os.fsync(resolved.parent_fd)
        except OSError as exc:
            raise _write_failed(w, exc) from None
        finally:
            await jobs.drain()  # no write may still run when the temp file goes
            if temp_fd >= 0:
                os.close(temp_fd)
            if not kept:
                if temp is not None:
                    with suppress(OSError):
                        os.unlink(temp, dir_fd=resolved.parent_fd)
                w.undo_made(resolved)
        report.total = size
        await report(size, final=True)
        return _ok(
            {
                "dest_path": resolved.display,
                "size": size,
                "sha256": sha256,
                "mime_type": mime.split(";")[0].strip() or "application/octet-stream",
            }
        )


def _place(w: Walker, resolved: Resolved, temp: str | None, *, overwrite: bool) -> None:
    """Move the finished temp file to the leaf, via the directory descriptor only."""
    assert temp is not None
    fd = resolved.parent_fd
    if overwrite:
        try:
            os.rename(temp, resolved.leaf, src_dir_fd=fd, dst_dir_fd=fd)
        except IsADirectoryError:
            raise _fail(
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
        raise _destination_exists(w, resolved) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
            raise
        # no hard links here (some FUSE/vfat mounts): re-check, then rename
        check_destination(w, resolved, overwrite=False)
        os.rename(temp, resolved.leaf, src_dir_fd=fd, dst_dir_fd=fd)
        return
    os.unlink(temp, dir_fd=fd)


async def _receive(
    response: Any, fd: int, cap: int, given: str, report: Progress, jobs: _Jobs
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
            raise _too_large(given, cap, total)
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
        raise _fail(
            "download_incomplete",
            f"the center announced {total} bytes for {given!r} but sent {size}; nothing was "
            "written. Retry the download",
            announced=total,
            received=size,
        )
    return size, digest.hexdigest()


def _too_large(given: str, cap: int, announced: int | None) -> ToolFailure:
    return _fail(
        "file_too_large",
        f"{given!r} is larger than this host's download limit of {cap} bytes"
        + (f" ({announced} bytes)" if announced is not None else "")
        + f"; nothing was written. The operator can raise {MAX_DOWNLOAD_ENV}",
        limit_bytes=cap,
        size=announced,
        variable=MAX_DOWNLOAD_ENV,
    )


def _write_failed(w: Walker, exc: OSError) -> ToolFailure:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        why = "the disk is full or over quota"
    elif exc.errno == errno.EROFS:
        why = "the file system is read-only"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        why = "permission denied"
    else:
        why = exc.strerror or "I/O error"
    return _fail(
        "destination_write_failed",
        f"{w.given!r} could not be written in the workspace {w.root} ({why}); nothing was "
        "left behind",
        path=w.given,
        root=w.root,
        reason=errno.errorcode.get(exc.errno or 0, "unknown"),
    )
