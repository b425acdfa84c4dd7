"""What `mcphost ctl` prints, from the supervisor's replies (pure: no socket, no clock of its own).

Owns: the status table (`status_table`: one row per agent, `COLUMNS`, fitted to a terminal's
width by `FIT`, the columns that repeat on every row said once below it) with its cells (the
state with an ACP agent's protocol state and a fenced generation, the human uptime, sizes
(values.py `format_size`) and CPU time, the agent's limits and how often it met them, the fence
level, the last exit), the order of
`--sort` (`SORTS`), the center's and the limits' lines above it, `ctl top`'s frame
(`watch_frame`: drawn over the previous one on a terminal), the one-line answers of start,
stop, restart and reload (`describe_result`, `describe_dry_run`; a reload's line per changed fleet
key: `describe_keys`), and the escaping of an agent's
log text for a terminal (`escape_controls`, `escaped`: `cat -v` style).

The command (its arguments, the socket, stdout/stderr and exit codes) is ctl.py, the only
module that imports this one.

Must never: write a control character of a reply to a terminal (every cell goes through `clean`;
log text through `escape_controls` when it is escaped), or import anything heavy (no asyncio,
pydantic or aiohttp: `mcphost ctl` starts fast).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from mcphost.supervisor.values import Reload, format_size

# RST: restarts; SESS: MCP sessions attached; MEM, PEAK: memory now and at its largest (of
# this generation); CPU: CPU time; PROCS: processes; CALLS: center calls/those that failed;
# FENCE ends " (shared uid)" for an agent that runs as the supervisor's own uid (an unprivileged
# supervisor's, or `user = "root"`): the kernel's permissions are then no wall between them.
SHARED_UID = {"shared": " (shared uid)"}
# QUEUE: items waiting in the relay's delivery queue to the agent; MEMMAX, PIDMAX: the agent's
# cgroup limits (`max`: none; `-`: no cgroup backend); OOM: processes of the agent the kernel's
# OOM killer ended, PIDHIT: forks its `pids_max` refused (both since its runner was made, across
# restarts: cgroups.py `LimitEvents`); FENCE: the agent's fence level
# (`sandbox` in --json: probe.py's `Support.level()`, or `none`); EXIT: the last exit and its
# reason, free text, last. Given a width (a terminal's), `status_table` fits it (`FIT`).
COLUMNS = (
    "AGENT", "STATE", "PID", "GEN", "RST", "UPTIME", "SESS", "MEM", "PEAK", "CPU", "PROCS",
    "CALLS", "QUEUE", "MEMMAX", "PIDMAX", "OOM", "PIDHIT", "FENCE", "EXIT",
)  # fmt: skip
# How a table is fitted to a width: columns with nothing in them go first; then, one at a time in
# the order of `REPEATS` while it is still too wide, the columns whose cell is the same on every
# row (of two rows or more: the fence level, a limit every agent has by default, `0` hits), said
# once below the table (`same on every row: FENCE bwrap, MEMMAX 2G`, wrapped to the width); then, step by step until the columns before EXIT
# leave it `EXIT_MIN` characters: ("shrink", column, to) cuts a column's cells to that many
# characters (a cut cell ends in `~`), ("drop", column) leaves it out. AGENT, STATE, MEM, CPU
# and PROCS stay, and STATE is cut only when nothing else is left to drop; EXIT gets what is
# left of the width.
EXIT_MIN = 8
REPEATS = (
    "FENCE", "MEMMAX", "PIDMAX", "OOM", "PIDHIT", "GEN", "RST", "SESS", "QUEUE", "CALLS", "PEAK",
    "UPTIME", "PID",
)  # fmt: skip
FIT: tuple[tuple[Any, ...], ...] = (
    ("shrink", "AGENT", 16),
    ("shrink", "FENCE", 12),
    ("drop", "PEAK"),
    ("drop", "QUEUE"),
    ("drop", "CALLS"),
    ("drop", "GEN"),
    ("drop", "RST"),
    ("drop", "SESS"),
    ("drop", "PIDMAX"),
    ("drop", "MEMMAX"),
    ("drop", "PID"),
    ("drop", "FENCE"),
    ("drop", "UPTIME"),
    ("drop", "PIDHIT"),
    ("drop", "OOM"),
    ("shrink", "STATE", 10),
    ("shrink", "AGENT", 10),
)
SORTS = {"cpu": "cpu_seconds", "mem": "memory_current_bytes"}
_UP_STATES = frozenset({"starting", "running", "stopping"})


# -- cells ---------------------------------------------------------------------------------------


def human_duration(seconds: float) -> str:
    """3m12s, 45s, 2h05m, 3d04h."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def clean(value: Any) -> str:
    """A cell: `-` for null; control characters shown as `?` (no terminal escapes)."""
    if value is None or value == "":
        return "-"
    text = str(value)
    return "".join(ch if ch.isprintable() else "?" for ch in text)


def _state_cell(agent: Mapping[str, Any]) -> str:
    """The state, with `fenced (<code>)` while the center fences the agent's current generation
    (the supervisor is replacing it: `ctl status --json` has the whole `fenced` record)."""
    state = clean(agent.get("state"))
    protocol = agent.get("protocol_state")
    if protocol and agent.get("state") in _UP_STATES:  # an ACP agent: `running, acp busy`
        code = agent.get("state_reason_code")
        state += f", {clean(agent.get('runner'))} {clean(protocol)}"
        state += f" ({clean(code)})" if code else ""
    fenced = agent.get("fenced")
    if isinstance(fenced, Mapping) and fenced.get("generation") == agent.get("generation"):
        return f"{state}, fenced ({clean(fenced.get('code'))})"
    return state


def _exit_cell(agent: Mapping[str, Any]) -> str:
    """`signal 9: killed by SIGKILL`: the last exit and the reason, whichever there are."""
    parts = [agent.get(key) for key in ("last_exit", "last_reason")]
    return clean(": ".join(clean(part) for part in parts if part not in (None, "")))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def human_bytes(value: Any) -> str:
    """512K, 120M, 1.5G (values.py `format_size`, short); `-` when unknown."""
    number = _number(value)
    return "-" if number is None else format_size(number, short=True)


def human_cpu(value: Any) -> str:
    """0.4s, 12s, 3m12s, 2h05m: CPU time; `-` when unknown."""
    seconds = _number(value)
    if seconds is None:
        return "-"
    return f"{seconds:.1f}s" if seconds < 10 else human_duration(seconds)


def _limit_cells(agent: Mapping[str, Any]) -> tuple[str, ...]:
    """MEMMAX, PIDMAX, OOM, PIDHIT: the agent's limits (`max`: none) and the times it met them
    (all `-` without a cgroup: no limits, nothing counted)."""
    limits, usage = agent.get("limits"), agent.get("usage")
    cells = ["-", "-"]
    if isinstance(limits, Mapping):
        memory, pids = limits.get("memory_max"), limits.get("pids_max")
        cells = [
            "max" if memory is None else human_bytes(memory),
            "max" if pids is None else clean(pids),
        ]
    if not isinstance(usage, Mapping):
        return (*cells, "-", "-")
    return (*cells, clean(usage.get("oom_kills")), clean(usage.get("pids_limit_hits")))


def _usage_cells(usage: Any) -> tuple[str, ...]:
    """MEM, PEAK, CPU, PROCS, CALL/ERR, QUEUE of a row's `usage` (all `-` without one)."""
    if not isinstance(usage, Mapping):
        return ("-",) * 6
    calls, errors = _number(usage.get("center_calls")), _number(usage.get("center_errors"))
    return (
        human_bytes(usage.get("memory_current_bytes")),
        human_bytes(usage.get("memory_peak_bytes")),
        human_cpu(usage.get("cpu_seconds")),
        clean(usage.get("processes")),
        f"{int(calls)}/{int(errors or 0)}" if calls else "-",
        clean(usage.get("relay_queue_depth")),
    )


# -- the status table ----------------------------------------------------------------------------


def sort_agents(agents: Sequence[Mapping[str, Any]], by: str | None) -> list[Mapping[str, Any]]:
    """The rows as given, or by `cpu` / `mem` (`SORTS`), largest first, unknown last."""
    if by is None:
        return list(agents)
    key = SORTS[by]

    def figure(agent: Mapping[str, Any]) -> float:
        usage = agent.get("usage")
        value = _number(usage.get(key)) if isinstance(usage, Mapping) else None
        return -1.0 if value is None else float(value)

    return sorted(agents, key=figure, reverse=True)


def status_rows(agents: Sequence[Mapping[str, Any]], now: float) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for agent in agents:
        started = agent.get("started_at")
        up = (
            human_duration(now - started)
            if isinstance(started, int | float)
            and not isinstance(started, bool)
            and agent.get("state") in _UP_STATES
            else "-"
        )
        rows.append(
            (
                clean(agent.get("agent_id")),
                _state_cell(agent),
                clean(agent.get("pid")),
                clean(agent.get("generation")),
                clean(agent.get("restarts")),
                up,
                clean(agent.get("sessions")),
                *_usage_cells(agent.get("usage")),
                *_limit_cells(agent),
                clean(agent.get("sandbox")) + SHARED_UID.get(str(agent.get("identity")), ""),
                _exit_cell(agent),
            )
        )
    return rows


def center_line(center: Any) -> str:
    """`center: ok`, or `center: <code> (<fleet key>): <remedy>`; nothing from an older
    supervisor that does not report it."""
    if not isinstance(center, Mapping):
        return ""
    state = clean(center.get("state"))
    if state == "ok":
        return "center: ok\n\n"
    key = center.get("fleet_key")
    return (
        f"center: {state}"
        + (f" ({clean(key)})" if key else "")
        + f": {clean(center.get('message'))}\n\n"
    )


def limits_line(limits: Any) -> str:
    """`limits: cgroup v1 (...)`, or `limits: none: <why> (agents run without limits)`; nothing
    from a supervisor that does not report it (docs/concepts.md, "Limits")."""
    if not isinstance(limits, Mapping):
        return ""
    if limits.get("backend") == "none":
        return f"limits: none: {clean(limits.get('reason'))} (agents run without limits)\n\n"
    defaults = limits.get("defaults")
    shown = ""
    if isinstance(defaults, Mapping):
        memory = defaults.get("memory_max")
        mib = format_size(memory) if isinstance(memory, int) else "no limit"
        shown = (
            f"; per agent by default: memory {mib}, {clean(defaults.get('pids_max'))} "
            f"processes, cpu weight {clean(defaults.get('cpu_weight'))}"
        )
    return f"limits: cgroup {clean(limits.get('backend'))}{shown}\n\n"


def _cut(cell: str, width: int) -> str:
    return cell if len(cell) <= width else cell[: max(width - 1, 0)] + "~"


def fit_columns(
    rows: list[tuple[str, ...]], width: int | None
) -> tuple[list[list[str]], list[tuple[str, str]]]:
    """`rows` (the header first) fitted to `width` (`FIT`), as lists of cells; and the columns
    left out because every row has the same cell, with that cell (said below the table)."""
    columns = list(COLUMNS)
    table = [list(row) for row in rows]
    repeated: list[tuple[str, str]] = []
    if width is None:
        return table, repeated

    def drop(name: str) -> None:
        at = columns.index(name)
        del columns[at]
        for row in table:
            del row[at]

    def before_exit() -> int:  # the width of every column but EXIT, and the gap before it
        return sum(max(len(row[i]) for row in table) + 2 for i in range(len(columns) - 1))

    for at in range(len(columns) - 2, 1, -1):  # empty columns (only `-`), never AGENT, STATE
        if len(table) > 1 and all(row[at] == "-" for row in table[1:]):
            drop(columns[at])
    exit_width = max(len(row[-1]) for row in table)
    for name in REPEATS:
        if len(table) < 3 or before_exit() + min(exit_width, EXIT_MIN) <= width:
            break
        cells = {row[columns.index(name)] for row in table[1:]} if name in columns else set()
        if len(cells) == 1:
            repeated.append((name, cells.pop()))
            drop(name)
    for step in FIT:
        if before_exit() + min(exit_width, EXIT_MIN) <= width:
            break
        if step[1] not in columns:
            continue
        if step[0] == "drop":
            drop(step[1])
        else:
            at = columns.index(step[1])
            for row in table[1:]:
                row[at] = _cut(row[at], step[2])
    room = max(width - before_exit(), 4)
    for row in table[1:]:
        row[-1] = _cut(row[-1], room)
    return table, repeated


def _packed(head: str, items: Sequence[str], width: int | None) -> list[str]:
    """`head` and `items` joined by ", ", in lines of at most `width` characters broken between
    items (the next lines indented by two), an item longer than a line cut."""
    lines = [head]
    for n, item in enumerate(items):
        piece = item + ("," if n < len(items) - 1 else "")
        if (
            width is not None
            and lines[-1] not in (head, "  ")
            and len(lines[-1]) + 1 + len(piece) > width
        ):
            lines.append("  ")
        joined = lines[-1] + ("" if lines[-1] in (head, "  ") else " ") + piece
        lines[-1] = joined if width is None else _cut(joined, width)
    return lines


def status_table(agents: Sequence[Mapping[str, Any]], now: float, width: int | None = None) -> str:
    """The table, every line at most `width` characters when given (`FIT`; the columns that
    repeat on every row, left out, in one line below it)."""
    rows, repeated = fit_columns([COLUMNS, *status_rows(agents, now)], width)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=True)]
        line = "  ".join(cells).rstrip()
        out.append(line if width is None else line[:width])
    if repeated:
        out += _packed("same on every row: ", [f"{name} {cell}" for name, cell in repeated], width)
    return "\n".join(out) + "\n"


# -- the answers ---------------------------------------------------------------------------------


# A dry run's lists, in the order a reload acts, with what each does to the agents in it.
DRY_RUN_LINES = (
    ("removed", "would stop"),
    ("added", "would start"),
    ("changed", "would restart"),
    ("updated", "would update in place"),
)


def describe_dry_run(result: Mapping[str, Any]) -> str:
    """`ctl reload --dry-run`: one line per kind of change that a reload would make, then one
    per changed fleet key (`describe_keys`)."""
    lines = []
    for key, verb in DRY_RUN_LINES:
        value = result.get(key)
        if isinstance(value, list) and value:
            lines.append(f"{verb}: " + ", ".join(clean(v) for v in value))
    lines += describe_keys(result.get("keys"), dry_run=True)
    return "\n".join(lines) if lines else "would change nothing"


# What a reload did (would do) with a changed key, by the behaviour its field declares
# (values.Reload): (done, dry run), and the same when it touched agents ("{agents}": them).
KEY_VERBS: dict[str, tuple[str, str]] = {
    Reload.LIVE: ("applied", "would apply"),
    Reload.REFENCES: ("applied", "would apply"),
    Reload.RESTARTS_AGENT: ("applied, no agent restarted", "would apply, no agent would restart"),
    Reload.STARTS_STOPS: ("applied", "would apply"),
    Reload.RESTART_SUPERVISOR: (
        "not applied: restart the supervisor to apply it",
        "would not apply: restart the supervisor to apply it",
    ),
    Reload.REFUSED: (
        "refused: restart the supervisor to change it",
        "the reload would be refused (nothing applied): restart the supervisor to change it",
    ),
}
AGENTS_VERBS: dict[str, tuple[str, str]] = {
    Reload.LIVE: ("applied in place ({agents})", "would apply in place ({agents})"),
    Reload.REFENCES: (
        "applied; restarted into the new fence: {agents}",
        "would apply; would restart into the new fence: {agents}",
    ),
    Reload.RESTARTS_AGENT: ("applied, restarted {agents}", "would restart {agents}"),
}


def describe_keys(keys: Any, *, dry_run: bool) -> list[str]:
    """One line per changed fleet key of a reload's reply (`keys`): the key, then what the
    reload did (`dry_run`: would do) with it, by the behaviour its field declares."""
    lines: list[str] = []
    for entry in keys if isinstance(keys, list) else ():
        if not isinstance(entry, Mapping):
            continue
        kind = str(entry.get("reload"))
        agents = entry.get("agents")
        if isinstance(agents, list) and agents and kind in AGENTS_VERBS:
            names = ", ".join(clean(a) for a in agents)
            text = AGENTS_VERBS[kind][dry_run].format(agents=names)
        else:
            text = KEY_VERBS.get(kind, (clean(kind), clean(kind)))[dry_run]
        if entry.get("applied") is False and entry.get("problem"):
            text = f"not applied: {clean(entry['problem'])} (nothing is served there)"
        elif "listen" in entry:
            text += f" (now {clean(entry['listen']) if entry['listen'] else 'off'})"
        lines.append(f"{clean(entry.get('key'))}: {text}")
    return lines


def describe_result(command: str, agent: str | None, result: Any) -> str:
    """One line for start/stop/restart/reload."""
    if isinstance(result, Mapping):
        if command == "reload":
            parts = []
            for key in ("added", "removed", "changed", "updated", "unchanged"):
                value = result.get(key)
                if isinstance(value, list) and (value or key != "updated"):
                    names = ", ".join(clean(v) for v in value)
                    parts.append(f"{len(value)} {key}" + (f" ({names})" if names else ""))
            if parts:
                return "\n".join(
                    [
                        "reloaded: " + "; ".join(parts),
                        *describe_keys(result.get("keys"), dry_run=False),
                    ]
                )
        else:
            bits = [
                f"{k} {clean(result[k])}" for k in ("state", "pid", "generation") if k in result
            ]
            if result.get("already"):
                bits.insert(0, f"already {clean(result['already'])}")
            if bits:
                return f"{clean(result.get('agent_id', agent))}: {', '.join(bits)}"
    if result is None:
        return f"{command}: done"
    return json.dumps(result, ensure_ascii=False)


# -- ctl top -------------------------------------------------------------------------------------


# ANSI: cursor home, erase to the end of the line / of the screen, hide / show the cursor
HOME, ERASE_LINE, ERASE_BELOW, HIDE, SHOW = "\x1b[H", "\x1b[K", "\x1b[J", "\x1b[?25l", "\x1b[?25h"


def watch_frame(
    result: Mapping[str, Any],
    now: float,
    *,
    sort: str | None,
    interval: float,
    size: tuple[int, int] | None,
) -> str:
    """One refresh of `ctl top`: a title line, the center's line and the table; for a terminal
    of `size` (columns, lines), fitted to it (rows beyond its height summed up in one line)
    and drawn over the previous frame (cursor home, each line erased to its end, the rest of
    the screen erased); plain text ending in a blank line otherwise."""
    agents = sort_agents(result.get("agents") or [], sort)
    title = (
        f"mcphost top: {len(agents)} agents, every {interval:g}s, "
        f"sorted by {sort or 'agent'}, {time.strftime('%H:%M:%S', time.localtime(now))}"
    )
    width = size[0] if size is not None else None
    lines = [title, *center_line(result.get("center")).splitlines()]
    table = status_table(agents, now, width).splitlines()
    if size is not None:
        room = max(size[1] - len(lines) - 1, 2)  # the last line stays free (no scrolling)
        if len(table) > room:
            hidden = len(table) - room + 1
            table = [*table[: room - 1], f"... {hidden} more (a taller terminal shows them)"]
    lines += table
    if size is None:
        return "\n".join(lines) + "\n\n"
    return HOME + "".join(line[: size[0]] + ERASE_LINE + "\n" for line in lines) + ERASE_BELOW


# -- an agent's log text -------------------------------------------------------------------------


def _caret_table() -> dict[int, str]:
    table = {c: "^" + chr(c + 0x40) for c in range(0x20) if c not in (0x09, 0x0A)}
    table[0x7F] = "^?"
    table.update({c: "M-^" + chr(c - 0x80 + 0x40) for c in range(0x80, 0xA0)})
    return table


_CARETS = _caret_table()


def escape_controls(text: str) -> str:
    """`text` with every control character but LF and TAB made visible, as `cat -v` shows them:
    C0 as `^@`..`^_` (ESC `^[`, CR `^M`), DEL as `^?`, C1 (U+0080..U+009F) as `M-^@`..`M-^_`.
    A CR right before an LF is dropped (a terminal line end shows as one). Pure."""
    return text.replace("\r\n", "\n").translate(_CARETS)


def escaped(chunks: Iterable[str]) -> Iterator[str]:
    """`escape_controls` over a stream of chunks: a CR that ends a chunk waits for the next
    one, so a CRLF split between two chunks is still one line end."""
    held = ""
    for chunk in chunks:
        text = held + chunk
        held = "\r" if text.endswith("\r") else ""
        if text := text[: len(text) - len(held)]:
            yield escape_controls(text)
    if held:
        yield escape_controls(held)
