"""Black-box: the fleet page (`[page]`, page.py) in a real headless Chromium, on a real
`mcphost supervise` process against the real reference center.

The HTML itself holds the first table (the agents' rows, rendered by the server: no empty
"connecting" table first), with the very cells the page's script writes for the same snapshot.
The page is opened once, at 1280 px wide; it fits (no horizontal overflow, "last exit" a readable
column, not a letter per line); an agent is killed (SIGKILL) and the page, never reloaded, shows it
restarted with a new generation and its last exit, pushed over its server-sent event stream
(`/api/stream`: the page never polls `/api/fleet`). Neither the page's DOM nor any response or
stream message it received holds the worker token, a fleet-file secret (an agent's `env` value, the token file's
path) or what the agent printed (its log, a pane's contents). The screenshot is docs/operations.md's
(bench/results/fleet-page.png). Skipped, saying why, where Debian's chromium is not installed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from mcphost.supervisor.operator.page import agent_cells
from mcphost.testing.devcenter import DevCenter
from tests.supervisor.chromium_harness import Chromium, chromium_missing
from tests.supervisor.supervise_harness import REPO, Supervised, standin
from tests.waiting import until

# deep (make test-slow): a browser and a supervisor, ~20 s on two CPUs; operator/test_page.py is make test's.
pytestmark = pytest.mark.deep

SCREENSHOT = Path(REPO) / "bench" / "results" / "fleet-page.png"
WIDTH = 1280  # a laptop's browser window: the page fits it
FLEET_SECRET = "fleet-secret-0c4f9e"  # an agent's env value: the fleet file's, never the page's
PANE_MARKER = "pane-output-5b21d7"  # what the agent prints: its log's, never the page's
# Print the marker, then become the stand-in agent (its sessions held until SIGTERM).
PRINTS_THEN_HOLDS = (
    "import os, sys\n"
    f"print({PANE_MARKER!r}, flush=True)\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
)


def cell(browser: Chromium, agent: str, column: str) -> Any:
    return browser.evaluate(
        f'(document.querySelector(\'tr[data-agent="{agent}"] td[data-col="{column}"]\') '
        "|| {}).textContent || null"
    )


@pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))
def test_the_page_follows_a_kill_and_restart_live_and_shows_no_secret(
    supervised: Supervised, center: DevCenter
) -> None:
    supervised.write_fleet(
        [
            {
                "id": "builder",
                "command": [sys.executable, "-c", PRINTS_THEN_HOLDS, *standin("--hold")[1:]],
                "env": {"DEPLOY_KEY": FLEET_SECRET},
            },
            {"id": "reviewer", "command": standin("--hold")},
        ]
    )
    with supervised.fleet.open("a") as fleet:
        fleet.write('\n[page]\nlisten = "127.0.0.1:0"\n')
    supervised.start()
    url = next(
        e["url"] for e in supervised.events() if e.get("event") == "supervisor.page_listening"
    )
    until(lambda: supervised.status()["builder"]["state"] == "running", 60, "builder running")
    until(lambda: supervised.status()["reviewer"]["state"] == "running", 60, "reviewer running")
    first = supervised.status()["builder"]
    # the first paint is the fleet: the rows are in the HTML the server sends
    with urllib.request.urlopen(url, timeout=30) as reply:
        served = reply.read().decode()
    for agent in ("builder", "reviewer"):
        assert f'<tr data-agent="{agent}"><td data-col="agent">{agent}</td>' in served, served
    assert '<td data-col="state" class="running soft">running</td>' in served, served
    assert f'<td data-col="generation" class="num">{first["generation"]}</td>' in served
    browser = Chromium(width=WIDTH)
    try:
        browser.navigate(url)
        until(lambda: cell(browser, "builder", "state") == "running", 30, "the page's first rows")
        assert cell(browser, "builder", "generation") == str(first["generation"])
        browser.evaluate("window.notReloaded = true")
        # the server's cells are the script's: both written from one snapshot, compared
        snap, scripted = browser.evaluate(
            "(async () => { const s = await (await fetch('api/fleet')).json();"
            " return [JSON.stringify(s), s.agents.map((a) => [...agentRow(a, s.now).children]"
            ".map((c) => [c.dataset.col, c.textContent, c.className]))]; })()"
        )
        snap = json.loads(snap)
        assert [[list(c) for c in agent_cells(a, snap["now"])] for a in snap["agents"]] == (
            scripted
        )

        os.kill(first["pid"], signal.SIGKILL)
        until(
            lambda: (
                cell(browser, "builder", "generation") == str(first["generation"] + 1)
                and cell(browser, "builder", "state") == "running"
            ),
            60,
            "the page to show the new generation",
        )
        assert browser.evaluate("window.notReloaded === true")  # the same document all along
        navigations = [
            e for e in browser.events_named("Page.frameNavigated")
            if "parentId" not in e["params"]["frame"]
        ]  # fmt: skip
        assert len(navigations) == 1, navigations  # the page, loaded once
        assert cell(browser, "builder", "restarts") == "1"
        assert "signal 9" in (cell(browser, "builder", "exit") or "")
        # at 1280 px nothing overflows sideways, and "last exit" reads as words, not a letter
        # per line (issue #34); the limits and their hits have their columns
        fit = browser.evaluate(
            "(() => { const t = document.querySelector('#agents').closest('table');"
            " const e = document.querySelector('tr[data-agent=\"builder\"] td[data-col=exit]');"
            " const h = parseFloat(getComputedStyle(e).lineHeight);"
            " return {page: document.documentElement.scrollWidth, view: window.innerWidth,"
            " table: Math.ceil(t.getBoundingClientRect().right), exitWidth: e.clientWidth,"
            " exitLines: Math.round(e.getBoundingClientRect().height / h)}; })()"
        )
        assert fit["view"] == WIDTH and fit["page"] <= WIDTH, fit
        assert fit["table"] <= WIDTH, fit
        assert fit["exitWidth"] >= 180 and fit["exitLines"] <= 2, fit
        assert cell(browser, "builder", "hits") is not None
        assert cell(browser, "builder", "limits") is not None
        until(
            lambda: "supervisor.agent_exited" in browser.evaluate("$('events').textContent"),
            30,
            "the exit among the recent events",
        )
        assert cell(browser, "reviewer", "state") == "running"
        assert browser.evaluate("document.getElementById('center').textContent") == "ok"

        dom = browser.evaluate("document.documentElement.outerHTML")
        bodies = browser.bodies()
        # the page's updates came over its stream, pushed; its one fetch of /api/fleet is ours
        pushed = [
            e["params"]["data"] for e in browser.events_named("Network.eventSourceMessageReceived")
        ]
        assert any('"signal 9"' in data for data in pushed), pushed
        bodies += [("api/stream", data) for data in pushed]
        fetched = [
            e["params"]["request"]["url"]
            for e in browser.events_named("Network.requestWillBeSent")
        ]  # fmt: skip
        assert sum(u.endswith("/api/fleet") for u in fetched) == 1, fetched
        assert sum(u.endswith("/api/stream") for u in fetched) == 1, fetched
        log = (supervised.state / "logs" / "builder").glob("*")
        assert any(PANE_MARKER in p.read_text(errors="replace") for p in log if p.is_file())
        for secret in (center.token, FLEET_SECRET, PANE_MARKER, str(supervised.token_file)):
            assert secret not in dom
            for address, body in bodies:
                assert secret not in body, address
        browser.screenshot(SCREENSHOT)
    finally:
        browser.close()
