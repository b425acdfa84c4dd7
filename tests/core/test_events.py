"""`mcphost.events`: our JSON event records and every library's stdlib `logging` records share
one sink (stderr, or `MCPHOST_LOG_FILE`), in one JSON shape; stdout stays empty."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

SCRIPT = """
import logging
from mcphost import events
events.emit("test.ours", answer=42)
events.emit("test.quiet", level="debug")
logging.getLogger("aiohttp.server").warning("from %s", "aiohttp")
logging.getLogger("mcp.server.lowlevel").info("chatter: below warning")
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("mcp.server").exception("boom")
"""


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def _records(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


def test_library_records_reach_the_log_file_as_json_beside_ours(tmp_path: Path) -> None:
    log = tmp_path / "events.log"
    done = _run({"MCPHOST_LOG_FILE": str(log)})
    assert done.stdout == "" and done.stderr == ""
    records = _records(log.read_text())
    assert [r["event"] for r in records] == ["test.ours", "log", "log"]
    ours, aiohttp, failed = records
    assert set(ours) == {"ts", "level", "event", "answer"}
    assert ours["level"] == "info" and ours["answer"] == 42
    assert aiohttp["logger"] == "aiohttp.server" and aiohttp["message"] == "from aiohttp"
    assert aiohttp["level"] == "warning"
    assert failed["level"] == "error" and "ZeroDivisionError" in str(failed["error"])
    assert (log.stat().st_mode & 0o777) == 0o600


def test_the_level_filters_library_records_too() -> None:
    done = _run({"MCPHOST_LOG_LEVEL": "error"})
    assert done.stdout == ""
    assert [(r["event"], r.get("logger")) for r in _records(done.stderr)] == [("log", "mcp.server")]


def test_library_chatter_stays_out_even_at_debug() -> None:
    done = _run({"MCPHOST_LOG_LEVEL": "debug"})
    assert done.stdout == ""
    events = [(r["event"], r.get("logger")) for r in _records(done.stderr)]
    assert events == [
        ("test.ours", None),
        ("test.quiet", None),
        ("log", "aiohttp.server"),
        ("log", "mcp.server"),
    ]


def test_rate_limit_admits_a_burst_per_window_and_counts_the_rest() -> None:
    from mcphost.events import RateLimit

    limit = RateLimit(1, 10.0)
    assert limit.admit(100.0) and limit.take_suppressed() == 0
    assert [limit.admit(t) for t in (100.1, 105.0, 109.9)] == [False, False, False]
    assert limit.admit(110.0)  # a new window
    assert limit.take_suppressed() == 3 and limit.take_suppressed() == 0


def test_emit_limited_writes_one_line_then_carries_what_it_left_out(monkeypatch: Any) -> None:
    from mcphost import events

    lines: list[dict[str, Any]] = []
    monkeypatch.setattr(events, "emit", lambda event, level="info", **f: lines.append(f))
    clock = iter([0.0, 1.0, 2.0, 20.0])
    monkeypatch.setattr(events, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    limit = events.RateLimit(1, events.LOG_EVERY_SECONDS)
    wrote = [events.emit_limited(limit, "x.failed", errno="EMFILE") for _ in range(4)]
    assert wrote == [True, False, False, True]
    assert lines == [{"suppressed": 0, "errno": "EMFILE"}, {"suppressed": 2, "errno": "EMFILE"}]


def test_asyncio_accept_failures_become_one_bounded_line(monkeypatch: Any) -> None:
    import asyncio
    import errno

    from mcphost import events

    lines: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(events, "emit", lambda event, level="info", **f: lines.append((event, f)))
    others: list[dict[str, Any]] = []
    loop = asyncio.new_event_loop()
    try:
        loop.set_exception_handler(lambda _, context: others.append(context))
        events.bound_accept_errors(loop)
        failure = OSError(errno.EMFILE, "Too many open files")
        for _ in range(128):  # one readiness event: asyncio reports once per backlog slot
            loop.call_exception_handler(
                {"message": events.ACCEPT_OUT_OF_RESOURCE, "exception": failure}
            )
        loop.call_exception_handler({"message": "something else"})
    finally:
        loop.close()
    assert lines == [("supervisor.accept_out_of_resource", {"suppressed": 0, "errno": 24})]
    assert others == [{"message": "something else"}]
