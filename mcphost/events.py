"""Structured event records: one JSON object per line, to stderr (default) or an append-only file;
or, for a person at a terminal, one readable line each (`use_format`).

Owns: the process's diagnostic sink, on stdlib `logging`: `emit` logs through the `mcphost`
logger, and one handler on the root logger writes every record as a JSON line, so the records
of the libraries beneath us (aiohttp, the MCP SDK, `logging.getLogger(...)` anywhere) reach the
same sink as ours: at `warning` and above (their debug and info records are chatter, such as
asyncio's "Using selector" or aiohttp's access lines), and never below `MCPHOST_LOG_LEVEL`.
`MCPHOST_LOG_LEVEL` (debug|info|warning|error, default info) filters;
`MCPHOST_LOG_FILE` redirects to a file (both read by `mcphost.tuning`). Every record has `ts`,
`level`, `event`; ours carry the fields `emit` was given, another library's carry `logger` and
`message` (and `error`, a formatted exception, when it logged one) under event `log`.
`use_format("text")` (`mcphost supervise --log-format`, "auto" on a terminal) writes the same
records as termtext.py's lines (`21:40:02 info  agent.started  alpha generation=3`: control
characters made visible); the JSON object (`JsonFormatter`) is the one shape every other reader
gets.

Bounded lines: `RateLimit` (pure) and `emit_limited` write at most a burst of lines per window
for an event anything outside can cause as often as it likes (accept failures, refused
connections); the next line written carries `suppressed`, the count left out since the last.
`bound_accept_errors` routes asyncio's own accept failures (`socket.accept() out of system
resource`, a traceback per backlog slot on EMFILE) through one such limit.

Must never: write to stdout (that belongs to JSON-RPC), raise from `emit`, or receive a secret:
callers pass redacted values only, and `Secret` objects render as `***`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from typing import Any, TextIO

from mcphost.termtext import event_line
from mcphost.tuning import LEVELS, tuning

# A line anything outside can cause as often as it likes (an accept that fails for want of
# descriptors, a refused connection): at most one per this many seconds and kind (`emit_limited`).
LOG_EVERY_SECONDS = 10.0
LIBRARY_LEVEL = logging.WARNING  # what other libraries' records must reach to be written
_NAMES = {10: "debug", 20: "info", 30: "warning", 40: "error", 50: "critical"}
_FIELDS = "mcphost_fields"  # the attribute of a record that `emit` made


class JsonFormatter(logging.Formatter):
    """One JSON object per record: `ts`, `level`, `event`, then the event's fields."""

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        """The record as the JSON object holds it (`ts`, `level`, `event`, its fields)."""
        ts = round(record.created, 6)
        ours = getattr(record, _FIELDS, None)
        if ours is not None:
            level, fields = ours
            return {"ts": ts, "level": level, "event": record.msg, **fields}
        level = _NAMES.get(record.levelno) or record.levelname.lower()
        out = {"ts": ts, "level": level, "event": "log", "logger": record.name}
        out["message"] = record.getMessage()
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return out

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(self.fields(record), default=str, ensure_ascii=False)


class TextFormatter(JsonFormatter):
    """The same record as one line for people (termtext.py's `event_line`: local time, level,
    event, agent, `key=value`; control characters made visible)."""

    def format(self, record: logging.LogRecord) -> str:
        return event_line(json.loads(super().format(record)))


class _Sink(logging.Handler):
    """stderr, or the `MCPHOST_LOG_FILE` opened on the first record (0600, append)."""

    def __init__(self, path: str | None) -> None:
        super().__init__()
        self.path = path
        self._file: TextIO | None = None

    def stream(self) -> TextIO:
        if self.path is None:
            return sys.stderr
        if self._file is None:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._file = os.fdopen(fd, "a", encoding="utf-8", buffering=1)
        return self._file

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = self.stream()
            stream.write(self.format(record) + "\n")
            stream.flush()
        except (OSError, ValueError):
            pass

    def handleError(self, record: logging.LogRecord) -> None:
        pass  # a diagnostic sink that cannot write says nothing (never a traceback on stderr)


def _install() -> tuple[logging.Logger, int]:
    settings = tuning()
    threshold = LEVELS[settings.log_level]
    root = logging.getLogger()
    if not any(isinstance(h, _Sink) for h in root.handlers):
        sink = _Sink(settings.log_file)
        sink.setFormatter(JsonFormatter())
        root.addHandler(sink)
    root.setLevel(max(threshold, LIBRARY_LEVEL))
    logger = logging.getLogger("mcphost")
    logger.setLevel(threshold)
    return logger, threshold


_logger, _threshold = _install()
FORMATS = ("auto", "json", "text")


def use_format(kind: str) -> str:
    """Write the sink's records as `kind`: "json", "text" (termtext.py's lines, for people), or
    "auto": text when the sink is a terminal (stderr is a tty and no `MCPHOST_LOG_FILE`), JSON
    otherwise (a file, a pipe, journald). The format chosen; a file or ring that another
    handler keeps (the supervisor's journal) stays JSON."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, _Sink):
            if kind == "auto":
                kind = "text" if handler.path is None and _isatty(sys.stderr) else "json"
            handler.setFormatter(TextFormatter() if kind == "text" else JsonFormatter())
    return kind


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError):
        return False


def fields_of(record: logging.LogRecord) -> tuple[str, dict[str, Any]] | None:
    """The level and fields `emit` gave `record` (None: another library's record), for a handler
    of our own on the `mcphost` logger (the fleet page's recent events)."""
    ours = getattr(record, _FIELDS, None)
    return ours if isinstance(ours, tuple) else None


def enabled(level: str) -> bool:
    return LEVELS.get(level, 20) >= _threshold


def emit(event: str, level: str = "info", **fields: Any) -> None:
    """Write one event record if `level` passes the threshold. Never raises."""
    if not enabled(level):
        return
    ours = (level, fields)
    record = _logger.makeRecord(
        _logger.name, LEVELS.get(level, 20), "", 0, event, (), None, extra={_FIELDS: ours}
    )
    _logger.handle(record)


class RateLimit:
    """At most `burst` admitted in each fixed window of `window` seconds (pure: the caller
    gives the time); what is not admitted is counted in `suppressed` until taken."""

    def __init__(self, burst: int, window: float) -> None:
        self.burst = burst
        self.window = window
        self.suppressed = 0
        self._start = -math.inf
        self._admitted = 0

    def admit(self, now: float) -> bool:
        if now - self._start >= self.window:
            self._start, self._admitted = now, 0
        if self._admitted < self.burst:
            self._admitted += 1
            return True
        self.suppressed += 1
        return False

    def window_ends(self) -> float:
        """When the current window ends (the time `admit` was given)."""
        return self._start + self.window

    def take_suppressed(self) -> int:
        count, self.suppressed = self.suppressed, 0
        return count


def emit_limited(limit: RateLimit, event: str, level: str = "warning", **fields: Any) -> bool:
    """`emit` when `limit` admits one more line now, with `suppressed` (the lines left out
    since the last one written); True when it wrote."""
    if not limit.admit(time.monotonic()):
        return False
    emit(event, level, suppressed=limit.take_suppressed(), **fields)
    return True


ACCEPT_OUT_OF_RESOURCE = "socket.accept() out of system resource"  # asyncio's own message


def bound_accept_errors(loop: Any) -> None:
    """Route asyncio's `socket.accept() out of system resource` (an `asyncio.start_server`'s or
    `start_unix_server`'s accept on EMFILE/ENFILE: a traceback each, once per backlog slot) to one
    `supervisor.accept_out_of_resource` line per `LOG_EVERY_SECONDS`; every other exception the
    loop reports goes where it went."""
    previous = loop.get_exception_handler()
    limit = RateLimit(1, LOG_EVERY_SECONDS)

    def handler(loop: Any, context: dict[str, Any]) -> None:
        if context.get("message") == ACCEPT_OUT_OF_RESOURCE:
            error = context.get("exception")
            code = getattr(error, "errno", None)
            emit_limited(limit, "supervisor.accept_out_of_resource", "error", errno=code)
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
