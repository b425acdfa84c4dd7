"""The metrics module: the families of a status, the center calls, the server, and its cost.

- `FleetText` of a status (the rows `Operations.snapshot()` gives, with and without the usage
  figures another module adds, the limits and the times they were met) and `relay_families` of the relay's figures, read back with
  prometheus_client's parser: names, labels, values; a figure that is None or absent is left
  out, never shown as 0; an agent that left is gone from the next scrape; the text is what
  prometheus_client's `generate_latest` writes for the same families, and a scrape formats
  the fleet again only for a new snapshot version, each agent's lines only when its row
  changed.
- `Metrics.center_call`: by tool and outcome (a code that is not code-shaped is `other`), a
  histogram by tool.
- `MetricsServer` over a real Unix socket: `GET /metrics` only, mode 0660, the socket gone
  after close; over loopback TCP: its own address (or `localhost` at its port) answered as
  `Host`, any other refused 403, as the page's (DNS rebinding: `values.Listen.answers`).
- Nothing of prometheus_client or aiohttp's server is imported by the supervisor's modules or the
  per-agent host path while metrics are off (a fresh interpreter's `sys.modules`).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mcphost.supervisor.agents.states import AgentState
from mcphost.supervisor.operator.metrics import (
    NAMES,
    FleetText,
    Metrics,
    MetricsServer,
    RelayFigures,
    outcome_label,
    relay_families,
)
from mcphost.supervisor.values import Listen


class Families:
    """Metric families as a collector (what `generate_latest` renders)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


class Snapshots:
    """`Operations.snapshot` over a list of statuses: each call the next one, a new version."""

    def __init__(self, statuses: list[Mapping[str, Any]]) -> None:
        self.statuses = statuses
        self.version = 0

    def __call__(self) -> Snapshots:
        if self.statuses:
            self.status = self.statuses.pop(0)
            self.version += 1
        return self


def row(agent: str, **over: Any) -> dict[str, Any]:
    base = {
        "agent_id": agent,
        "state": "running",
        "pid": 42,
        "generation": 3,
        "restarts": 2,
        "sessions": 1,
        "sandbox": "landlock+bwrap",
        "fenced": None,
    }
    return {**base, **over}


def by_name(status: Mapping[str, Any], relay: RelayFigures | None = None) -> dict[str, Any]:
    text = FleetText().text(status) + generate_latest(Families(relay_families(relay))).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def values(family: Any) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples}


def test_an_agents_row_becomes_its_series() -> None:
    usage = {"memory_current_bytes": 1 << 20, "memory_peak_bytes": 2 << 20, "cpu_seconds": 1.5,
             "oom_kills": 4, "pids_limit_hits": 819}  # fmt: skip
    limits = {"memory_max": 64 << 20, "pids_max": 512, "cpu_weight": 100}
    agent = row("a1", usage={**usage, "processes": 3}, limits=limits)
    status = {"center": {"state": "ok"}, "agents": [agent]}
    got = by_name(status, RelayFigures(outcomes={"delivered": 5, "failed": 1}, queued=2))
    state = values(got["mcphost_agent_state"])
    assert state[(("agent", "a1"), ("state", "running"))] == 1
    assert sum(state.values()) == 1 and len(state) == 6  # one series per state
    assert values(got["mcphost_agent_restarts"]) == {(("agent", "a1"),): 2}
    assert got["mcphost_agent_restarts"].samples[0].name == "mcphost_agent_restarts_total"
    assert values(got["mcphost_agent_generation"]) == {(("agent", "a1"),): 3}
    assert values(got["mcphost_agent_sessions"]) == {(("agent", "a1"),): 1}
    assert values(got["mcphost_agent_fence_info"]) == {
        (("agent", "a1"), ("fence", "landlock+bwrap")): 1
    }
    assert values(got["mcphost_agent_memory_bytes"]) == {(("agent", "a1"),): 1 << 20}
    assert values(got["mcphost_agent_memory_peak_bytes"]) == {(("agent", "a1"),): 2 << 20}
    assert values(got["mcphost_agent_cpu_seconds"]) == {(("agent", "a1"),): 1.5}
    assert values(got["mcphost_agent_processes"]) == {(("agent", "a1"),): 3}
    # the limits and the times the agent met them (issue #34: nothing to alert on before)
    assert got["mcphost_agent_oom_kills"].type == "counter"
    assert values(got["mcphost_agent_oom_kills"]) == {(("agent", "a1"),): 4}
    assert got["mcphost_agent_pids_limit_hits"].type == "counter"
    assert values(got["mcphost_agent_pids_limit_hits"]) == {(("agent", "a1"),): 819}
    assert values(got["mcphost_agent_memory_max_bytes"]) == {(("agent", "a1"),): 64 << 20}
    assert values(got["mcphost_agent_pids_max"]) == {(("agent", "a1"),): 512}
    assert values(got["mcphost_center_up"]) == {(): 1}
    assert values(got["mcphost_relay_deliveries"]) == {
        (("outcome", "delivered"),): 5,
        (("outcome", "failed"),): 1,
    }
    assert values(got["mcphost_relay_queue_depth"]) == {(): 2}
    exposed = {
        name + ("_total" if got[name].type == "counter" else "") for name in got
    }  # the names as scraped
    assert exposed == set(NAMES) - {
        "mcphost_center_calls_total",
        "mcphost_center_call_duration_seconds",
    }


def test_unknown_figures_are_left_out_never_zero() -> None:
    unstarted = row("gone", state="failed", generation=None, sandbox=None, sessions=0)
    no_usage = row("a1")  # before the usage figures exist (another module adds them)
    partial = row(
        "a2",
        usage={"memory_current_bytes": None, "cpu_seconds": 0.25, "oom_kills": None},
        limits={"memory_max": None, "pids_max": 64, "cpu_weight": 100},  # no memory limit
    )
    status = {"center": {"state": "admin_unreachable"}, "agents": [unstarted, no_usage, partial]}
    got = by_name(status, None)
    assert (("agent", "gone"),) not in values(got["mcphost_agent_generation"])
    assert not any(dict(k)["agent"] == "gone" for k in values(got["mcphost_agent_fence_info"]))
    assert values(got["mcphost_agent_memory_bytes"]) == {}
    assert values(got["mcphost_agent_cpu_seconds"]) == {(("agent", "a2"),): 0.25}
    assert values(got["mcphost_agent_oom_kills"]) == {}  # no group: nothing counted, not 0
    assert values(got["mcphost_agent_memory_max_bytes"]) == {}  # `max`: no limit, no series
    assert values(got["mcphost_agent_pids_max"]) == {(("agent", "a2"),): 64}
    assert values(got["mcphost_center_up"]) == {(): 0}
    assert values(got["mcphost_relay_deliveries"]) == {}  # no relay served
    assert values(got["mcphost_relay_queue_depth"]) == {(): 0}
    assert by_name({"center": None, "agents": []})["mcphost_center_up"].samples[0].value == 0


@pytest.mark.parametrize(
    ("code", "label"),
    [("ok", "ok"), ("stale_generation", "stale_generation"), ("Bad Code!", "other"),
     ("x" * 65, "other"), ("", "other"), ("tok_" + "a" * 60, "tok_" + "a" * 60)],
)  # fmt: skip
def test_outcome_labels_are_codes_or_other(code: str, label: str) -> None:
    assert outcome_label(code) == label


def test_the_fleets_text_is_what_prometheus_client_writes_for_the_same_families() -> None:
    odd = 'we"ird\\ id\n'  # every character the text format escapes in a label value
    usage = {"memory_current_bytes": 123456789012, "memory_peak_bytes": None, "cpu_seconds": 1.25,
             "oom_kills": 2, "pids_limit_hits": 0}  # fmt: skip
    limits = {"memory_max": 1 << 30, "pids_max": 512, "cpu_weight": 100}
    rows = [
        row(odd, usage=usage, limits=limits),
        row("a2", state="failed", generation=None, sandbox=None),
    ]
    status = {"center": {"state": "ok"}, "agents": rows}
    names = [
        ("mcphost_agent_state", "gauge", ["agent", "state"]),
        ("mcphost_agent_restarts", "counter", ["agent"]),
        ("mcphost_agent_generation", "gauge", ["agent"]),
        ("mcphost_agent_sessions", "gauge", ["agent"]),
        ("mcphost_agent_fence_info", "gauge", ["agent", "fence"]),
        ("mcphost_agent_memory_bytes", "gauge", ["agent"]),
        ("mcphost_agent_memory_peak_bytes", "gauge", ["agent"]),
        ("mcphost_agent_cpu_seconds", "counter", ["agent"]),
        ("mcphost_agent_processes", "gauge", ["agent"]),
        ("mcphost_agent_oom_kills", "counter", ["agent"]),
        ("mcphost_agent_pids_limit_hits", "counter", ["agent"]),
        ("mcphost_agent_memory_max_bytes", "gauge", ["agent"]),
        ("mcphost_agent_pids_max", "gauge", ["agent"]),
        ("mcphost_center_up", "gauge", []),
    ]
    made: dict[str, Any] = {}
    for name, kind, labels in names:
        family = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
        shown = name + ("_total" if kind == "counter" else "")
        made[name] = family(name, NAMES[shown], labels=labels)
    for r in rows:
        agent = r["agent_id"]
        for state in AgentState:
            made["mcphost_agent_state"].add_metric([agent, state.value], state == r["state"])
        made["mcphost_agent_restarts"].add_metric([agent], r["restarts"])
        if r["generation"] is not None:
            made["mcphost_agent_generation"].add_metric([agent], r["generation"])
        made["mcphost_agent_sessions"].add_metric([agent], r["sessions"])
        if r["sandbox"] is not None:
            made["mcphost_agent_fence_info"].add_metric([agent, r["sandbox"]], 1)
    made["mcphost_agent_memory_bytes"].add_metric([odd], 123456789012)
    made["mcphost_agent_cpu_seconds"].add_metric([odd], 1.25)
    made["mcphost_agent_oom_kills"].add_metric([odd], 2)
    made["mcphost_agent_pids_limit_hits"].add_metric([odd], 0)
    made["mcphost_agent_memory_max_bytes"].add_metric([odd], 1 << 30)
    made["mcphost_agent_pids_max"].add_metric([odd], 512)
    made["mcphost_center_up"].add_metric([], 1)
    expected = generate_latest(Families(list(made.values()))).decode()
    assert FleetText().text(status) == expected


def test_a_scrape_formats_the_fleet_once_per_version_and_an_agent_only_when_it_changed() -> None:
    first = {"center": {"state": "ok"}, "agents": [row("a1"), row("a2")]}
    second = {"center": {"state": "ok"}, "agents": [row("a1"), row("a2", restarts=3)]}
    snapshots = Snapshots([first])
    metrics = Metrics(snapshots, lambda: None)
    one = metrics.exposition()
    assert metrics.fleet.formatted == 2 and b'restarts_total{agent="a2"} 2.0' in one
    again = metrics.exposition()  # the same version: the same fleet text, nothing formatted
    assert metrics.fleet.formatted == 2
    assert again.split(b"# HELP process_")[0] == one.split(b"# HELP process_")[0]
    snapshots.statuses.append(second)
    two = metrics.exposition()  # a new version: only the agent whose row changed
    assert metrics.fleet.formatted == 3 and b'restarts_total{agent="a2"} 3.0' in two
    assert b'restarts_total{agent="a1"} 2.0' in two


def scrape(metrics: Metrics) -> dict[str, Any]:
    text = metrics.exposition().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_center_calls_by_tool_and_outcome_with_latency_and_rows_per_scrape() -> None:
    statuses: list[Mapping[str, Any]] = [
        {"center": {"state": "ok"}, "agents": [row("a1"), row("a2")]},
        {"center": {"state": "ok"}, "agents": [row("a2")]},
    ]
    metrics = Metrics(Snapshots(statuses), lambda: None)
    metrics.center_call("a1", "get_my_work", "ok", 0.02)
    metrics.center_call("a2", "get_my_work", "ok", 0.2)
    metrics.center_call("a2", "get_my_work", "Not A Code", 3.0)
    first = scrape(metrics)
    assert values(first["mcphost_center_calls"]) == {
        (("outcome", "ok"), ("tool", "get_my_work")): 2,
        (("outcome", "other"), ("tool", "get_my_work")): 1,
    }
    histogram = {
        (s.name, s.labels.get("le")): s.value
        for s in first["mcphost_center_call_duration_seconds"].samples
    }
    assert histogram[("mcphost_center_call_duration_seconds_count", None)] == 3
    assert histogram[("mcphost_center_call_duration_seconds_bucket", "0.025")] == 1
    assert histogram[("mcphost_center_call_duration_seconds_bucket", "+Inf")] == 3
    assert "process_resident_memory_bytes" in first
    assert not any(name.endswith("_created") for name in first)
    agents = {s.labels["agent"] for s in first["mcphost_agent_state"].samples}
    assert agents == {"a1", "a2"}
    second = scrape(metrics)  # a1 left: gone from the next scrape
    assert {s.labels["agent"] for s in second["mcphost_agent_state"].samples} == {"a2"}
    assert metrics.scrapes == 2 and metrics.last_scrape_seconds > 0


def test_the_server_answers_get_metrics_only_on_a_private_socket() -> None:
    directory = tempfile.mkdtemp(prefix="mcphost-mt-")
    path = os.path.join(directory, "m.sock")

    snapshots = Snapshots([{"center": None, "agents": [row("a1")]}])

    async def run() -> tuple[bytes, bytes, int]:
        server = MetricsServer(Metrics(snapshots, lambda: None), Listen(path=path))
        await server.start()
        try:
            mode = os.stat(path).st_mode & 0o777

            async def get(target: str) -> bytes:
                reader, writer = await asyncio.open_unix_connection(path)
                writer.write(f"GET {target} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
                data = await reader.read()
                writer.close()
                return data

            return await get("/metrics"), await get("/"), mode
        finally:
            await server.aclose()

    try:
        metrics, other, mode = asyncio.run(run())
    finally:
        gone = not os.path.exists(path)
        os.rmdir(directory)
    assert metrics.startswith(b"HTTP/1.0 200") or metrics.startswith(b"HTTP/1.1 200"), metrics
    assert b'mcphost_agent_state{agent="a1",state="running"} 1.0' in metrics
    assert b" 404 " in other.split(b"\r\n")[0], other
    assert mode == 0o660
    assert gone


def test_the_server_answers_its_own_loopback_host_only() -> None:
    """A site elsewhere whose name was rebound to 127.0.0.1 reads no figure of the fleet."""
    snapshots = Snapshots([{"center": None, "agents": [row("a1")]}])

    async def run() -> dict[str, bytes]:
        server = MetricsServer(Metrics(snapshots, lambda: None), Listen("127.0.0.1", 0))
        await server.start()
        try:
            assert server.server is not None and server.server.bound is not None
            bound = server.server.bound
            assert bound.port != 0  # the port the kernel chose, which the event names

            async def get(host: str) -> bytes:
                reader, writer = await asyncio.open_connection(bound.host, bound.port)
                writer.write(f"GET /metrics HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
                data = await reader.read()
                writer.close()
                return data

            hosts = {
                "own": str(bound),
                "localhost": f"LOCALHOST:{bound.port}",  # in any case
                "rebound": f"rebound.example:{bound.port}",
                "no port": "127.0.0.1",
                "other loopback": f"127.0.0.2:{bound.port}",
                "none": "",
            }
            return {name: await get(host) for name, host in hosts.items()}
        finally:
            await server.aclose()

    replies = asyncio.run(run())
    status = {name: reply.split(b"\r\n")[0].split()[1] for name, reply in replies.items()}
    assert status == {
        "own": b"200", "localhost": b"200", "rebound": b"403", "no port": b"403",
        "other loopback": b"403", "none": b"403",
    }, status  # fmt: skip
    assert b"mcphost_agent_state" in replies["own"]
    assert b"mcphost_agent_state" not in replies["rebound"]


def test_nothing_imports_prometheus_while_metrics_are_off() -> None:
    code = (
        "import sys\n"
        "import mcphost.supervisor.cli, mcphost.supervisor.supervisor, mcphost.host.server\n"
        "import mcphost.attach\n"
        "bad = [m for m in sys.modules if m.startswith('prometheus_client')\n"
        "       or m == 'aiohttp.web' or m == 'mcphost.supervisor.operator.metrics']\n"
        "print(bad)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=str(Path(__file__).resolve().parents[3]),
    )
    assert done.stdout.strip() == "[]", done.stdout
