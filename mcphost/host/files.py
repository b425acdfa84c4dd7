"""Workspace containment and the byte movers behind `upload_file` and `download_file`.

Owns: resolving model-given paths inside `AC_MCP_AGENT_ROOT`, the streaming upload (three center
steps, SHA-256 in the same pass as the PUT), the atomic download (temp file + fsync + rename),
progress and cancellation for both, the held root (`HeldRoot`), the center-given transfer id
as a URL segment, and `workspace_problem()` / `root_ancestor_warnings()` for `mcphost check`.

Containment method (why it cannot be raced)
-------------------------------------------
A path is never handed to the kernel as a string to resolve. Instead:

1. The given path is split *lexically*: NUL, empty paths and undecodable names are refused
   (`path_invalid`); an absolute path must lie under the root (compared component by component,
   so `/rootEvil` is not under `/root`), and is made relative to it; `.` and empty components
   (`a//b`) are dropped; `..` pops one component and refuses to pop past the root
   (`path_escapes_workspace`). Because step 2 refuses every symlink, lexical `..` handling equals
   what the kernel would do, and the result is a list of plain names.
2. The root is opened once, at host start, as an `O_DIRECTORY` descriptor and held
   (`HeldRoot`); swapping the root's path later (rename it away, put a symlink to `/` in its
   place) changes nothing for a running host. Each name is then opened
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
4. Every directory opened and the upload leaf must be on the root's file system (`st_dev`),
   else `path_other_filesystem` (unless `MCPHOST_ALLOW_OTHER_FILESYSTEMS=1`); an upload leaf
   with more than one hard link is `path_hard_linked` (the other name may be outside).
5. The walk holds only the root, the directory it is in and, when a download creates parents,
   the directory the first one was made in: depth costs no descriptors. Undoing created
   parents climbs by `..`, accepting each parent only if it is the directory (dev, inode) made.

This is `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` done by hand, since Python exposes no
`openat2`. The root itself is operator configuration and is opened normally (its own path may
contain symlinks). A path ending in `/` or `/.` names a directory: on a file it is
`path_not_a_directory`, as the kernel would say.

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

Must never: follow a symlink under the root, reopen the root by its path once held, open a
model-given path string relative to the process's working directory, upload a hard-linked file,
put a center-given id into a URL unchecked, buffer a whole file in memory, complete an upload
whose bytes changed, or leave a partial download at the destination.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import fcntl
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
from urllib.parse import quote

from mcphost import events
from mcphost.binding import AgentBinding
from mcphost.catalog.files import DownloadFile, UploadFile
from mcphost.catalog.model import StrictInput
from mcphost.errors import ToolFailure
from mcphost.host.server import HostSurface, local_handler
from mcphost.surface import CallContext, ToolResult

CHUNK = 1 << 20
MAX_DOWNLOAD_ENV = "MCPHOST_MAX_DOWNLOAD_BYTES"
ALLOW_OTHER_FS_ENV = "MCPHOST_ALLOW_OTHER_FILESYSTEMS"
DEFAULT_MAX_DOWNLOAD = 4 << 30
MAX_PATH_BYTES = 4096
PROGRESS_INTERVAL = 0.25
FILE_URI_PREFIX = "ac://files/"
_ULID = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_PREFIX = ".mcphost-"
_TEMP_NAME = re.compile(r"\.mcphost-[0-9a-f]{16}\.part")  # exactly what this host creates
# A center-given transfer id becomes a URL path segment: it must be one plain id, never a path,
# query or fragment (`T1?agent_id=agent-2`, `..`). It is also percent-quoted when used.
_TRANSFER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:~-]{0,127}")


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
    root = HeldRoot(binding)
    root.close()
    return root.failure


def root_ancestor_warnings(binding: AgentBinding) -> list[dict[str, Any]]:
    """The directories above the workspace root that someone other than this user (or root)
    could rename entries in, i.e. swap the root for something else before a host starts. For
    `mcphost check`; read-only (`lstat` of each ancestor of the root as configured and of its
    symlink-free spelling)."""
    root = binding.agent_root
    if not root:
        return []
    me = os.geteuid()
    trusted = {0, me}
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for spelling in (os.path.abspath(root), os.path.realpath(root)):
        child = spelling
        while True:
            parent = os.path.dirname(child)
            if parent == child:
                break
            if parent not in seen:
                seen.add(parent)
                why = _unsafe_ancestor(parent, child, trusted)
                if why is not None:
                    out.append(
                        {
                            "code": "workspace_root_ancestor_writable",
                            "path": parent,
                            "message": f"{parent} {why}, so others can swap the workspace root "
                            f"{root} (AC_MCP_AGENT_ROOT) before a host opens it; the operator "
                            "should make it writable by its owner only (chmod go-w) or move "
                            "the workspace under a private directory",
                            "variable": "AC_MCP_AGENT_ROOT",
                        }
                    )
            child = parent
    return out


def _unsafe_ancestor(parent: str, child: str, trusted: set[int]) -> str | None:
    try:
        info = os.lstat(parent)
    except OSError:
        return None  # a missing root is reported by workspace_problem
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid not in trusted:
        return f"is owned by uid {info.st_uid}"
    if not mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    if mode & stat.S_ISVTX:  # sticky: only the entry's owner may rename it
        try:
            if os.lstat(child).st_uid in trusted:
                return None
        except OSError:
            return None
    who = "others" if mode & stat.S_IWOTH else f"its group (gid {info.st_gid})"
    return f"is writable by {who} (mode {mode:04o})"


def allow_other_filesystems(env: dict[str, str] | None = None) -> bool:
    raw = (os.environ if env is None else env).get(ALLOW_OTHER_FS_ENV, "").strip().lower()
    return raw in ("1", "true", "yes", "on")


class HeldRoot:
    """The workspace root as one `O_DIRECTORY` descriptor, opened once and held.

    A host opens it at start (`HostSurface` holds one), and every file call resolves beneath this
    descriptor, so renaming the root's path or replacing it with a symlink later changes
    nothing. If the root cannot be opened at start, each call tries again (and fails with the
    root's code); the first success is then held for the rest of the session.
    """

    def __init__(self, binding: AgentBinding) -> None:
        self.binding = binding
        self.path = binding.agent_root or ""
        self.fd = -1
        self.real = self.path  # the symlink-free spelling, as the kernel saw it at open
        self.dev = 0
        self.failure: ToolFailure | None = None
        self._open()

    def _open(self) -> None:
        try:
            fd = _open_root(self.binding)
        except ToolFailure as failure:
            self.failure = failure
            return
        self.fd, self.failure = fd, None
        self.dev = os.fstat(fd).st_dev
        try:
            self.real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            self.real = os.path.realpath(self.path)

    def descriptor(self) -> int:
        if self.fd < 0:
            self._open()
        if self.failure is not None:
            raise ToolFailure(self.failure.code, self.failure.message, self.failure.details)
        return self.fd

    def close(self) -> None:
        if self.fd >= 0:
            with suppress(OSError):
                os.close(self.fd)
            self.fd = -1


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
    # directories this call created, top down: (name, st_dev, st_ino); st_dev -1 when it was
    # made but could not be opened. `anchor_fd` is the existing directory the first was made in.
    made: list[tuple[str, int, int]] = field(default_factory=list)
    anchor_fd: int = -1

    @property
    def display(self) -> str:
        return os.path.join(self.root, *self.names)


class Walker:
    """Walks names from the held root descriptor; every hop `openat(..., O_NOFOLLOW)`.

    Holds only what the walk needs: the root, the directory it is in, and (for a download that
    creates parents) the existing directory the first new one was made in. Each directory is
    closed as soon as the next one is open, so depth costs no descriptors.
    """

    def __init__(self, binding: AgentBinding, given: str, root: HeldRoot | None = None) -> None:
        self.given = given
        self.owns_root = root is None
        self.held = HeldRoot(binding) if root is None else root
        self.root = self.held.path
        self.root_fd = self.held.descriptor()
        self.fds: list[int] = []  # descriptors this walk opened and still holds
        self.other_fs_allowed = allow_other_filesystems()
        # `ok.txt/` and `ok.txt/.` name a directory: the kernel would say "not a directory"
        self.wants_dir = given.endswith("/") or given.endswith("/.")

    def close(self) -> None:
        for fd in reversed(self.fds):
            with suppress(OSError):
                os.close(fd)
        self.fds.clear()
        if self.owns_root:
            self.held.close()

    def release(self, fd: int, *keep: int) -> None:
        """Close a directory the walk has moved past (never the root or one in `keep`)."""
        if fd == self.root_fd or fd in keep or fd not in self.fds:
            return
        self.fds.remove(fd)
        with suppress(OSError):
            os.close(fd)

    def names(self) -> list[str]:
        real = self.held.real
        return split_inside(self.given, self.root, real if real != self.root else None)

    def check_filesystem(self, info: os.stat_result, where: str) -> None:
        """Refuse a component on another file system than the root's, unless allowed."""
        if info.st_dev == self.held.dev or self.other_fs_allowed:
            return
        raise _fail(
            "path_other_filesystem",
            f"{self.given!r}: {where} is on another file system than the workspace root "
            f"{self.root} (something is mounted there); the file tools stay on the root's file "
            "system. Copy the file into the workspace proper, or the operator can set "
            f"{ALLOW_OTHER_FS_ENV}=1 to allow mounts inside the workspace",
            path=self.given,
            root=self.root,
            component=where,
            variable=ALLOW_OTHER_FS_ENV,
        )

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
            raise self.classify(exc, dir_fd, name, depth) from None
        self.fds.append(fd)
        self.check_filesystem(os.fstat(fd), "/".join([*depth, name]))
        return fd

    def classify(self, exc: OSError, dir_fd: int, name: str, depth: list[str]) -> ToolFailure:
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
                child = self.open_dir(fd, name, depth)
            except ToolFailure as failure:
                if failure.code == "path_not_found" and create_missing:
                    missing = names[index:-1]
                    break
                raise
            self.release(fd)
            fd = child
            depth.append(name)
        return Resolved(self.given, self.root, names, fd, names[-1], missing)

    def make_missing(self, resolved: Resolved) -> None:
        """Create the recorded missing parents (mode 0700), one `mkdirat` + `O_NOFOLLOW` open at
        a time, holding only the directory the first was made in and the current one."""
        resolved.anchor_fd = fd = resolved.parent_fd
        depth = resolved.names[: len(resolved.names) - 1 - len(resolved.missing)]
        for name in resolved.missing:
            made = False
            try:
                os.mkdir(name, 0o700, dir_fd=fd)
                made = True
            except FileExistsError:
                pass  # raced with another creator: the O_NOFOLLOW open below decides
            except OSError as exc:
                raise self.classify(exc, fd, name, depth) from None
            try:
                child = self.open_dir(fd, name, depth)
            except ToolFailure:
                if made:
                    resolved.made.append((name, -1, -1))
                raise
            if made:
                info = os.fstat(child)
                resolved.made.append((name, info.st_dev, info.st_ino))
            self.release(fd, resolved.anchor_fd)
            resolved.parent_fd = fd = child
            depth.append(name)
        resolved.missing = []

    def undo_made(self, resolved: Resolved) -> None:
        """Remove the directories this call made, deepest first, without holding one
        descriptor per level: each parent is reached by `..` from its child and accepted only
        if it is the very directory (device and inode) this call made there."""
        made = resolved.made
        fd = resolved.parent_fd
        index = len(made) - 1
        if index >= 0 and made[index][1] < 0:  # made, never opened: it is right under `fd`
            with suppress(OSError):
                os.rmdir(made[index][0], dir_fd=fd)
            index -= 1
        while index >= 0:
            name, dev, ino = made[index]
            if index == 0:
                parent = resolved.anchor_fd
            else:
                try:
                    parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    break
                self.fds.append(parent)
                info = os.fstat(parent)
                if (info.st_dev, info.st_ino) != made[index - 1][1:]:
                    break  # moved meanwhile: leave the rest alone
            try:
                now = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if (now.st_dev, now.st_ino) != (dev, ino):
                    break
                os.rmdir(name, dir_fd=parent)
            except OSError:
                break
            self.release(fd, resolved.anchor_fd)
            resolved.parent_fd = fd = parent
            index -= 1
        made.clear()


@contextmanager
def walker(binding: AgentBinding, given: str, root: HeldRoot | None = None) -> Iterator[Walker]:
    w = Walker(binding, given, root)
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
        raise w.classify(exc, resolved.parent_fd, resolved.leaf, depth) from None
    if stat.S_ISLNK(pre.st_mode):
        raise w.symlink_failure(resolved.parent_fd, resolved.leaf, depth)
    if w.wants_dir and not stat.S_ISDIR(pre.st_mode):
        raise _not_a_directory(w, "/".join(resolved.names))
    if not stat.S_ISREG(pre.st_mode):
        raise _not_regular(w, resolved.display, _kind(pre.st_mode))
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(resolved.leaf, flags, dir_fd=resolved.parent_fd)
    except OSError as exc:
        raise w.classify(exc, resolved.parent_fd, resolved.leaf, depth) from None
    w.fds.append(fd)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise _not_regular(w, resolved.display, _kind(info.st_mode))
    w.check_filesystem(info, "/".join(resolved.names))
    if info.st_nlink > 1:
        raise _fail(
            "path_hard_linked",
            f"{w.given!r} ({resolved.display}) has {info.st_nlink} hard links: another name, "
            "possibly outside the workspace, shares its bytes, so it is not uploaded. Make an "
            "independent copy inside the workspace (e.g. cp name name.copy) and upload the copy",
            path=w.given,
            root=w.root,
            links=info.st_nlink,
        )
    os.set_blocking(fd, True)
    return resolved, fd, info


def _not_a_directory(w: Walker, where: str) -> ToolFailure:
    return _fail(
        "path_not_a_directory",
        f"{w.given!r} ends with '/', which names a directory, but {where} is not a directory "
        "(the kernel would say 'not a directory'); drop the trailing '/' to name the file",
        path=w.given,
        root=w.root,
        component=where,
    )


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
    trailing = _fail(
        "destination_is_directory",
        f"{w.given!r} ends with '/', which names a directory; give a file path such as "
        "downloads/name.ext",
        path=w.given,
        root=w.root,
    )
    if resolved.missing:
        if w.wants_dir:
            raise trailing
        return
    try:
        info = os.stat(resolved.leaf, dir_fd=resolved.parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        if w.wants_dir:
            raise trailing from None
        return
    except OSError as exc:
        raise w.classify(exc, resolved.parent_fd, resolved.leaf, resolved.names[:-1]) from None
    if stat.S_ISLNK(info.st_mode):
        raise w.symlink_failure(resolved.parent_fd, resolved.leaf, resolved.names[:-1])
    if w.wants_dir and not stat.S_ISDIR(info.st_mode):
        raise _not_a_directory(w, "/".join(resolved.names))
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
    with walker(surface.binding, params.path, surface.workspace) as w:
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
        transfer = _transfer_segment(session.get("transfer_id"))
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
                f"/admin/files/transfer/{transfer}",
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
            f"/admin/files/transfer/{transfer}/complete",
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


def _transfer_segment(value: Any) -> str:
    """The center's transfer id as one quoted URL path segment, or `admin_protocol_error`.

    The id is data the host did not write: it must match the id grammar (so `..`, `a/b`,
    `T1?agent_id=agent-2` or a fragment can never change the route or the query), and it is
    percent-quoted as well, so no character of it is ever read as URL syntax."""
    if isinstance(value, str) and _TRANSFER_ID.fullmatch(value):
        return quote(value, safe="")
    shown = None if value is None else str(value)[:200]
    raise _fail(
        "admin_protocol_error",
        "the center opened no usable upload session: its transfer_id "
        + ("is missing" if value is None else f"{shown!r} is not a plain id")
        + " (letters, digits and . _ : ~ -, at most 128); nothing was sent. Retry once, then "
        "report it to the center's operators",
        transfer_id=shown,
    )


def _json_object(body: bytes, step: str) -> dict[str, Any]:
    import json

    try:
        value = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply to read
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
    with walker(surface.binding, params.dest_path, surface.workspace) as w:
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
                    await jobs.submit(_sweep_stale_parts, resolved.parent_fd, w.root)
                    temp, temp_fd = _create_temp(resolved.parent_fd)
                    size, sha256 = await _receive(response, temp_fd, cap, params.file, report, jobs)
            except ToolFailure as failure:
                raise _download_failure(failure, file_id) from None
            await jobs.submit(os.fsync, temp_fd)
            _place(w, resolved, temp, overwrite=params.overwrite)  # still locked: see _create_temp
            kept = True
            with suppress(OSError):
                os.fsync(resolved.parent_fd)
        except OSError as exc:
            raise _write_failed(w, exc) from None
        finally:
            await jobs.drain()  # no write may still run when the temp file goes
            if not kept and temp is not None:
                with suppress(OSError):  # removed while still locked, then closed
                    os.unlink(temp, dir_fd=resolved.parent_fd)
            if temp_fd >= 0:
                os.close(temp_fd)
            if not kept:
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


def _create_temp(dir_fd: int) -> tuple[str, int]:
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


def _sweep_stale_parts(dir_fd: int, root: str) -> list[str]:
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
