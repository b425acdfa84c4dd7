"""The fleet page: a read-only view of the fleet in a browser, on the loopback (`[page]`).

Owns: `FleetPage`, an aiohttp server on the `[page] listen` address (a loopback address or a Unix
socket, held to that by `values.parse_listen`) with two resources: `/`, one HTML document whose
style and script are inline (no external asset, no CDN; a Content-Security-Policy that allows
exactly those two by hash, and `connect-src 'self'`), its agents' table and the bar above it
already filled from the snapshot of the moment (`render_page`: the first paint is the fleet, not an
empty "connecting" table; the cells are the script's, `agent_cells` writing what its `agentRow`
writes), `/api/fleet`, the snapshot, and `/api/stream`, the same snapshot pushed as server-sent
events (`text/event-stream`, one `data:` line per message) to the script's `EventSource` whenever
what it shows changed (so the page follows restarts without a reload and without polling): the
center's health, and per agent its state, generation, restarts, fence, usage (the times it met its
limits among them), its limits, sessions, last exit and reason (`Operations.snapshot()`'s rows,
read with `.get`, every field passed through an allow-list), and the supervisor's recent events
(the newest `supervisor.*` records of the journal's ring, journal.py, each cut to `safe_event`'s
allow-list of fields). The JSON is built once per change of what it shows (the snapshot's version,
the journal's) and served as the same bytes to every reader until the next change, with the time
of the answer (`now`) put in front.

Pushed, not polled: while at least one stream is open, one task (`_publish`) looks again when the
journal keeps a record (`Journal.on_record`: a state change is an event) and at the latest every
`STREAM_REFRESH_SECONDS` (sessions and usage figures change without an event; the figures it
shows are at most that old, the sample a status or a scrape took serving it too), and sends to
every stream only when what it shows changed; with no stream open
nothing runs. The script counts the times shown ("up", "checked ... ago") on from the last message
itself. Streams are loopback.py's `stream`: bounded per listener and per owner uid (429 past
either), let off the reply deadline, and dropped when their connection ends.

Who can reach it: whoever can connect to that loopback port, except the agents: every local user of
the machine, or on a Unix socket (mode 0660) the supervisor's user and group (no authentication;
the page says nothing more than `ctl status`'s ids, states and figures). The listener is
loopback.py's, with its guards and bounds: a connection owned by one of the agents' uids is closed
at once, connections are bounded per listener and per owner uid, a half-sent request is closed
after a few seconds, and on TCP a request whose `Host` is not that address (or `localhost` at its
port) is refused (403, `values.Listen.answers`): a web page elsewhere that rebinds its name to
127.0.0.1 gets nothing. GET and HEAD only; every other method is answered 405.

Must never: change anything (no operation but `status`, no method but GET/HEAD), show a token, a
fleet-file value beyond the agents' ids and plans' kinds (no `env`, no `command`, no paths), pane
or log contents, an event's free-text fields (`message`, `error`, paths), or load anything from
elsewhere; nor be imported unless `[page]` is set (supervisor.py imports it then).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import html
import json
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from mcphost import events
from mcphost.supervisor.operator.loopback import AgentUids, LoopbackServer, no_agents
from mcphost.supervisor.values import format_size, one_decimal

if TYPE_CHECKING:
    from mcphost.supervisor.operator.operations import Snapshot
    from mcphost.supervisor.values import Listen

# At the latest, how often an open stream's snapshot is looked at again, and how old the usage
# figures it shows may be (a look takes the sample a status or a scrape took within this: a
# Prometheus scrape every 15 s serves the page too, so an open tab samples nothing of its own).
STREAM_REFRESH_SECONDS = 15.0
RETRY_MS = 2000  # how soon the browser's EventSource connects again after its stream ended
EVENTS_SHOWN = 60  # the newest supervisor events the snapshot carries
TEXT_MAX = 300  # characters of any string value shown

# What the page shows of a status row, of its `fenced` record, and of the center's health: ids,
# states, numbers and the exit's words. Nothing else of a row reaches the browser.
AGENT_KEYS = (
    "agent_id", "state", "pid", "generation", "restarts", "started_at", "last_exit",
    "last_reason", "sessions", "sandbox", "runner", "protocol_state", "state_reason_code",
    "identity",
)  # fmt: skip
FENCED_KEYS = ("code", "generation", "center_generation", "at", "action")
LIMIT_KEYS = ("memory_max", "pids_max", "cpu_weight")
CENTER_KEYS = ("state", "checked_at", "fleet_key")
# The fields of a supervisor event the page shows (the rest, `message`, `error`, `path`, `fleet`,
# `argv0`, `user`... are left out: free text or paths); `state` only as one word (a center's
# health; `supervisor.started`'s `state` is a directory).
EVENT_FIELDS = frozenset(
    {
        "agent_id", "agents", "generation", "center_generation", "below_generation", "pid",
        "pgid", "exit", "reason", "uptime", "restarted", "restarts", "sessions", "code",
        "trigger", "added", "removed", "changed", "action", "delay", "attempt", "bundle",
        "runner", "state", "fleet_key", "url",
    }
)  # fmt: skip
_WORD = re.compile(r"[a-z_]{1,32}")
# An absolute path anywhere in a string (`supervisor.limits`'s reason names the cgroup
# directories): such a value is left out, as paths are (`url` excepted: the page's own address).
_PATH = re.compile(r"(?:^|[\s(\[=:,'\"])/\w")
_LIST_MAX = 50


def _scalar(value: Any) -> tuple[bool, Any]:
    """(shown, value): numbers, booleans and None as they are, strings cut to `TEXT_MAX`."""
    if value is None or isinstance(value, bool | int | float):
        return True, value
    if isinstance(value, str):
        return True, value if len(value) <= TEXT_MAX else value[: TEXT_MAX - 1] + "…"
    return False, None


def _picked(source: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    out = {}
    for key in keys:
        shown, value = _scalar(source.get(key))
        if shown:
            out[key] = value
    return out


def _figures(usage: Any) -> dict[str, float | int | None] | None:
    """A row's `usage` (usage.py's figures): every numeric figure, by its name."""
    if not isinstance(usage, Mapping):
        return None
    return {
        str(key): value
        for key, value in usage.items()
        if _WORD.fullmatch(str(key)) and (value is None or isinstance(value, int | float))
    }


def safe_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """What the page shows of one `ctl status` row (module doc: the allow-lists)."""
    out = _picked(row, AGENT_KEYS)
    fenced = row.get("fenced")
    out["fenced"] = _picked(fenced, FENCED_KEYS) if isinstance(fenced, Mapping) else None
    out["usage"] = _figures(row.get("usage"))
    limits = row.get("limits")
    out["limits"] = _picked(limits, LIMIT_KEYS) if isinstance(limits, Mapping) else None
    return out


def safe_center(center: Any) -> dict[str, Any] | None:
    return _picked(center, CENTER_KEYS) if isinstance(center, Mapping) else None


def safe_event(event: str, level: str, ts: float, fields: Mapping[str, Any]) -> dict[str, Any]:
    """One supervisor event as the page shows it: name, level, time and the allowed fields."""
    out: dict[str, Any] = {"ts": round(ts, 3), "level": level, "event": event}
    for key, value in fields.items():
        if key not in EVENT_FIELDS:
            continue
        if key == "state" and not (isinstance(value, str) and _WORD.fullmatch(value)):
            continue
        if isinstance(value, list | tuple):
            items = [_scalar(item) for item in value[:_LIST_MAX]]
            out[key] = [
                item
                for shown, item in items
                if shown and not (isinstance(item, str) and _PATH.search(item))
            ]
            continue
        shown, clean = _scalar(value)
        if shown and not (key != "url" and isinstance(clean, str) and _PATH.search(clean)):
            out[key] = clean
    return out


def safe_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """A journal record (`ts`, `level`, `event`, then its fields) as the page shows it."""
    fields = {k: v for k, v in record.items() if k not in ("ts", "level", "event")}
    ts = record.get("ts")
    when = float(ts) if isinstance(ts, int | float) else 0.0
    return safe_event(str(record.get("event")), str(record.get("level")), when, fields)


class StatusSource(Protocol):
    """What the page reads of the supervisor: `Operations.snapshot()` (operations.py), its
    usage figures at most `max_age` seconds old (its own default when None)."""

    def snapshot(self, max_age: float = ...) -> Snapshot: ...


class EventSource(Protocol):
    """What the page reads of the supervisor's events: the journal's ring (journal.py)."""

    @property
    def version(self) -> int: ...
    def newest(self, limit: int, prefix: str = "") -> list[dict[str, Any]]: ...

    on_record: Callable[[], None] | None  # run after each record kept, from any thread


def _json(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


_STYLE = """
:root { color-scheme: light dark; --ok: #1a7f37; --warn: #9a6700; --bad: #cf222e; --dim: #6e7781; }
body { font: 13px/1.35 system-ui, sans-serif; margin: 1em 1.2em; }
h1 { font-size: 1.3em; margin: 0 0 .3em; }
h2 { font-size: 1.05em; margin: 1.4em 0 .4em; }
#bar { display: flex; gap: 2em; flex-wrap: wrap; color: var(--dim); }
#bar b { color: CanvasText; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .25em .6em .25em 0; border-bottom: 1px solid #8884;
  white-space: nowrap; vertical-align: top; }
th { font-weight: 600; color: var(--dim); white-space: normal; vertical-align: bottom; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.soft { white-space: normal; min-width: 6em; }
td.wrap { white-space: normal; overflow-wrap: break-word; min-width: 16em; }
.running, .ok { color: var(--ok); font-weight: 600; }
.starting, .backoff, .stopping, .degraded, .unknown, .warning { color: var(--warn); font-weight: 600; }
.failed, .down, .error, .refused, .fenced { color: var(--bad); font-weight: 600; }
.stopped, .dim { color: var(--dim); }
#events td { font: 12px/1.3 ui-monospace, monospace; }
"""

_SCRIPT = """
"use strict";
const $ = (id) => document.getElementById(id);
const dash = (v) => (v === null || v === undefined || v === "") ? "-" : String(v);
function bytes(n) {
  if (typeof n !== "number") return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  const whole = i === 0 || n === Math.trunc(n) || Math.abs(n) >= 10;
  return (whole ? String(Math.trunc(n)) : n.toFixed(1)) + " " + units[i];
}
function limit(v, show) { return (v === null) ? "max" : (v === undefined ? "-" : show(v)); }
function ago(seconds) {
  if (typeof seconds !== "number" || seconds < 0) return "-";
  seconds = Math.floor(seconds);
  if (seconds < 60) return seconds + "s";
  if (seconds < 3600) return Math.floor(seconds / 60) + "m" + (seconds % 60) + "s";
  if (seconds < 86400) return Math.floor(seconds / 3600) + "h" + Math.floor(seconds % 3600 / 60) + "m";
  return Math.floor(seconds / 86400) + "d" + Math.floor(seconds % 86400 / 3600) + "h";
}
function td(tr, col, text, cls) {
  const cell = document.createElement("td");
  cell.dataset.col = col;
  cell.textContent = text;
  if (cls) cell.className = cls;
  tr.appendChild(cell);
}
function stateText(a) {
  let text = dash(a.state);
  if (a.protocol_state && (a.state === "running" || a.state === "starting")) {
    text += ", " + a.runner + " " + a.protocol_state;
    if (a.state_reason_code) text += " (" + a.state_reason_code + ")";
  }
  if (a.fenced && a.fenced.generation === a.generation) text += ", fenced (" + a.fenced.code + ")";
  return text;
}
function agentRow(a, now) {  // page.py's agent_cells writes the same cells on the server
  const u = a.usage || {};
  const l = a.limits || {};
  const tr = document.createElement("tr");
  tr.dataset.agent = a.agent_id;
  const up = (a.state === "running" && typeof a.started_at === "number") ? ago(now - a.started_at) : "-";
  td(tr, "agent", dash(a.agent_id));
  td(tr, "state", stateText(a), ((a.fenced && a.fenced.generation === a.generation) ? "fenced" : a.state) + " soft");
  td(tr, "generation", dash(a.generation), "num");
  td(tr, "restarts", dash(a.restarts), "num");
  td(tr, "fence", dash(a.sandbox) + (a.identity === "shared" ? " (shared uid)" : ""), "soft");
  td(tr, "pid", dash(a.pid), "num");
  td(tr, "up", up, "num");
  td(tr, "memory", bytes(u.memory_current_bytes) + " / " + bytes(u.memory_peak_bytes), "num");
  td(tr, "cpu", typeof u.cpu_seconds === "number" ? u.cpu_seconds.toFixed(1) + " s" : "-", "num");
  td(tr, "processes", dash(u.processes), "num");
  td(tr, "limits", a.limits ? limit(l.memory_max, bytes) + " / " + limit(l.pids_max, String) : "-", "num");
  td(tr, "hits", dash(u.oom_kills) + " / " + dash(u.pids_limit_hits), "num");
  td(tr, "sessions", dash(a.sessions), "num");
  td(tr, "center", dash(u.center_calls) + " / " + dash(u.center_errors), "num");
  td(tr, "queue", dash(u.relay_queue_depth), "num");
  const exit = [a.last_exit, a.last_reason].filter((x) => x).join(": ");
  td(tr, "exit", dash(exit), "wrap");
  return tr;
}
function eventRow(e) {
  const tr = document.createElement("tr");
  td(tr, "time", new Date(e.ts * 1000).toLocaleTimeString());
  td(tr, "level", e.level, e.level);
  td(tr, "event", e.event);
  const parts = [];
  for (const [k, v] of Object.entries(e)) {
    if (k !== "ts" && k !== "level" && k !== "event" && v !== null) parts.push(k + "=" + (Array.isArray(v) ? v.join(",") : v));
  }
  td(tr, "fields", parts.join("  "), "wrap");
  return tr;
}
function render(snap, now) {
  const c = snap.center;
  const health = $("center");
  health.textContent = c ? dash(c.state) + (c.fleet_key ? " (" + c.fleet_key + ")" : "") : "not known yet";
  health.className = c ? c.state : "unknown";
  $("checked").textContent = c && typeof c.checked_at === "number" ? ago(now - c.checked_at) + " ago" : "-";
  $("uptime").textContent = ago(now - snap.supervisor.started_at);
  const counts = {};
  for (const a of snap.agents) counts[a.state] = (counts[a.state] || 0) + 1;
  $("counts").textContent = Object.entries(counts).map(([s, n]) => n + " " + s).join(", ") || "no agents";
  $("agents").replaceChildren(...snap.agents.map((a) => agentRow(a, now)));
  $("events").replaceChildren(...snap.events.map(eventRow));
  $("updated").textContent = new Date(snap.now * 1000).toLocaleTimeString();
}
let last = null;  // [the last snapshot pushed, the browser's clock when it came]
function clock() { if (last) render(last[0], last[0].now + (Date.now() / 1000 - last[1])); }
const stream = new EventSource("api/stream");
stream.onmessage = (message) => {
  const snap = JSON.parse(message.data);
  last = [snap, Date.now() / 1000];
  render(snap, snap.now);
  $("live").textContent = "live";
  $("live").className = "ok";
};
stream.onerror = () => {
  const closed = stream.readyState === EventSource.CLOSED;
  $("live").textContent = closed ? "not reachable (reload the page to retry)" : "not reachable, retrying";
  $("live").className = "error";
};
setInterval(clock, 1000);  // the times shown go on between pushes (the browser's work only)
"""

_HEAD = (
    "agent", "state", "gen", "restarts", "fence", "pid", "up", "memory (now / peak)", "cpu",
    "procs", "limits (memory / procs)", "OOM kills / forks refused", "sessions",
    "center calls / errors", "relay queue", "last exit",
)  # fmt: skip


# -- the first paint: the script's cells, written by the server --------------------------------


def _dash(value: Any) -> str:
    """The script's `dash`: `-` for nothing, the value's text otherwise."""
    return "-" if value is None or value == "" else str(value)


def _ago(seconds: Any) -> str:
    """The script's `ago`: 45s, 3m12s, 2h5m, 3d4h."""
    if not isinstance(seconds, int | float) or seconds < 0:
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60}m"
    return f"{whole // 86400}d{whole % 86400 // 3600}h"


def _bytes(value: Any) -> str:
    return format_size(value) if isinstance(value, int | float) else "-"


def _state_text(a: Mapping[str, Any]) -> str:
    """The script's `stateText`."""
    text = _dash(a.get("state"))
    if a.get("protocol_state") and a.get("state") in ("running", "starting"):
        text += f", {a.get('runner')} {a.get('protocol_state')}"
        if a.get("state_reason_code"):
            text += f" ({a.get('state_reason_code')})"
    fenced = a.get("fenced")
    if fenced and fenced.get("generation") == a.get("generation"):
        text += f", fenced ({fenced.get('code')})"
    return text


def agent_cells(a: Mapping[str, Any], now: float) -> list[tuple[str, str, str]]:
    """(column, text, class) of one agent's row as the script's `agentRow` writes them, from the
    same `safe_row` it polls: the page's first paint (`render_page`)."""
    u = a.get("usage") or {}
    limits = a.get("limits")
    fenced = a.get("fenced")
    started = a.get("started_at")
    up = (
        _ago(now - started)
        if a.get("state") == "running" and isinstance(started, int | float)
        else "-"
    )
    state_class = "fenced" if fenced and fenced.get("generation") == a.get("generation") else None
    cpu = u.get("cpu_seconds")
    shown_limits = "-"
    if limits:
        memory, pids = limits.get("memory_max"), limits.get("pids_max")
        shown_limits = (
            ("max" if memory is None else _bytes(memory))
            + " / "
            + ("max" if pids is None else _dash(pids))
        )
    exit_text = ": ".join(str(x) for x in (a.get("last_exit"), a.get("last_reason")) if x)
    return [
        ("agent", _dash(a.get("agent_id")), ""),
        ("state", _state_text(a), f"{state_class or a.get('state')} soft"),
        ("generation", _dash(a.get("generation")), "num"),
        ("restarts", _dash(a.get("restarts")), "num"),
        ("fence", _dash(a.get("sandbox")) + (" (shared uid)" if a.get("identity") == "shared" else ""), "soft"),
        ("pid", _dash(a.get("pid")), "num"),
        ("up", up, "num"),
        ("memory", f"{_bytes(u.get('memory_current_bytes'))} / {_bytes(u.get('memory_peak_bytes'))}", "num"),
        ("cpu", f"{one_decimal(cpu)} s" if isinstance(cpu, int | float) else "-", "num"),
        ("processes", _dash(u.get("processes")), "num"),
        ("limits", shown_limits, "num"),
        ("hits", f"{_dash(u.get('oom_kills'))} / {_dash(u.get('pids_limit_hits'))}", "num"),
        ("sessions", _dash(a.get("sessions")), "num"),
        ("center", f"{_dash(u.get('center_calls'))} / {_dash(u.get('center_errors'))}", "num"),
        ("queue", _dash(u.get("relay_queue_depth")), "num"),
        ("exit", _dash(exit_text), "wrap"),
    ]  # fmt: skip


def _row_html(a: Mapping[str, Any], now: float) -> str:
    cells = "".join(
        f'<td data-col="{col}"' + (f' class="{html.escape(cls)}"' if cls else "") + f">{html.escape(text)}</td>"
        for col, text, cls in agent_cells(a, now)
    )  # fmt: skip
    return f'<tr data-agent="{html.escape(str(a.get("agent_id")))}">{cells}</tr>'


def first_paint(snap: Mapping[str, Any]) -> dict[str, str]:
    """What `render_page` fills in, from an `/api/fleet` snapshot: the bar's texts (as the
    script's `render` writes them; `updated`, the server's clock in UTC) and the agents' rows."""
    now = float(snap["now"])
    center = snap.get("center")
    agents = snap.get("agents") or []
    counts: dict[str, int] = {}
    for a in agents:
        counts[str(a.get("state"))] = counts.get(str(a.get("state")), 0) + 1
    checked = center.get("checked_at") if center else None
    return {
        "center": (
            _dash(center.get("state"))
            + (f" ({center['fleet_key']})" if center.get("fleet_key") else "")
            if center
            else "not known yet"
        ),
        "center_class": str(center.get("state")) if center else "unknown",
        "checked": f"{_ago(now - checked)} ago" if isinstance(checked, int | float) else "-",
        "counts": ", ".join(f"{n} {state}" for state, n in counts.items()) or "no agents",
        "uptime": _ago(now - snap["supervisor"]["started_at"]),
        "updated": time.strftime("%H:%M:%S UTC", time.gmtime(now)),
        "agents": "".join(_row_html(a, now) for a in agents),
    }


PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>mcphost fleet</title>
<style>{_STYLE}</style></head>
<body>
<h1>mcphost fleet</h1>
<div id="bar">
<span>center: <b id="center" class="@center_class@">@center@</b> (checked <span id="checked">@checked@</span>)</span>
<span>agents: <b id="counts">@counts@</b></span>
<span>supervisor up <b id="uptime">@uptime@</b></span>
<span>updated <b id="updated">@updated@</b>, <span id="live" class="warning">served; live updates connecting</span></span>
</div>
<h2>Agents</h2>
<table><thead><tr>{"".join(f"<th>{name}</th>" for name in _HEAD)}</tr></thead>
<tbody id="agents">@agents@</tbody></table>
<h2>Recent supervisor events</h2>
<table><thead><tr><th>time</th><th>level</th><th>event</th><th>fields</th></tr></thead>
<tbody id="events"></tbody></table>
<script>{_SCRIPT}</script>
</body></html>
"""


_SLOT = re.compile(r"@(center_class|center|checked|counts|uptime|updated|agents)@")


def render_page(snap: Mapping[str, Any]) -> str:
    """`PAGE` with its bar and agents' table filled from the snapshot `snap` (`/api/fleet`'s),
    every text escaped; the script then updates it from its stream."""
    filled = first_paint(snap)
    return _SLOT.sub(
        lambda m: filled[m.group(1)] if m.group(1) == "agents" else html.escape(filled[m.group(1)]),
        PAGE,
    )


def _hash(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


# Exactly the page's own inline style and script, and requests to itself: nothing else loads.
CSP = (
    f"default-src 'none'; script-src {_hash(_SCRIPT)}; style-src {_hash(_STYLE)}; "
    "connect-src 'self'; img-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}
_READ = frozenset({"GET", "HEAD"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class FleetPage:
    """The page on `config`'s address (module doc); `start()` binds, `aclose()` ends it."""

    def __init__(
        self,
        source: StatusSource,
        config: Listen,
        *,
        started_at: float,
        journal: EventSource,
        agent_uids: AgentUids = no_agents,
    ) -> None:
        self.config = config
        self._source = source
        self._journal = journal
        self._started_at = started_at
        self._agent_uids = agent_uids
        self._server: LoopbackServer | None = None
        self.url: str | None = None
        # what `/api/fleet` shows after `now`, as built for these versions (status, journal)
        self._built: tuple[int, int] | None = None
        self._fleet_part = ""  # the center and the agents, of the status version built
        # each agent's JSON, by agent, with the row it was made of (the same row object while
        # nothing in it changed: operations.py)
        self._rows: dict[str, tuple[Mapping[str, Any], str]] = {}
        self._events_part = ""  # the events, of the journal version built
        self._tail = b""
        self.builds = 0  # times the JSON was built (tests, bench)
        # the open streams, each with the body it has yet to send (None: nothing new)
        self._streams: dict[_Stream, None] = {}
        self._publisher: asyncio.Task[None] | None = None
        self._changed: asyncio.Event | None = None  # set when the journal kept a record
        self._loop: asyncio.AbstractEventLoop | None = None
        self.pushes = 0  # messages sent on streams (tests, bench)

    async def start(self, level: str = "info") -> str | None:
        """Bind and serve; the page's URL (None on a Unix socket: `supervisor.page_listening`,
        at `level`, names where it listens). Raises `OSError` (the address is taken...) or
        `unixsock.SocketPathError`."""
        app = web.Application(middlewares=[self._guard])
        app.router.add_get("/", self._page)
        app.router.add_get("/api/fleet", self._fleet)
        app.router.add_get("/api/stream", self._stream)
        app.on_response_prepare.append(_headers)
        server = LoopbackServer(app, self.config, "page", agent_uids=self._agent_uids)
        await server.start()
        self._server = server
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self._journal.on_record = self._journal_grew
        bound = server.bound
        assert bound is not None
        self.url = f"http://{bound}/" if bound.path is None else None
        events.emit("supervisor.page_listening", level, listen=str(bound), url=self.url)
        return self.url

    async def aclose(self) -> None:
        if self._journal.on_record == self._journal_grew:
            self._journal.on_record = None
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await publisher
        server, self._server = self._server, None
        for stream in self._streams:
            stream.wake()  # each handler ends: its connection is ended by the server's close
        if server is not None:
            await server.aclose()

    # -- the streams -----------------------------------------------------------------------
    def _journal_grew(self) -> None:
        """`Journal.on_record`: wake the publisher (from any thread), if a stream is open."""
        loop, changed = self._loop, self._changed
        if not self._streams or loop is None or changed is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            changed.set()
        else:
            loop.call_soon_threadsafe(changed.set)

    async def _publish(self) -> None:
        """While a stream is open: look again when the journal grew or every
        `STREAM_REFRESH_SECONDS`, and hand the body to every stream when it changed."""
        changed = self._changed
        assert changed is not None
        sent = self._tail
        while self._streams:
            changed.clear()
            body = self.body(STREAM_REFRESH_SECONDS)
            if self._tail != sent:  # what it shows changed (not only a record it leaves out)
                sent = self._tail
                for stream in self._streams:
                    stream.offer(body)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), STREAM_REFRESH_SECONDS)

    def _publishing(self) -> None:
        if self._publisher is None or self._publisher.done():
            self._publisher = asyncio.get_running_loop().create_task(self._publish())

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        """`/api/stream`: the body now, then the body each time it changes, until the client
        leaves (module doc)."""
        server = self._server
        if server is None:
            raise web.HTTPServiceUnavailable(text="the page is closing\n")
        with server.stream(request) as gone:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            if request.method == "HEAD":
                return response
            stream = _Stream()
            gone.add_done_callback(lambda _: stream.wake())
            self._streams[stream] = None
            try:
                await response.write(f"retry: {RETRY_MS}\n\n".encode() + _event(self.body()))
                self._publishing()
                while not gone.done() and self._server is server:
                    body = await stream.next()
                    if body is not None and not gone.done():
                        await response.write(_event(body))
                        self.pushes += 1
            except (ConnectionError, RuntimeError):  # the client left mid-write
                pass
            finally:
                self._streams.pop(stream, None)
        return response

    def body(self, max_age: float | None = None) -> bytes:
        """`/api/fleet`: what the page shows, nothing more (module doc): `now`, then what was
        built for the current versions of the status and the journal (built anew only when
        one of them changed); usage figures at most `max_age` seconds old (None: the status's
        own age)."""
        source = self._source
        snapshot = source.snapshot() if max_age is None else source.snapshot(max_age)
        versions = (snapshot.version, self._journal.version)
        if versions != self._built:
            built = self._built or (-1, -1)
            if versions[0] != built[0]:
                status = snapshot.status
                center = _json(safe_center(status.get("center")))
                rows = ", ".join(self._agents(status.get("agents") or ()))
                self._fleet_part = f', "center": {center}, "agents": [{rows}]'
            if versions[1] != built[1]:
                newest = self._journal.newest(EVENTS_SHOWN, "supervisor.")
                self._events_part = _json([safe_record(r) for r in newest])
            supervisor = _json({"started_at": self._started_at})
            self._tail = (
                f', "supervisor": {supervisor}{self._fleet_part}, "events": {self._events_part}}}'
            ).encode()
            self._built = versions
            self.builds += 1
        return b'{"now": ' + repr(time.time()).encode() + self._tail

    def _agents(self, rows: Iterable[Any]) -> list[str]:
        """Each row's JSON (`safe_row`), kept while the row is the same object."""
        kept: dict[str, tuple[Mapping[str, Any], str]] = {}
        out = []
        for row in rows:
            if not isinstance(row, Mapping):
                continue
            agent = str(row.get("agent_id"))
            held = self._rows.get(agent)
            if held is None or held[0] is not row:
                held = (row, _json(safe_row(row)))
            kept[agent] = held
            out.append(held[1])
        self._rows = kept
        return out

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method not in _READ:
            raise web.HTTPMethodNotAllowed(request.method, sorted(_READ), text="read-only\n")
        return await handler(request)

    async def _page(self, request: web.Request) -> web.Response:
        """The page, its first table the snapshot's of now (the same bytes a poll gets)."""
        page = render_page(json.loads(self.body()))
        return web.Response(text=page, content_type="text/html", charset="utf-8")

    async def _fleet(self, request: web.Request) -> web.Response:
        return web.Response(body=self.body(), content_type="application/json", charset="utf-8")


class _Stream:
    """One open stream: the newest body it has yet to send (older ones are skipped: a slow
    reader gets the latest, never a queue)."""

    def __init__(self) -> None:
        self._body: bytes | None = None
        self._ready = asyncio.Event()

    def offer(self, body: bytes) -> None:
        self._body = body
        self._ready.set()

    def wake(self) -> None:
        self._ready.set()

    async def next(self) -> bytes | None:
        """The newest body offered (None: woken to end)."""
        await self._ready.wait()
        self._ready.clear()
        body, self._body = self._body, None
        return body


def _event(body: bytes) -> bytes:
    """One server-sent event of `body` (JSON: one line, no newline in it)."""
    return b"data: " + body + b"\n\n"


async def _headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(HEADERS)
