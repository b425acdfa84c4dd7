"""Black-box: the Prometheus endpoint of a real `mcphost supervise` under load (issue #27 part 3).

One supervisor with `[metrics] listen = "unix:..."` runs five agents: the bundle `party` in real
tmux (A, B: echo agents, A with the policy `lead`), `w1` and `w2` (stand-ins holding their
sessions after one center call each: w1 `get_my_work`, w2 a tool the catalog does not have,
named with a marker), and `w3` (a plain stand-in). A sends B messages holding a marker through
its relay tools. The test scrapes the endpoint over its socket and parses the text with
prometheus_client's parser:
- every family docs/operations.md lists is there, with the labels it names; every `agent` label
  is a fleet id; the center calls are counted by catalog tool and outcome (`get_my_work` / `not_found`,
  `unknown` / `unknown_tool`), with a latency histogram; the relay's deliveries by outcome;
  the supervisor's own `process_*`;
- no label value holds the worker token, the message text or the unknown tool's name;
- values move: a `kill -9` of w1 increments its `mcphost_agent_restarts_total` and its
  generation, and the next scrape shows it.
A second case: a listen address something already holds refuses the start with a line naming
`[metrics] listen`.

Conditions only (`until`), no sleeps.
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mcphost.supervisor.operator.metrics import NAMES
from mcphost.testing.devcenter import DevCenter
from tests.supervisor.agents.test_relayhost import POLICIES, drive, echo_agent
from tests.supervisor.supervise_harness import Supervised, toml_value
from tests.waiting import until

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

BODY_MARK = "body-zqx-4711"  # in every message A sends: never in a label
TOOL_MARK = "no_such_tool_qvx"  # the tool w2 calls: not in the catalog, never in a label
AGENTS = ("A", "B", "w1", "w2", "w3")
LABELS = {  # family -> its labels (besides the histogram's `le`)
    "mcphost_agent_state": {"agent", "state"},
    "mcphost_agent_restarts": {"agent"},
    "mcphost_agent_generation": {"agent"},
    "mcphost_agent_sessions": {"agent"},
    "mcphost_agent_fence_info": {"agent", "fence"},
    "mcphost_center_up": set(),
    "mcphost_center_calls": {"tool", "outcome"},
    "mcphost_center_call_duration_seconds": {"tool"},
    "mcphost_relay_deliveries": {"outcome"},
    "mcphost_relay_queue_depth": set(),
}


SUFFIXES = ("_total", "_count", "_sum", "_bucket")


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=60)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(60)
        self.sock.connect(self.path)


def scrape(path: str) -> tuple[str, dict[str, Any]]:
    """The endpoint's text and its families by name (the parser's)."""
    conn = UnixHTTP(path)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        text = response.read().decode()
        assert response.status == 200, (response.status, text)
        assert response.getheader("Content-Type", "").startswith("text/plain"), response.headers
    finally:
        conn.close()
    return text, {family.name: family for family in text_string_to_metric_families(text)}


def sample(families: dict[str, Any], name: str, **labels: str) -> float | None:
    """The value of sample `name` (a family's name, or it with `_total`, `_count`, ...) with
    `labels`."""
    family = families.get(name) or next(
        (
            families[name.removesuffix(end)]
            for end in SUFFIXES
            if name.removesuffix(end) in families
        ),
        None,
    )
    if family is None:
        return None
    for each in family.samples:
        if each.name == name and all(each.labels.get(k) == v for k, v in labels.items()):
            return float(each.value)
    return None


@pytest.fixture(scope="module")
def metered(tmp_path_factory: pytest.TempPathFactory, center: DevCenter) -> Iterator[Any]:
    base = tmp_path_factory.mktemp("metrics")
    sv = Supervised(base, center)
    xdg = Path(tempfile.mkdtemp(prefix="mcphost-xdg-"))
    (xdg / "agentmux").mkdir()
    (xdg / "agentmux" / "policies.toml").write_text(POLICIES)
    sv.extra_env["XDG_CONFIG_HOME"] = str(xdg)
    sv.extra_env["AGENTMUX_CONFIGURATION_DIRECTORY"] = ""
    sockdir = Path(tempfile.mkdtemp(prefix="mcphost-m-"))
    party = {"bundle": "party", "runner": "tmux", "restart": "always"}
    sv.write_fleet(
        [
            {"id": "A", "command": echo_agent("A"), "policy": "lead", **party},
            {"id": "B", "command": echo_agent("B"), **party},
            {"id": "w1", "command": sv.standin("--hold")},
            {"id": "w2", "command": sv.standin("--call", TOOL_MARK, "--hold")},
            {"id": "w3", "command": sv.standin("--hold")},
        ]
    )
    path = str(sockdir / "metrics.sock")
    with sv.fleet.open("a") as fleet:
        fleet.write(f"\n[metrics]\nlisten = {toml_value('unix:' + path)}\n")
    try:
        sv.start()
        for agent in AGENTS:
            sv.wait_running(agent)
        yield sv, path
    finally:
        sv.close()
        shutil.rmtree(xdg, ignore_errors=True)
        shutil.rmtree(sockdir, ignore_errors=True)
        shutil.rmtree(sv.state, ignore_errors=True)


def test_a_scrape_under_load_names_every_family_and_no_secret(metered: Any) -> None:
    sv, path = metered
    assert os.stat(path).st_mode & 0o777 == 0o660
    until(lambda: sv.calls("w1") and sv.calls("w2"), 60, "w1 and w2 to call the center")
    sent = drive(
        sv,
        [
            {"tool": "send", "args": {"targets": ["B"], "message": f"{BODY_MARK} {n}"}}
            for n in range(3)
        ],
    )
    assert all(not result.get("isError") for result in sent), sent

    def delivered() -> tuple[str, dict[str, Any]] | None:
        text, families = scrape(path)
        count = sample(families, "mcphost_relay_deliveries_total", outcome="delivered")
        return (text, families) if count is not None and count >= 3 else None

    text, families = until(delivered, 60, "three deliveries in the scrape")
    for name, labels in LABELS.items():
        assert name in families, (name, sorted(families))
        for each in families[name].samples:
            assert set(each.labels) - {"le"} == labels, (name, each)
    documented = {name.removesuffix("_total") for name in NAMES}
    assert documented <= set(families), documented - set(families)
    assert "process_resident_memory_bytes" in families
    assert sample(families, "process_cpu_seconds_total") is not None
    # per agent: every agent id, and only those, in `agent`
    seen = {s.labels["agent"] for f in families.values() for s in f.samples if "agent" in s.labels}
    assert seen == set(AGENTS), seen
    for agent in AGENTS:
        assert sample(families, "mcphost_agent_state", agent=agent, state="running") == 1
        assert sample(families, "mcphost_agent_state", agent=agent, state="failed") == 0
        assert (sample(families, "mcphost_agent_generation", agent=agent) or 0) >= 1
    assert (sample(families, "mcphost_agent_sessions", agent="w1") or 0) >= 1
    assert sample(families, "mcphost_center_up") == 1
    # the center calls: by catalog tool and outcome, the unknown one as `unknown`
    # (the reference center has no work for these agents: get_my_work ends `not_found`)
    calls = {
        (s.labels["tool"], s.labels["outcome"]): s.value
        for s in families["mcphost_center_calls"].samples
    }
    assert calls.get(("get_my_work", "not_found"), 0) >= 2, calls  # w1 and w3
    unknown = sample(families, "mcphost_center_calls_total", tool="unknown", outcome="unknown_tool")
    assert unknown == 1, unknown
    count = sample(families, "mcphost_center_call_duration_seconds_count", tool="get_my_work")
    assert count is not None and count >= 2
    assert sample(families, "mcphost_relay_queue_depth") is not None
    # nothing secret or chosen by a client in any label
    values = [v for f in families.values() for s in f.samples for v in s.labels.values()]
    for secret in (sv.center.token, BODY_MARK, TOOL_MARK):
        assert not any(secret in value for value in values), secret
        assert secret not in text, secret


def test_a_restart_moves_the_agents_figures(metered: Any) -> None:
    sv, path = metered
    before = sv.wait_running("w1")
    _, families = scrape(path)
    restarts = sample(families, "mcphost_agent_restarts_total", agent="w1")
    generation = sample(families, "mcphost_agent_generation", agent="w1")
    assert restarts is not None and generation is not None
    os.kill(before["pid"], signal.SIGKILL)
    sv.wait_running("w1", generation=before["generation"] + 1)

    def moved() -> dict[str, Any] | None:
        _, families = scrape(path)
        later = sample(families, "mcphost_agent_restarts_total", agent="w1")
        return families if later == restarts + 1 else None

    families = until(moved, 60, "w1's restarts_total to move")
    assert sample(families, "mcphost_agent_generation", agent="w1") == generation + 1


def test_a_listen_address_in_use_refuses_the_start(tmp_path: Path, center: DevCenter) -> None:
    sv = Supervised(tmp_path, center)
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    try:
        port = held.getsockname()[1]
        sv.write_fleet([{"id": "w", "command": sv.standin("--hold")}])
        with sv.fleet.open("a") as fleet:
            fleet.write(f'\n[metrics]\nlisten = "127.0.0.1:{port}"\n')
        done = sv.run_to_exit()
    finally:
        held.close()
        shutil.rmtree(sv.state, ignore_errors=True)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert f"[metrics] listen = '127.0.0.1:{port}' cannot be served" in done.stderr, done.stderr
