"""Writing a config file privately and atomically; reading the one to merge into.

Owns: the on-disk contract. A config is written to a temporary file in the target's directory
(created 0600, exclusive), flushed and fsynced, renamed over the target, and the directory is
fsynced (`mcphost.fsutil.write_atomic`, the one atomic write); a reader sees the old file or
the new one, never half of one. The target is never a symlink: writing "through" a link would put a token wherever the link points.
Must never: follow a symlink at the target, widen a file's mode, or leave a temp file behind.
"""

from __future__ import annotations

import os
import stat

from configgen.model import ConfigError
from mcphost import fsutil


def write_private(path: str, data: bytes) -> None:
    """Atomically replace `path` with `data`, mode 0600. Refuses symlinks and non-files."""
    target = os.path.abspath(path)
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        info = None
    if info is not None:
        if stat.S_ISLNK(info.st_mode):
            raise ConfigError(
                "out", f"{path} is a symlink; refusing to write through it (give the real path)"
            )
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError("out", f"{path} exists and is not a regular file")
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise ConfigError("out", f"the directory of {path} does not exist")
    fsutil.write_atomic(target, data)


def read_existing(path: str) -> bytes:
    """The config to merge into; a missing file reads as empty (the first run creates it)."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return b""
    except IsADirectoryError:
        raise ConfigError("merge", f"{path} is a directory") from None
    except OSError as exc:
        raise ConfigError("merge", f"cannot read {path}: {exc.strerror}") from None
