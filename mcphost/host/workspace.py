"""Workspace containment: model-given paths resolved beneath one held root descriptor.

Owns: the held workspace root (`HeldRoot`), the path grammar (`split_inside`: lexical, pure),
the descriptor walk (`Walker`: every hop `openat(..., O_NOFOLLOW)` from the held root), what
an upload may read (`open_for_upload`) and a download may replace (`check_destination`), the
failures of both (`FileFailure`, with stable `path_*` / `destination_*` / `workspace_root_*`
codes), and `workspace_problem()` / `root_ancestor_warnings()` for `mcphost check`.

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
   place) changes nothing for a running host. Under the supervisor the root is not even
   opened by path: each session gets a duplicate of the workspace descriptor the supervisor
   opened when it prepared the agent's home (`HeldRoot(binding, fd)`). Each name is then opened
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
5. What a download creates (parents, then the file) belongs to the root's owner: a host running
   as root on a root another uid owns (the supervisor serving a `user = ...` agent) `fchown`s
   each on its open descriptor (`HeldRoot.owner`, `Walker.give_away`).
6. The walk holds only the root, the directory it is in and, when a download creates parents,
   the directory the first one was made in: depth costs no descriptors. Undoing created
   parents climbs by `..`, accepting each parent only if it is the directory (dev, inode) made.

This is `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` done by hand, since Python exposes no
`openat2`. The root itself is operator configuration and is opened normally (its own path may
contain symlinks). A path ending in `/` or `/.` names a directory: on a file it is
`path_not_a_directory`, as the kernel would say.

Must never: follow a symlink under the root, reopen the root by its path once held (nor ever,
when it was given as a descriptor), open a model-given path string relative to the process's
working directory, or hand out a hard-linked upload leaf. It moves no bytes and talks to no center (`mcphost.host.transfer`,
`mcphost.host.files`).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from mcphost.binding import AgentBinding
from mcphost.errors import FileFailure, PathNotFound, WorkspaceRootUnset

ALLOW_OTHER_FS_ENV = "MCPHOST_ALLOW_OTHER_FILESYSTEMS"
MAX_PATH_BYTES = 4096
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


# -- failures -------------------------------------------------------------------------------


def file_failure(code: str, message: str, **details: Any) -> FileFailure:
    return FileFailure(code, message, details)


def _escapes(given: str, root: str, why: str) -> FileFailure:
    return file_failure(
        "path_escapes_workspace",
        f"{given!r} is outside the workspace {root} ({why}); give a path inside the "
        "workspace, relative to it or absolute under it",
        path=given,
        root=root,
        reason=why,
    )


def _invalid(given: str, root: str, why: str) -> FileFailure:
    return file_failure(
        "path_invalid",
        f"{given!r} is not a usable path ({why}); give a plain file path inside the workspace "
        f"{root}",
        path=given,
        root=root,
        reason=why,
    )


def workspace_problem(binding: AgentBinding) -> FileFailure | None:
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

    With `fd` (an `O_DIRECTORY` descriptor the caller opened and hands over, e.g. a dup of the
    workspace the supervisor holds), the root is that directory and is never opened by path:
    `binding.agent_root` is then only how it is shown. The supervisor serves a session of an
    agent running as another user this way, so a root the agent swapped is never followed.
    """

    def __init__(self, binding: AgentBinding, fd: int | None = None) -> None:
        self.binding = binding
        self.path = binding.agent_root or ""
        self.fd = -1
        self.real = self.path  # the symlink-free spelling, as the kernel saw it at open
        self.dev = 0
        self.owner: tuple[int, int] | None = None  # see `_hold`
        self.failure: FileFailure | None = None
        self.by_path = fd is None  # False: the root is the descriptor given, never reopened
        if fd is None:
            self._open()
        else:
            self._hold(fd)

    def _open(self) -> None:
        try:
            fd = _open_root(self.binding)
        except FileFailure as failure:
            self.failure = failure
            return
        self._hold(fd)

    def _hold(self, fd: int) -> None:
        self.fd, self.failure = fd, None
        info = os.fstat(fd)
        self.dev = info.st_dev
        # A root host serving a workspace another uid owns (the supervisor, for a `user = ...`
        # agent) gives what a download creates there to that owner; None: keep our own.
        self.owner = (info.st_uid, info.st_gid) if os.geteuid() == 0 and info.st_uid != 0 else None
        try:
            self.real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            self.real = os.path.realpath(self.path)

    def descriptor(self) -> int:
        if self.fd < 0 and self.by_path:
            self._open()
        elif self.fd < 0:
            raise file_failure(
                "workspace_root_closed",
                "this session's workspace root was closed (the session is ending); start a new "
                "session to use the file tools",
                root=self.path,
            )
        if self.failure is not None:
            raise self.failure.again()
        return self.fd

    def close(self) -> None:
        if self.fd >= 0:
            with suppress(OSError):
                os.close(self.fd)
            self.fd = -1


def _open_root(binding: AgentBinding) -> int:
    root = binding.agent_root
    if not root:
        raise WorkspaceRootUnset(
            "workspace_root_unset",
            "the file tools need a workspace root and this host has none: the operator must "
            "set AC_MCP_AGENT_ROOT to the agent's workspace directory",
            {"variable": "AC_MCP_AGENT_ROOT"},
        )
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise file_failure(
            "workspace_root_missing",
            f"the workspace root {root} (AC_MCP_AGENT_ROOT) does not exist; the operator must "
            "create it or fix the variable",
            root=root,
            variable="AC_MCP_AGENT_ROOT",
        ) from None
    except OSError as exc:
        raise file_failure(
            "workspace_root_unusable",
            f"the workspace root {root} (AC_MCP_AGENT_ROOT) cannot be opened as a directory "
            f"({exc.strerror}); the operator must fix it",
            root=root,
            variable="AC_MCP_AGENT_ROOT",
            reason=errno.errorcode.get(exc.errno or 0, "unknown"),
        ) from None


# -- lexical layer (pure) -------------------------------------------------------------------


def split_inside(given: str, root: str, real_root: str | None = None) -> list[str]:
    """The names leading from `root` to `given`, or a `FileFailure`. Pure.

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
        raise file_failure(
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

    def link_failure(self, dir_fd: int, name: str, depth: list[str]) -> FileFailure | None:
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
        return file_failure(
            "path_through_symlink",
            f"{self.given!r} goes through the symlink {where} (-> {target}); the file tools "
            "never follow symlinks. Give the real path inside the workspace instead",
            path=self.given,
            root=self.root,
            symlink=where,
        )

    def symlink_failure(self, dir_fd: int, name: str, depth: list[str]) -> FileFailure:
        """The failure for a component seen as a symlink, even if it changed since."""
        link = self.link_failure(dir_fd, name, depth)
        if link is not None:
            return link
        where = "/".join([*depth, name])
        return file_failure(
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
            except FileFailure:
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

    def classify(self, exc: OSError, dir_fd: int, name: str, depth: list[str]) -> FileFailure:
        try:  # one lstat decides, so a name flipping again cannot confuse the verdict
            now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except OSError:
            now = 0
        if stat.S_ISLNK(now):
            return self.symlink_failure(dir_fd, name, depth)
        where = "/".join([*depth, name])
        if exc.errno == errno.ENOENT:
            return PathNotFound(
                "path_not_found",
                f"{self.given!r} does not exist in the workspace {self.root} ({where} is "
                "missing); check the path (relative paths start at the workspace root)",
                {"path": self.given, "root": self.root, "missing": where},
            )
        if exc.errno in (errno.ENOTDIR, errno.ELOOP) and stat.S_ISDIR(now):
            return file_failure(
                "path_changed",
                f"{self.given!r}: {where} was replaced while it was being resolved (it was not "
                "a plain directory when opened, e.g. a symlink was swapped in); nothing was "
                "touched. Retry once the workspace is stable",
                path=self.given,
                root=self.root,
                component=where,
            )
        if exc.errno == errno.ENOTDIR:
            return file_failure(
                "path_not_a_directory",
                f"{self.given!r}: {where} is not a directory, so nothing can be under it",
                path=self.given,
                root=self.root,
                component=where,
            )
        if exc.errno in (errno.EACCES, errno.EPERM):
            return file_failure(
                "path_permission_denied",
                f"{self.given!r}: permission denied on {where}",
                path=self.given,
                root=self.root,
            )
        if exc.errno == errno.ENAMETOOLONG:
            return _invalid(self.given, self.root, "a name is too long")
        if exc.errno == errno.ELOOP:
            return self.symlink_failure(dir_fd, name, depth)
        return file_failure(
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
            except PathNotFound:
                if not create_missing:
                    raise
                missing = names[index:-1]
                break
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
            except FileFailure:
                if made:
                    resolved.made.append((name, -1, -1))
                raise
            if made:
                info = os.fstat(child)
                resolved.made.append((name, info.st_dev, info.st_ino))
                self.give_away(child)
            self.release(fd, resolved.anchor_fd)
            resolved.parent_fd = fd = child
            depth.append(name)
        resolved.missing = []

    def give_away(self, fd: int) -> None:
        """`fchown` what this walk created (open as `fd`) to the root's owner, when the root
        is another uid's (`HeldRoot.owner`); nothing otherwise."""
        if self.held.owner is not None:
            os.fchown(fd, *self.held.owner)

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
        raise file_failure(
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


def _not_a_directory(w: Walker, where: str) -> FileFailure:
    return file_failure(
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


def _not_regular(w: Walker, shown: str, kind: str) -> FileFailure:
    return file_failure(
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
        raise file_failure(
            "destination_is_directory",
            f"{w.given!r} is the workspace root; give a file path such as downloads/name.ext",
            path=w.given,
            root=w.root,
        )
    trailing = file_failure(
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
        raise file_failure(
            "destination_is_directory",
            f"{w.given!r} ({resolved.display}) is a directory; give a file path inside it, "
            "e.g. <dir>/<name>",
            path=w.given,
            root=w.root,
        )
    if not stat.S_ISREG(info.st_mode):
        raise file_failure(
            "destination_not_regular_file",
            f"{w.given!r} ({resolved.display}) is a {_kind(info.st_mode)}; it will not be "
            "replaced, choose another destination",
            path=w.given,
            root=w.root,
        )
    if not overwrite:
        raise destination_exists(w, resolved)


def destination_exists(w: Walker, resolved: Resolved) -> FileFailure:
    return file_failure(
        "destination_exists",
        f"{w.given!r} ({resolved.display}) already exists and was left untouched; pass "
        "overwrite: true to replace it, or choose another dest_path",
        path=w.given,
        root=w.root,
    )
