"""The supervisor's own events, where `ctl logs --supervisor` and the fleet page (page.py) read
them: `<state>/logs/supervisor.log` and a bounded ring of the recent ones in memory.

Owns: `Journal`, a `logging` handler installed on the root logger beside the events sink
(mcphost/events.py) for the supervisor's life (`install` ... `close`): each record the sink
writes (the same threshold: the `mcphost` logger's `MCPHOST_LOG_LEVEL`, other libraries' at
warning and above), formatted by the sink's own `JsonFormatter`, is appended to a `RotatingLog`
(logs.py: 0600 in the supervisor's logs directory, `<state>/logs/`, rotated at `MAX_BYTES`,
`KEEP` old files) and kept in the ring (`RING` lines; `recent()` gives them as records, oldest
first; `newest()` the newest of one family of events, newest first: the fleet page's list;
`version` counts the records kept, so a reader rebuilds what it made of the ring only when it
grew; `on_record`, a callable run after each record is kept: the page's streams wake on it
instead of polling the version).

An agent's logs live in `<state>/logs/<id>/`; an agent named `supervisor.log` is the one
that cannot have them (its home fails, that agent only).

Must never: raise from `emit` (a journal that cannot write says so once, as an event, and keeps
the ring), hold more than `RING` records, or write anything the events sink would not: events
carry no secret (events.py's rule), so neither does the journal.
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from collections.abc import Callable
from typing import Any

from mcphost import events
from mcphost.supervisor.agents.logs import RotatingLog

NAME = "supervisor.log"
MAX_BYTES = 4 << 20
KEEP = 3
RING = 500


class Journal(logging.Handler):
    """The file and the ring (module doc). Build with `install`."""

    def __init__(self, directory: str, *, max_bytes: int = MAX_BYTES, keep: int = KEEP) -> None:
        super().__init__()
        self.setFormatter(events.JsonFormatter())
        self.directory = directory
        self.ring: deque[str] = deque(maxlen=RING)
        self.version = 0  # records kept in the ring, ever
        # run after each record kept (any thread: a record may be logged from one); must not raise
        self.on_record: Callable[[], None] | None = None
        self.problem: str | None = None
        self.log: RotatingLog | None = None
        try:
            self.log = RotatingLog(directory, NAME, max_bytes=max_bytes, keep=keep)
        except OSError as exc:
            self.problem = f"cannot open {os.path.join(directory, NAME)}: {exc.strerror}"

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # a record that cannot be formatted: the sink says nothing either
            return
        self.ring.append(line)
        self.version += 1
        if self.on_record is not None:
            self.on_record()
        if self.log is None:
            return
        try:
            self.log.write(line.encode("utf-8", "replace") + b"\n")
        except OSError as exc:
            self.log = None  # said once below; the ring goes on
            self.problem = f"cannot write {os.path.join(self.directory, NAME)}: {exc.strerror}"
            events.emit("supervisor.journal_failed", level="error", problem=self.problem)

    def handleError(self, record: logging.LogRecord) -> None:
        pass  # never a traceback on stderr

    def recent(self, limit: int = RING) -> list[dict[str, Any]]:
        """The last `limit` records, oldest first."""
        lines = list(self.ring)[-limit:] if limit > 0 else []
        return [json.loads(line) for line in lines]

    def newest(self, limit: int, prefix: str = "") -> list[dict[str, Any]]:
        """The newest `limit` records whose `event` starts with `prefix`, newest first (only as
        many lines are parsed as it takes to find them)."""
        out: list[dict[str, Any]] = []
        for line in reversed(list(self.ring)):  # a copy: `emit` may append meanwhile
            if len(out) >= limit:
                break
            record = json.loads(line)
            if str(record.get("event", "")).startswith(prefix):
                out.append(record)
        return out

    def close(self) -> None:
        logging.getLogger().removeHandler(self)
        if self.log is not None:
            self.log.close()
            self.log = None
        super().close()


def install(logs_dir: str) -> Journal:
    """The journal of the supervisor whose logs directory is `logs_dir`, receiving every record
    from now on; `close()` it at the end."""
    journal = Journal(logs_dir)
    logging.getLogger().addHandler(journal)
    if journal.problem is not None:
        events.emit("supervisor.journal_failed", level="error", problem=journal.problem)
    return journal
