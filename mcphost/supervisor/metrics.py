"""The Prometheus endpoint: the supervisor's `/metrics`, off unless the fleet file has `[metrics]`.

Owns: what is exposed and under which names (`NAMES`, docs/operations.md "Metrics"), in one
`CollectorRegistry` of its own (never prometheus_client's global one):
- per agent, from `Operations.status()`'s rows taken as the scrape arrives (`FleetCollector`:
  built at scrape time, so an agent that left is gone from the next scrape): state (one series
  per `AgentState`, 1 for the current one), restarts, generation, sessions, fence level, and the
  usage figures a row carries (`row["usage"]`: memory, CPU, processes; a figure that is None or
  absent is left out, never shown as 0);
- the center's health (`mcphost_center_up`) from the same status;
- the center calls, counted where every one ends (`HostSurface.on_done`, through the
  supervisor's `on_center_call`): by catalog tool and outcome (`ok` or the failure's code), with
  a latency histogram by tool;
- the relay's deliveries by outcome and its queue depth (`RelayFigures`, read at scrape time);
- the supervisor's own process (prometheus_client's `ProcessCollector`: `process_*`);
and the HTTP server (`MetricsServer`: aiohttp on the supervisor's event loop, `GET /metrics`
only) on a loopback address or a Unix socket (0660, bound through `mcphost.unixsock`).

Labels: `agent` (an agent id: the one label that grows with the fleet), `state` (the six
states), `fence` (a fence level name), `tool` (a catalog tool name, or `unknown`: never a name
a client chose), `outcome` (`ok`, a stable code, or `other` for one that is not code-shaped).

Must never: put a token, a prompt, a message body, a path or anything a client or an agent chose
in a label or a value; serve anything but `GET /metrics`; bind an address `plan.parse_listen`
did not accept (loopback or a Unix socket); change anything it reads; be imported while metrics
are off (it imports prometheus_client and aiohttp's server side: the supervisor imports it only
when `[metrics]` is set, so neither the start-up of an unmetered supervisor nor the per-agent
paths pay for them).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.process_collector import ProcessCollector

from mcphost.supervisor.lifecycle import AgentState

if TYPE_CHECKING:
    from aiohttp import web

    from mcphost.supervisor.plan import Listen
    from mcphost.unixsock import Listening

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


def families(status: Mapping[str, Any], relay: RelayFigures | None) -> list[Metric]:
    """The families of one `Operations.status()` answer and the relay's figures (pure)."""

    def gauge(name: str, labels: Iterable[str] = ("agent",)) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, NAMES[name], labels=list(labels))

    def counter(name: str, labels: Iterable[str] = ("agent",)) -> CounterMetricFamily:
        # prometheus_client names a counter family without `_total` and adds it to the sample
        return CounterMetricFamily(name.removesuffix("_total"), NAMES[name], labels=list(labels))

    state = gauge("mcphost_agent_state", ("agent", "state"))
    restarts = counter("mcphost_agent_restarts_total")
    generation = gauge("mcphost_agent_generation")
    sessions = gauge("mcphost_agent_sessions")
    fence = gauge("mcphost_agent_fence_info", ("agent", "fence"))
    memory = gauge("mcphost_agent_memory_bytes")
    peak = gauge("mcphost_agent_memory_peak_bytes")
    cpu = counter("mcphost_agent_cpu_seconds_total")
    processes = gauge("mcphost_agent_processes")
    for row in status.get("agents") or ():
        agent = str(row["agent_id"])
        for each in AgentState:
            state.add_metric([agent, each.value], 1.0 if row.get("state") == each.value else 0.0)
        restarts.add_metric([agent], float(row.get("restarts") or 0))
        if isinstance(row.get("generation"), int):
            generation.add_metric([agent], float(row["generation"]))
        sessions.add_metric([agent], float(row.get("sessions") or 0))
        if isinstance(row.get("sandbox"), str):
            fence.add_metric([agent, row["sandbox"]], 1.0)
        usage = row.get("usage") or {}
        for family, key in (
            (memory, "memory_current_bytes"),
            (peak, "memory_peak_bytes"),
            (cpu, "cpu_seconds"),
            (processes, "processes"),
        ):
            value = usage.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                family.add_metric([agent], float(value))
    center = gauge("mcphost_center_up", ())
    health = status.get("center")
    center.add_metric([], 1.0 if health is not None and health.get("state") == "ok" else 0.0)
    deliveries = counter("mcphost_relay_deliveries_total", ("outcome",))
    depth = gauge("mcphost_relay_queue_depth", ())
    if relay is not None:
        for outcome, count in sorted(relay.outcomes.items()):
            deliveries.add_metric([outcome_label(outcome)], float(count))
    depth.add_metric([], float(relay.queued if relay is not None else 0))
    return [
        state, restarts, generation, sessions, fence, memory, peak, cpu, processes, center,
        deliveries, depth,
    ]  # fmt: skip


class FleetCollector:
    """The families of the last status taken (`take`), collected at scrape time."""

    def __init__(self, relay: Callable[[], RelayFigures | None]) -> None:
        self.relay = relay
        self.status: Mapping[str, Any] = {"center": None, "agents": []}

    def collect(self) -> Iterator[Metric]:
        yield from families(self.status, self.relay())

    def describe(self) -> list[Metric]:
        return []  # never collected at registration (the status is taken per scrape)


class Metrics:
    """The registry and what feeds it (module doc). `status`: `Operations.status`; `relay`: the
    relay's figures now (None: the supervisor serves no relay)."""

    def __init__(
        self,
        status: Callable[[], Awaitable[Mapping[str, Any]]],
        relay: Callable[[], RelayFigures | None],
    ) -> None:
        self._status = status
        disable_created_metrics()  # no `*_created` series: this process's only registry
        self.registry = CollectorRegistry(auto_describe=False)
        self.fleet = FleetCollector(relay)
        self.registry.register(self.fleet)
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

    async def exposition(self) -> bytes:
        """The text format of everything now (the status taken first, on the event loop)."""
        started = time.perf_counter()
        self.fleet.status = await self._status()
        body = generate_latest(self.registry)
        self.scrapes += 1
        self.last_scrape_seconds = time.perf_counter() - started
        return body


class MetricsBindError(Exception):
    """`listen` cannot be served (in use, a missing directory, not a socket...): `line` says
    what, for the operator, naming the fleet key."""

    def __init__(self, listen: Listen, why: str) -> None:
        self.line = f"[metrics] listen = {str(listen)!r} cannot be served: {why}"
        super().__init__(self.line)


class MetricsServer:
    """`GET /metrics` of `metrics` at `listen`, on the running event loop."""

    def __init__(self, metrics: Metrics, listen: Listen) -> None:
        self.metrics = metrics
        self.listen = listen
        self._runner: web.AppRunner | None = None
        self._listening: Listening | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        body = await self.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> None:
        """Bind and serve; `MetricsBindError` when it cannot."""
        from aiohttp import web

        from mcphost import unixsock

        app = web.Application()
        app.router.add_get("/metrics", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        listen = self.listen
        try:
            if listen.path is not None:
                self._listening = unixsock.listen(listen.path, mode=UNIX_MODE)
                site: web.BaseSite = web.SockSite(runner, self._listening.sock)
            else:
                site = web.TCPSite(runner, listen.host, listen.port, reuse_address=True)
            await site.start()
        except (OSError, unixsock.SocketPathError) as exc:
            await runner.cleanup()
            if self._listening is not None:
                self._listening.close()
                self._listening = None
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise MetricsBindError(listen, why) from None
        self._runner = runner

    async def aclose(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            with contextlib.suppress(Exception):  # shutdown goes on whatever aiohttp says
                await runner.cleanup()
        listening, self._listening = self._listening, None
        if listening is not None:
            listening.close()
