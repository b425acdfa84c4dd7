"""Structured event records: one JSON object per line, to stderr (default) or an append-only file.

Owns: the process's diagnostic sink. `MCPHOST_LOG_LEVEL` (debug|info|warning|error, default
info) filters; `MCPHOST_LOG_FILE` redirects to a file. Every record has `ts`, `level`, `event`.
Must never: write to stdout (that belongs to JSON-RPC), or receive a secret: callers pass
redacted values only, and `Secret` objects render as `***`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, TextIO

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


class _Sink:
    def __init__(self) -> None:
        self.threshold = _LEVELS.get(os.environ.get("MCPHOST_LOG_LEVEL", "info").lower(), 20)
        self.path = os.environ.get("MCPHOST_LOG_FILE") or None
        self._file: TextIO | None = None

    def stream(self) -> TextIO:
        if self.path is None:
            return sys.stderr
        if self._file is None:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._file = os.fdopen(fd, "a", encoding="utf-8", buffering=1)
        return self._file


_sink = _Sink()


def enabled(level: str) -> bool:
    return _LEVELS.get(level, 20) >= _sink.threshold


def emit(event: str, level: str = "info", **fields: Any) -> None:
    """Write one event record if `level` passes the threshold. Never raises."""
    if not enabled(level):
        return
    record = {"ts": round(time.time(), 6), "level": level, "event": event, **fields}
    try:
        stream = _sink.stream()
        stream.write(json.dumps(record, default=str, ensure_ascii=False) + "\n")
        stream.flush()
    except (OSError, ValueError):
        pass
