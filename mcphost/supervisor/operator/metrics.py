"""The Prometheus endpoint: the supervisor's `/metrics`, off unless the fleet file has `[metrics]`.

Owns: what is exposed and under which names (`NAMES`, docs/operations.md "Metrics"), in one
`CollectorRegistry` of its own (never prometheus_client's global one) and the fleet's text:
- per agent, from `Operations.snapshot()`'s rows taken as the scrape arrives (so an agent that
  left is gone from the next scrape): state (one series per `AgentState`, 1 for the current
  one), restarts, generation, sessions, fence level, the usage figures a row carries
  (`row["usage"]`: memory, CPU, processes, and the times the agent met its limits: OOM kills
  and forks refused at `pids_max`, counted across its restarts), and its limits
  (`row["limits"]`: `memory_max`, `pids_max`); a figure that is None or absent (no cgroup
  backend; a limit of `max`) is left out, never shown as 0;
- the center's health (`mcphost_center_up`) from the same status;
  these fleet families are written in the text format by `FleetText` (prometheus_client's
  `floatToGoString` for values; label values escaped as its exposition does): once per version
  of the snapshot, each agent's lines kept until its row changes, so a scrape formats only what
  changed (prometheus_client's `generate_latest` formats every series anew: ~40 us an agent);
- the center calls, counted where every one ends (`HostSurface.on_done`, through the
  supervisor's `on_center_call`): by catalog tool and outcome (`ok` or the failure's code), with
  a latency histogram by tool;
- the relay's deliveries by outcome and its queue depth (`RelayFigures`, read at scrape time);
- the supervisor's own process (prometheus_client's `ProcessCollector`: `process_*`);
  these three through the registry and `generate_latest`;
and the HTTP server (`MetricsServer`: aiohttp on the supervisor's event loop, `GET /metrics`
only) on a loopback address or a Unix socket (0660, bound through `mcphost.unixsock`), through
loopback.py's listener as the fleet page is: connections owned by an agent's uid closed at once,
bounds per listener and per owner uid, a deadline for the request head, no keep-alive, and on
TCP a `Host` that is not the listener's own address refused (403, `values.Listen.answers`); it
names where it listens (`supervisor.started`'s `metrics` URL, and `supervisor.metrics_serving` at
debug level: the port bound when `listen` asked for 0).

Labels: `agent` (an agent id: the one label that grows with the fleet), `state` (the six
states), `fence` (a fence level name), `tool` (a catalog tool name, or `unknown`: never a name
a client chose), `outcome` (`ok`, a stable code, or `other` for one that is not code-shaped).

Must never: put a token, a prompt, a message body, a path or anything a client or an agent chose
in a label or a value; serve anything but `GET /metrics`; bind an address `values.parse_listen`
did not accept (loopback or a Unix socket); change anything it reads; be imported while metrics
are off (it imports prometheus_client and aiohttp's server side: the supervisor imports it only
when `[metrics]` is set, so neither the start-up of an unmetered supervisor nor the per-agent
paths pay for them).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.utils import floatToGoString

from mcphost import events
from mcphost.supervisor.agents.states import AgentState

if TYPE_CHECKING:
    from aiohttp import web

    from mcphost.supervisor.operator.loopback import AgentUids, LoopbackServer
    from mcphost.supervisor.operator.operations import Snapshot
    from mcphost.supervisor.values import Listen

# Every family this endpoint exposes (with `process_*` of the ProcessCollector): name -> help.
NAMES: dict[str, str] = {
    "mcphost_agent_state": "1 for the agent's current state, 0 for the others",
    "mcphost_agent_restarts_total": "Automatic restarts of the agent since its runner was made",
    "mcphost_agent_generation": "The agent's current generation",
    "mcphost_agent_sessions": "MCP sessions the agent holds open (both surfaces)",
    "mcphost_agent_fence_info": "The agent's fence level (label fence; none: not fenced)",
    "mcphost_agent_memory_bytes": "Memory the agent's processes use now",
    "mcphost_agent_memory_peak_bytes": "The most memory the agent's processes have used",
    "mcphost_agent_cpu_seconds_total": "CPU time the agent's processes have used",
    "mcphost_agent_processes": "The agent's processes now",
    "mcphost_agent_oom_kills_total": "Processes of the agent the kernel's OOM killer ended",
    "mcphost_agent_pids_limit_hits_total": "Forks of the agent refused at its pids_max",
    "mcphost_agent_memory_max_bytes": "The agent's memory_max (absent: no limit)",
    "mcphost_agent_pids_max": "The agent's pids_max, processes and threads (absent: no limit)",
    "mcphost_center_up": "1 when the center's last health probe succeeded, else 0",
    "mcphost_center_calls_total": "Center tool calls by tool and outcome (ok or the error code)",
    "mcphost_center_call_duration_seconds": "Center tool call latency by tool",
    "mcphost_relay_deliveries_total": "Relay deliveries by outcome",
    "mcphost_relay_queue_depth": "Relay messages queued for delivery now",
}
# Center calls take milliseconds to minutes (a tool may wait on the center): default-ish
# buckets reaching the call timeout's range.
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
UNIX_MODE = 0o660  # the supervisor's user and group: a scraper's proxy joins the group
_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")


def outcome_label(code: str) -> str:
    """A failure's code as a label value: a stable code as it is, anything else `other`."""
    return code if _CODE.fullmatch(code) else "other"


@dataclass(frozen=True, slots=True)
class RelayFigures:
    """What the relay says at a scrape: deliveries by outcome (ever) and items queued now."""

    outcomes: Mapping[str, int]
    queued: int


# The per-agent families in the order exposed (the name as scraped, its type); from the sixth on,
# the usage figure each shows (`USAGE_FIGURES`), then the limit (`LIMIT_FIGURES`).
AGENT_FAMILIES = (
    ("mcphost_agent_state", "gauge"),
    ("mcphost_agent_restarts_total", "counter"),
    ("mcphost_agent_generation", "gauge"),
    ("mcphost_agent_sessions", "gauge"),
    ("mcphost_agent_fence_info", "gauge"),
    ("mcphost_agent_memory_bytes", "gauge"),
    ("mcphost_agent_memory_peak_bytes", "gauge"),
    ("mcphost_agent_cpu_seconds_total", "counter"),
    ("mcphost_agent_processes", "gauge"),
    ("mcphost_agent_oom_kills_total", "counter"),
    ("mcphost_agent_pids_limit_hits_total", "counter"),
    ("mcphost_agent_memory_max_bytes", "gauge"),
    ("mcphost_agent_pids_max", "gauge"),
)
USAGE_FIGURES = (
    "memory_current_bytes", "memory_peak_bytes", "cpu_seconds", "processes", "oom_kills",
    "pids_limit_hits",
)  # fmt: skip
LIMIT_FIGURES = ("memory_max", "pids_max")
FIGURES_AT = 5  # AGENT_FAMILIES[FIGURES_AT:]: the usage figures, then the limits


def _label(value: str) -> str:
    """A label value escaped as the text format wants it (backslash, newline, double quote)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _header(name: str, kind: str) -> str:
    """A family's `# HELP` and `# TYPE` lines (help text escaped: backslash, newline)."""
    text = NAMES[name].replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {text}\n# TYPE {name} {kind}\n"


def _number(value: Any) -> float | None:
    """A figure as a sample value; None for one that is absent or not a number."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _row_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """What an agent's series are made of: the same key, the same lines."""
    return (
        row.get("state"), row.get("restarts"), row.get("generation"), row.get("sessions"),
        row.get("sandbox"), _figures(row),
    )  # fmt: skip


def _figures(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """The usage figures then the limits of a row, in `AGENT_FAMILIES`' order (None: absent)."""
    usage, limits = row.get("usage"), row.get("limits")
    usage = usage if isinstance(usage, Mapping) else {}
    limits = limits if isinstance(limits, Mapping) else {}
    return (*(usage.get(k) for k in USAGE_FIGURES), *(limits.get(k) for k in LIMIT_FIGURES))


def agent_lines(row: Mapping[str, Any]) -> tuple[str, ...]:
    """One agent's sample lines, one string per `AGENT_FAMILIES` family ("" where it has no
    figure: left out, never 0)."""
    agent = f'agent="{_label(str(row["agent_id"]))}"'

    def line(name: str, value: float | None, more: str = "") -> str:
        return "" if value is None else f"{name}{{{agent}{more}}} {floatToGoString(value)}\n"

    state = row.get("state")
    states = "".join(
        line("mcphost_agent_state", 1.0 if state == each.value else 0.0, f',state="{each.value}"')
        for each in AgentState
    )
    generation = row.get("generation")
    sandbox = row.get("sandbox")
    return (
        states,
        line("mcphost_agent_restarts_total", float(row.get("restarts") or 0)),
        line(
            "mcphost_agent_generation", float(generation) if isinstance(generation, int) else None
        ),
        line("mcphost_agent_sessions", float(row.get("sessions") or 0)),
        line("mcphost_agent_fence_info", 1.0, f',fence="{_label(sandbox)}"')
        if isinstance(sandbox, str)
        else "",
        *(
            line(name, _number(value))
            for (name, _), value in zip(AGENT_FAMILIES[FIGURES_AT:], _figures(row), strict=True)
        ),
    )


class FleetText:
    """The fleet's families of a status in the text format (`text`); each agent's lines kept
    while its row gives the same key (`_row_key`), so a new status formats only the agents
    whose figures changed."""

    def __init__(self) -> None:
        self._lines: dict[str, tuple[tuple[Any, ...], tuple[str, ...]]] = {}
        self.formatted = 0  # agents whose lines were formatted (tests)

    def text(self, status: Mapping[str, Any]) -> str:
        kept: dict[str, tuple[tuple[Any, ...], tuple[str, ...]]] = {}
        for row in status.get("agents") or ():
            agent = str(row["agent_id"])
            key = _row_key(row)
            held = self._lines.get(agent)
            if held is None or held[0] != key:
                held = (key, agent_lines(row))
                self.formatted += 1
            kept[agent] = held
        self._lines = kept  # an agent that left is forgotten
        per_agent = [lines for _, lines in kept.values()]
        out = [
            _header(name, kind) + "".join(lines[index] for lines in per_agent)
            for index, (name, kind) in enumerate(AGENT_FAMILIES)
        ]
        health = status.get("center")
        up = 1.0 if isinstance(health, Mapping) and health.get("state") == "ok" else 0.0
        out.append(
            _header("mcphost_center_up", "gauge") + f"mcphost_center_up {floatToGoString(up)}\n"
        )
        return "".join(out)


def relay_families(relay: RelayFigures | None) -> list[Metric]:
    """The relay's families: deliveries by outcome (ever) and the queue now (0: no relay)."""
    deliveries = CounterMetricFamily(
        "mcphost_relay_deliveries", NAMES["mcphost_relay_deliveries_total"], labels=["outcome"]
    )
    depth = GaugeMetricFamily("mcphost_relay_queue_depth", NAMES["mcphost_relay_queue_depth"])
    if relay is not None:
        for outcome, count in sorted(relay.outcomes.items()):
            deliveries.add_metric([outcome_label(outcome)], float(count))
    depth.add_metric([], float(relay.queued if relay is not None else 0))
    return [deliveries, depth]


class RelayCollector:
    """The relay's families, collected at scrape time."""

    def __init__(self, relay: Callable[[], RelayFigures | None]) -> None:
        self.relay = relay

    def collect(self) -> Iterator[Metric]:
        yield from relay_families(self.relay())

    def describe(self) -> list[Metric]:
        return []  # never collected at registration


class Metrics:
    """The registry, the fleet's text and what feeds them (module doc). `snapshot`:
    `Operations.snapshot`; `relay`: the relay's figures now (None: the supervisor serves no
    relay)."""

    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        relay: Callable[[], RelayFigures | None],
    ) -> None:
        self._snapshot = snapshot
        self.fleet = FleetText()
        self._fleet: tuple[int, bytes] | None = None  # the fleet's text, of this version
        disable_created_metrics()  # no `*_created` series: this process's only registry
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(RelayCollector(relay))
        ProcessCollector(registry=self.registry)
        self.calls = Counter(
            "mcphost_center_calls",
            NAMES["mcphost_center_calls_total"],
            ["tool", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "mcphost_center_call_duration_seconds",
            NAMES["mcphost_center_call_duration_seconds"],
            ["tool"],
            buckets=CALL_BUCKETS,
            registry=self.registry,
        )
        self.scrapes = 0
        self.last_scrape_seconds = 0.0

    def center_call(self, agent_id: str, tool: str, outcome: str, seconds: float) -> None:
        """One center call ended (`HostSurface.on_done`; the agent is not a label here)."""
        self.calls.labels(tool, outcome_label(outcome)).inc()
        self.latency.labels(tool).observe(seconds)

    def exposition(self) -> bytes:
        """The text format of everything now: the fleet's families of the snapshot (formatted
        again only when its version changed), then the registry's."""
        started = time.perf_counter()
        snapshot = self._snapshot()
        if self._fleet is None or self._fleet[0] != snapshot.version:
            self._fleet = (snapshot.version, self.fleet.text(snapshot.status).encode())
        body = self._fleet[1] + generate_latest(self.registry)
        self.scrapes += 1
        self.last_scrape_seconds = time.perf_counter() - started
        return body


class MetricsBindError(OSError):
    """`listen` cannot be served (in use, a missing directory, not a socket...): `line` says
    what, for the operator, naming the fleet key (an `OSError`, as a page's bind failure is)."""

    def __init__(self, listen: Listen, why: str) -> None:
        self.line = f"[metrics] listen = {str(listen)!r} cannot be served: {why}"
        super().__init__(self.line)


class MetricsServer:
    """`GET /metrics` of `metrics` at `listen`, on the running event loop, through loopback.py's
    listener (its guards and bounds; `Host` checked on TCP, as the page's)."""

    def __init__(
        self, metrics: Metrics, listen: Listen, agent_uids: AgentUids | None = None
    ) -> None:
        self.metrics = metrics
        self.listen = listen
        self.agent_uids = agent_uids
        self.server: LoopbackServer | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        body = self.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> None:
        """Bind and serve (`supervisor.metrics_serving` names where); `MetricsBindError` when
        it cannot."""
        from aiohttp import web

        from mcphost.supervisor.operator.loopback import LoopbackServer, no_agents

        app = web.Application()
        app.router.add_get("/metrics", self._handle)
        server = LoopbackServer(
            app, self.listen, "metrics", agent_uids=self.agent_uids or no_agents,
            unix_mode=UNIX_MODE,
        )  # fmt: skip
        try:
            await server.start()
        except OSError as exc:
            raise MetricsBindError(self.listen, exc.strerror or str(exc)) from None
        self.server = server
        # debug: `supervisor.started` (supervisor.py) names the URL, the endpoint never moves
        events.emit("supervisor.metrics_serving", "debug", listen=str(server.bound))

    async def aclose(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            await server.aclose()
