"""The fleet page's server (page.py), in process against a stand-in status source: it answers
GET and HEAD only (405 otherwise), its own loopback Host only (403: DNS rebinding), with a
strict Content-Security-Policy that allows exactly its inline style and script; its snapshot
carries only the allow-listed fields of the status rows, the center and the supervisor's events
(read from the journal's ring, journal.py: those from before the page opened too); the JSON is
built once per version of the status and of the journal, every poll in between served the same
bytes with its own `now`; on a Unix socket it answers any Host (a proxy's) and its event names
the socket, which the page does not show; and the supervisor imports it only when `[page]` is
set. The page in a real browser on a real supervisor: test_supervise_page.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp

from mcphost import events
from mcphost.supervisor.operator import journal
from mcphost.supervisor.operator.loopback import STREAM_PEER_FULL, STREAMS_PER_PEER
from mcphost.supervisor.operator.page import (
    CSP,
    PAGE,
    FleetPage,
    agent_cells,
    render_page,
    safe_event,
    safe_record,
    safe_row,
)
from mcphost.supervisor.values import Listen
from tests.waiting import eventually

SECRET = "tok-3b9f"


class Source:
    """`Operations.snapshot()` (its `version` and `status`) as a row could carry more than the
    page may show."""

    version = 1

    def snapshot(self, max_age: float = 5.0) -> Source:
        return self

    @property
    def status(self) -> dict[str, Any]:
        return {
            "center": {"state": "ok", "message": f"via {SECRET}", "checked_at": 1.0,
                       "fleet_key": None, "admin_url": SECRET},
            "agents": [
                {"agent_id": "a1", "state": "running", "generation": 3, "restarts": 1,
                 "pid": 42, "last_exit": "signal 9", "last_reason": "killed by SIGKILL",
                 "sessions": 2, "sandbox": "bwrap", "env": {"KEY": SECRET},
                 "uid": 1879048200, "identity": "shared",
                 "command": [SECRET], "fenced": {"code": "stale_generation", "generation": 3,
                                                 "note": SECRET},
                 "usage": {"memory_current_bytes": 1 << 20, "cpu_seconds": 1.5,
                           "processes": None, "label": SECRET, "oom_kills": 3,
                           "pids_limit_hits": 819},
                 "limits": {"memory_max": 64 << 20, "pids_max": None, "cpu_weight": 100,
                            "note": SECRET}},
            ],
        }  # fmt: skip


async def _exercise(logs: Path) -> dict[str, Any]:
    kept = journal.install(str(logs))
    events.emit("supervisor.reloaded", added=["a1"], message=SECRET)  # before the page
    page = FleetPage(Source(), Listen("127.0.0.1", 0), started_at=0.0, journal=kept)
    url = await page.start()
    out: dict[str, Any] = {"url": url}
    try:
        events.emit("supervisor.agent_exited", agent_id="a1", exit="signal 9", error=SECRET)
        events.emit("supervisor.started", state="/srv/state", fleet=f"/etc/{SECRET}.toml")
        events.emit("relay.delivered", agent_id="a1", body=SECRET)
        async with aiohttp.ClientSession() as http:
            for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
                for path in ("/", "/api/fleet", "/nowhere"):
                    async with http.request(method, url.rstrip("/") + path) as reply:
                        out.setdefault("refused", set()).add(reply.status)
                        out.setdefault("allow", set()).add(reply.headers.get("Allow"))
            async with http.get(url) as reply:
                out["html"], out["headers"] = await reply.text(), dict(reply.headers)
            async with http.head(url) as reply:
                out["head"] = reply.status
            async with http.get(url + "api/fleet") as reply:
                out["snapshot"] = await reply.json()
            async with http.get(url, headers={"Host": f"rebound.example:{url.split(':')[2]}"}) as r:
                out["rebound"] = r.status
    finally:
        await page.aclose()
        kept.close()
    return out


def test_the_page_is_read_only_answers_its_own_host_and_shows_only_allowed_fields(
    tmp_path: Path,
) -> None:
    out = asyncio.run(_exercise(tmp_path))
    assert out["refused"] == {405} and out["allow"] == {"GET,HEAD"}
    assert out["head"] == 200 and out["rebound"] == 403
    assert out["headers"]["Content-Security-Policy"] == CSP
    assert "http" not in CSP and "'unsafe-inline'" not in CSP and "default-src 'none'" in CSP
    assert "src=" not in PAGE and "href=" not in PAGE  # nothing loaded from anywhere
    snapshot = out["snapshot"]
    assert SECRET not in str(snapshot)
    [row] = snapshot["agents"]
    assert row["generation"] == 3 and row["last_reason"] == "killed by SIGKILL"
    assert row["identity"] == "shared" and "uid" not in row  # whose uid, not which
    assert '" (shared uid)"' in PAGE  # the fence cell says so (ctl status too)
    assert row["usage"] == {"memory_current_bytes": 1 << 20, "cpu_seconds": 1.5, "processes": None,
                            "oom_kills": 3, "pids_limit_hits": 819}  # fmt: skip
    assert row["limits"] == {"memory_max": 64 << 20, "pids_max": None, "cpu_weight": 100}
    # the first paint: the agents' table already in the HTML, the cells the script writes
    page = out["html"]
    assert SECRET not in page and "src=" not in page and "href=" not in page
    assert '<tr data-agent="a1"><td data-col="agent">a1</td>' in page, page
    assert '<td data-col="limits" class="num">64 MiB / max</td>' in page
    assert '<td data-col="hits" class="num">3 / 819</td>' in page
    assert '<td data-col="exit" class="wrap">signal 9: killed by SIGKILL</td>' in page
    assert '<b id="counts">1 running</b>' in page and "@" not in page.split("<script>")[0]
    assert row["fenced"]["code"] == "stale_generation" and "note" not in row["fenced"]
    assert snapshot["center"] == {"state": "ok", "checked_at": 1.0, "fleet_key": None}
    names = [e["event"] for e in snapshot["events"]]
    assert names[:2] == ["supervisor.started", "supervisor.agent_exited"]  # newest first
    assert names[-1] == "supervisor.reloaded" and snapshot["events"][-1]["added"] == ["a1"]
    assert "relay.delivered" not in names  # the supervisor's own events only
    assert "state" not in snapshot["events"][0]  # a directory, not a state word


def test_the_first_paint_escapes_what_it_shows_and_writes_the_scripts_cells() -> None:
    """An agent's texts reach the HTML escaped; the cells are those of the script's `agentRow`
    (the browser test compares the two on a real fleet: test_supervise_page.py)."""
    snap = {
        "now": 1000.0, "supervisor": {"started_at": 0.0}, "center": None, "events": [],
        "agents": [
            {"agent_id": "<b>x</b>", "state": "running", "started_at": 808.0, "generation": 2,
             "last_reason": '"quoted" & <tagged>', "fenced": {"code": "stale", "generation": 2},
             "usage": {"cpu_seconds": 1.25, "memory_current_bytes": 3 << 29},
             "limits": None},
        ],
    }  # fmt: skip
    page = render_page(snap)
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page
    assert "&quot;quoted&quot; &amp; &lt;tagged&gt;" in page
    assert '<b id="center" class="unknown">not known yet</b>' in page
    cells = {col: (text, cls) for col, text, cls in agent_cells(snap["agents"][0], 1000.0)}
    assert cells["state"] == ("running, fenced (stale)", "fenced soft")
    assert cells["up"] == ("3m12s", "num")
    assert cells["cpu"] == ("1.3 s", "num")  # as toFixed(1) rounds a tie: away from zero
    assert cells["memory"] == ("1.5 GiB / -", "num")
    assert cells["limits"] == ("-", "num") and cells["hits"] == ("- / -", "num")


def test_the_page_on_a_unix_socket_is_served_with_any_host_and_says_where(
    tmp_path: Path,
) -> None:
    """`[page] listen = "unix:..."` (the one form `[metrics]` takes too): a proxy in front of it
    may send its own `Host` (no browser reaches the socket); the event names the socket, and the
    page's own view of that event leaves its path out (no paths on the page)."""
    path = str(tmp_path / "page.sock")

    async def run() -> tuple[str | None, bytes]:
        kept = journal.install(str(tmp_path))
        page = FleetPage(Source(), Listen(path=path), started_at=0.0, journal=kept)
        try:
            url = await page.start()
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(b"GET /api/fleet HTTP/1.0\r\nHost: proxy.example\r\n\r\n")
            reply = await reader.read()
            writer.close()
            [listening] = kept.newest(1, "supervisor.page_listening")
            assert listening["listen"] == f"unix:{path}" and listening["url"] is None
            shown = safe_record(listening)
            assert "listen" not in shown and path not in str(shown)
            return url, reply
        finally:
            await page.aclose()
            kept.close()

    url, reply = asyncio.run(run())
    assert url is None
    assert reply.startswith(b"HTTP/1.0 200") or reply.startswith(b"HTTP/1.1 200"), reply
    assert b'"agent_id": "a1"' in reply


def test_the_json_is_built_once_per_change_and_every_poll_has_its_own_time(
    tmp_path: Path,
) -> None:
    kept = journal.install(str(tmp_path))
    try:
        source = Source()
        page = FleetPage(source, Listen("127.0.0.1", 0), started_at=0.0, journal=kept)
        first = json.loads(page.body())
        second = json.loads(page.body())
        assert page.builds == 1  # nothing changed: the same bytes
        assert second["now"] >= first["now"] and first["agents"] == second["agents"]
        assert {k: v for k, v in first.items() if k != "now"} == {
            k: v for k, v in second.items() if k != "now"
        }
        source.version = 2  # a new snapshot (a state, a count, a usage sample)
        page.body()
        assert page.builds == 2
        events.emit("supervisor.agent_exited", agent_id="a1", exit="signal 9")
        shown = json.loads(page.body())
        assert page.builds == 3 and shown["events"][0]["event"] == "supervisor.agent_exited"
        page.body()
        assert page.builds == 3
    finally:
        kept.close()


def test_the_allow_lists() -> None:
    row = safe_row({"agent_id": "a", "state": "failed", "extra": 1})
    assert row["state"] == "failed" and row["pid"] is None and "extra" not in row
    event = safe_event("supervisor.center_health", "error", 1.0, {"state": "down", "message": "x"})
    assert event == {
        "ts": 1.0,
        "level": "error",
        "event": "supervisor.center_health",
        "state": "down",
    }
    record = {"ts": 2.0, "level": "info", "event": "supervisor.x", "pid": 1, "path": "/p"}
    assert safe_record(record) == {"ts": 2.0, "level": "info", "event": "supervisor.x", "pid": 1}
    limits = safe_event(
        "supervisor.limits", "info", 1.0, {"reason": "cgroup v1 (/sys/fs/cgroup/pids)", "a": 1}
    )
    assert "reason" not in limits  # a path, even inside a sentence
    listening = safe_event("supervisor.page_listening", "info", 1.0, {"url": "http://[::1]:1/"})
    assert listening["url"] == "http://[::1]:1/"
    long = safe_event("supervisor.x", "info", 1.0, {"reason": "r" * 1000, "agents": ["a", {}]})
    assert len(long["reason"]) == 300 and long["agents"] == ["a"]


def test_the_supervisor_imports_the_page_only_when_it_is_set() -> None:
    code = (
        "import sys, mcphost.supervisor.supervisor, mcphost.supervisor.cli\n"
        "print('mcphost.supervisor.operator.page' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


async def _next_event(reply: aiohttp.ClientResponse) -> dict[str, Any]:
    """The next `data:` message of a server-sent event stream, parsed."""
    while True:
        line = await asyncio.wait_for(reply.content.readline(), 30)
        assert line, "the stream ended"
        if line.startswith(b"data: "):
            return dict(json.loads(line[len(b"data: ") :]))


def test_the_stream_pushes_a_change_when_the_journal_grows_and_only_then(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        kept = journal.install(str(tmp_path))
        source = Source()
        page = FleetPage(source, Listen("127.0.0.1", 0), started_at=0.0, journal=kept)
        url = await page.start()
        try:
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"{url}api/stream") as reply,
            ):
                assert reply.status == 200
                assert reply.headers["Content-Type"].startswith("text/event-stream")
                assert reply.headers["Content-Security-Policy"] == CSP
                first = await _next_event(reply)  # the fleet now, at once
                assert first["agents"][0]["generation"] == 3
                # a state change: a new snapshot and its event; pushed without a poll
                source.version = 2
                events.emit("supervisor.agent_exited", agent_id="a1", exit="signal 9")
                pushed = await _next_event(reply)
                assert pushed["events"][0]["event"] == "supervisor.agent_exited"
                assert SECRET not in json.dumps(pushed)
                # a record that changes nothing shown (not a supervisor event, same
                # snapshot) is not sent again
                pushes, builds = page.pushes, page.builds
                events.emit("relay.delivered", agent_id="a1")
                await eventually(lambda: page.builds > builds, "the stream looked again")
                assert page.pushes == pushes
                events.emit("supervisor.reloaded", added=[])
                again = await _next_event(reply)
                assert again["events"][0]["event"] == "supervisor.reloaded"
                assert page.pushes == pushes + 1
            await eventually(lambda: not page._streams, "the stream dropped when it left")
        finally:
            await page.aclose()
            kept.close()

    asyncio.run(run())


def test_a_client_holding_many_streams_is_bounded_and_the_page_still_answers(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        kept = journal.install(str(tmp_path))
        page = FleetPage(Source(), Listen("127.0.0.1", 0), started_at=0.0, journal=kept)
        url = await page.start()
        server = page._server
        assert server is not None
        try:
            async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=True)
            ) as http:
                held = []
                for _ in range(STREAMS_PER_PEER):
                    reply = await http.get(f"{url}api/stream")
                    assert reply.status == 200
                    await _next_event(reply)
                    held.append(reply)
                refused = []
                for _ in range(3):  # one uid asks for more: refused at once, nothing held
                    async with http.get(f"{url}api/stream") as reply:
                        refused.append(reply.status)
                        assert reply.headers.get("Retry-After") == "30"
                assert refused == [429, 429, 429]
                assert server.refused.get(STREAM_PEER_FULL) == 3
                assert server.streams.open == STREAMS_PER_PEER
                async with http.get(f"{url}api/fleet") as reply:  # the page still answers
                    assert reply.status == 200
                for reply in held:  # the streams leave: their places are free again
                    reply.close()
                await eventually(lambda: server.streams.open == 0, "the streams released")
                await eventually(lambda: not page._streams, "the page's streams dropped")
                async with http.get(f"{url}api/stream") as reply:
                    assert reply.status == 200
                    await _next_event(reply)
        finally:
            await page.aclose()
            kept.close()

    asyncio.run(run())
