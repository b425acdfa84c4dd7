"""The supervisor's journal (mcphost/supervisor/operator/journal.py): the events sink's records in
`supervisor.log` (0600) and a bounded ring."""

from __future__ import annotations

import json
import logging
import stat
from pathlib import Path

from mcphost import events
from mcphost.binding import Secret
from mcphost.supervisor.agents.logs import tail
from mcphost.supervisor.operator import journal


def test_the_journal_writes_the_sinks_records_and_keeps_the_recent_ones(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    kept = journal.install(str(logs))
    try:
        events.emit("supervisor.agent_spawned", agent_id="a", pid=7, token=Secret("s3cret"))
        logging.getLogger("aiohttp.server").warning("a library's warning")
        logging.getLogger("aiohttp.server").info("chatter")  # below the libraries' threshold
    finally:
        kept.close()
    events.emit("supervisor.after_close")
    path = logs / journal.NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["event"] for r in records] == ["supervisor.agent_spawned", "log"]
    assert records[0]["pid"] == 7 and "s3cret" not in path.read_text()
    assert kept.recent() == records
    assert json.loads(tail(str(logs), 1, journal.NAME)) == records[-1]
    assert kept not in logging.getLogger().handlers


def test_the_ring_is_bounded_and_a_journal_that_cannot_open_keeps_it(tmp_path: Path) -> None:
    (tmp_path / journal.NAME).mkdir()  # an agent named `supervisor.log` has its logs there
    kept = journal.install(str(tmp_path))
    try:
        assert kept.log is None and kept.problem and "cannot open" in kept.problem
        for n in range(journal.RING + 10):
            events.emit("test.n", n=n)
    finally:
        kept.close()
    recent = kept.recent()
    assert len(recent) == journal.RING and recent[-1]["n"] == journal.RING + 9
    assert kept.recent(2) == recent[-2:]


def test_newest_gives_one_family_of_events_newest_first(tmp_path: Path) -> None:
    kept = journal.install(str(tmp_path))
    try:
        for n in range(5):
            events.emit("supervisor.tick", n=n)
            events.emit("relay.tick", n=n)
    finally:
        kept.close()
    newest = kept.newest(3, "supervisor.")
    assert [(r["event"], r["n"]) for r in newest] == [("supervisor.tick", n) for n in (4, 3, 2)]
    assert len(kept.newest(100)) == 10 and kept.newest(0) == []
