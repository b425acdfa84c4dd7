"""Inscriptions: agentmux-style structured event records, one JSON object per line, in a file.

Owns: the record shape `{"timestamp": RFC3339 UTC, "pid", "event", "details"}`, the file path
(`<root>/bundles/<bundle>/sessions/<session>/mcp.log`, or `<root>/mcp/unassociated.log`; path
segments sanitised to `[A-Za-z0-9._-]`, empty -> `unknown`), directories 0700, the file 0600,
and one `O_APPEND` write per record so concurrent writers never interleave.

Must never: raise (a logging failure must not fail a tool call), write to stdout, or receive a
secret (callers pass lengths and flags, never message bodies or PSKs).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def sanitize(segment: str | None) -> str:
    cleaned = _UNSAFE.sub("_", segment or "")
    return cleaned or "unknown"


def log_path(root: Path, bundle: str | None, session: str | None) -> Path:
    if bundle and session:
        return root / "bundles" / sanitize(bundle) / "sessions" / sanitize(session) / "mcp.log"
    return root / "mcp" / "unassociated.log"


def _timestamp() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"


def _make_private_dirs(directory: Path) -> None:
    """Create `directory` and any missing parents with mode 0700 (existing ones are left alone)."""
    missing = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        path.mkdir(mode=0o700, exist_ok=True)


class Inscriptions:
    """An append-only JSON-lines sink; opened lazily on the first record."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._fd: int | None = None
        self._broken = path is None

    def write(self, event: str, **details: Any) -> None:
        if self._broken:
            return
        record = {
            "timestamp": _timestamp(),
            "pid": os.getpid(),
            "event": event,
            "details": details,
        }
        data = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode()
        try:
            if self._fd is None:
                assert self.path is not None
                _make_private_dirs(self.path.parent)
                self._fd = os.open(
                    self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600
                )
            os.write(self._fd, data)
        except OSError:
            self._broken = True

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
