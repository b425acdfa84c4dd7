"""`mcphost ctl`: ask a running supervisor for its agents' status, start/stop/restart one, reload
the fleet, read an agent's log, or run a command as an agent.

    mcphost ctl --state DIR status [AGENT...] [--json]   --json: {"center": {...}, "agents": [...]}
    mcphost ctl --state DIR status --watch [--sort cpu|mem] [--interval S]   (= ctl top)
    mcphost ctl --state DIR start|stop|restart AGENT...
    mcphost ctl --state DIR restart --all
    mcphost ctl --state DIR reload [--dry-run] [--json]
    mcphost ctl --state DIR logs AGENT|--supervisor [--follow] [-n N] [--raw | --escape]
    mcphost ctl --state DIR exec AGENT -- CMD [ARGS...]

`--state` may also come after the command, or from `MCPHOST_STATE`. The socket is
`<state>/control.sock` (see `mcphost.supervisor.control.protocol` for the protocol).

An AGENT that is not an agent id (names.py's grammar) is refused without being shown (it may be
a token typed in the wrong place). An AGENT the fleet lacks is refused by every command that
takes one (`unknown_agent`, exit 2), and nothing is done to the others given with it: the
supervisor checks them all first (start, stop, restart, logs, exec), ctl itself for `status
AGENT...` (`only_agents`). The refusal names such an id when it is close to one of the fleet's
(a typo, with the closest), else only counts it, and says how many agents the fleet file
defines (`control.protocol.unknown_agents`).

Exit codes: 0 done; 1 the supervisor refused (`mcphost ctl: <message> (<code>)` on stderr), or
the socket shut us out; 2 usage, an AGENT the fleet lacks included (`unknown_agent`); 3 no
supervisor is running on that state directory.

`exec` hands our stdin, stdout and stderr to the supervisor (SCM_RIGHTS), which runs CMD inside
the agent (its environment, workspace, user and identity; see `Operations.exec`); ctl then
waits and exits with CMD's status (128+N when a signal N ended it), or 127 (not found) / 126
(cannot run) when CMD could not start. SIGINT, SIGTERM and SIGHUP to ctl are forwarded to
CMD's process group; if ctl dies, its connection closes and the supervisor ends CMD's group.
A refusal before CMD started exits 1 as above (`agent_not_running`, ...), 2 for `unknown_agent`.

`logs --supervisor` prints the supervisor's own events (JSON lines, journal.py). `logs` prints
an agent's output, which the agent chose: to a terminal, control characters are
made visible (`escape_controls`: ESC as `^[`, so an OSC 52 clipboard write or a screen clear
is shown, not executed); to a pipe or file, the text is written as it is. `--raw` and
`--escape` force one or the other.

Owns: argument parsing (`mcphost.cliargs.Parser`), the status table (after the center's health:
`center: ok`, or its code, the fleet key and the remedy; `limits:`, the cgroup backend or why
there is none; a column with each agent's fence level)
and the human uptime, the escaping of log text for a terminal, and turning replies into
stdout/stderr and exit codes.
Must never: import anything heavy (no asyncio, pydantic or aiohttp: an operator tool starts
fast), print a traceback, echo an argument it did not recognise, or write an agent's control
characters to a terminal unless asked to (`--raw`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from mcphost.cliargs import Parser
from mcphost.names import AGENT_ID_EXPECTED, is_agent_id
from mcphost.supervisor import refusals as R
from mcphost.supervisor.control.client import NotRunning, request, stream_logs
from mcphost.supervisor.control.protocol import (
    DEFAULT_LOG_LINES,
    MAX_LOG_LINES,
    ControlError,
    unknown_agents,
)

STATE_ENV = "MCPHOST_STATE"
SOCKET_NAME = "control.sock"
EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_NOT_RUNNING = 0, 1, 2, 3
# RST: restarts; SESS: MCP sessions attached; MEM, PEAK: memory now and at its largest (of
# this generation); CPU: CPU time; PROCS: processes; CALLS: center calls/those that failed;
# FENCE ends " (shared uid)" for an agent that runs as the supervisor's own uid (an unprivileged
# supervisor's, or `user = "root"`): the kernel's permissions are then no wall between them.
SHARED_UID = {"shared": " (shared uid)"}
# QUEUE: items waiting in the relay's delivery queue to the agent; FENCE: the agent's fence level
# (`sandbox` in --json: fence.py's `Support.level()`, or `none`); EXIT: the last exit and its
# reason, free text, last. Given a width (a terminal's), `status_table` fits it (`FIT`).
COLUMNS = (
    "AGENT", "STATE", "PID", "GEN", "RST", "UPTIME", "SESS", "MEM", "PEAK", "CPU", "PROCS",
    "CALLS", "QUEUE", "FENCE", "EXIT",
)  # fmt: skip
# How a table is fitted to a width: columns with nothing in them go first; then, step by step
# until the columns before EXIT leave it `EXIT_MIN` characters: ("shrink", column, to) cuts a
# column's cells to that many characters (a cut cell ends in `~`), ("drop", column) leaves it
# out. AGENT, STATE, MEM, CPU and PROCS stay; EXIT gets what is left of the width.
EXIT_MIN = 8
FIT: tuple[tuple[Any, ...], ...] = (
    ("shrink", "AGENT", 16),
    ("shrink", "FENCE", 12),
    ("drop", "PEAK"),
    ("drop", "QUEUE"),
    ("drop", "CALLS"),
    ("drop", "GEN"),
    ("drop", "RST"),
    ("drop", "SESS"),
    ("shrink", "STATE", 10),
    ("drop", "PID"),
    ("drop", "FENCE"),
    ("drop", "UPTIME"),
    ("shrink", "AGENT", 10),
)
SORTS = {"cpu": "cpu_seconds", "mem": "memory_current_bytes"}
_UP_STATES = frozenset({"starting", "running", "stopping"})


def _lines(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a whole number") from None
    if not 0 <= value <= MAX_LOG_LINES:
        raise argparse.ArgumentTypeError(f"expected 0 to {MAX_LOG_LINES}")
    return value


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected seconds") from None
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError("expected seconds from 0 to 86400")
    return value


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected seconds") from None
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError("expected seconds from 0.1 to 3600")
    return value


def _agent(text: str) -> str:
    """An AGENT argument: an agent id, else refused without showing it (it may be a token)."""
    if not is_agent_id(text):
        raise argparse.ArgumentTypeError(
            f"not an agent id (value not shown): expected {AGENT_ID_EXPECTED}"
        )
    return text


def _parser() -> Parser:
    state_help = f"the supervisor's --state directory (default: ${STATE_ENV})"
    common = Parser(add_help=False)
    # SUPPRESS: a subcommand that is not given --state must not reset the top-level one
    common.add_argument("--state", default=argparse.SUPPRESS, help=state_help)
    common.add_argument(
        "--timeout",
        type=_timeout,
        default=argparse.SUPPRESS,
        help="seconds to wait for an answer (default 120; a follow waits forever)",
    )
    p = Parser(
        prog="mcphost ctl",
        description="Control a running `mcphost supervise`.",
        epilog="exit codes: 0 done, 1 refused, 2 usage, 3 no supervisor running",
    )
    p.add_argument("--state", default=None, help=state_help)
    p.add_argument("--timeout", type=_timeout, default=120.0, help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    status = sub.add_parser("status", parents=[common], help="every agent's state (a table)")
    status.add_argument("--json", action="store_true", help="the status list as JSON")
    top = sub.add_parser("top", parents=[common], help="= status --watch: a live table")
    for one in (status, top):
        one.add_argument(
            "agents",
            metavar="AGENT",
            nargs="*",
            type=_agent,
            help="only these agents (default: all)",
        )
        if one is status:
            one.add_argument(
                "--watch",
                action="store_true",
                help="refresh the table every --interval seconds until ^C (in place on a terminal)",
            )
        one.add_argument(
            "--sort", choices=sorted(SORTS), default=None, help="largest first: cpu or mem"
        )
        one.add_argument(
            "--interval",
            type=_interval,
            default=2.0,
            help="seconds between two refreshes of --watch (default 2)",
        )
    for name, text in (
        ("start", "start stopped or failed agents"),
        ("stop", "stop agents (each stays stopped until start or a supervisor restart)"),
        ("restart", "stop and start agents (a new generation; clears a failed state)"),
    ):
        one = sub.add_parser(name, parents=[common], help=text)
        agents = "AGENT... (all checked first: one the fleet lacks, and nothing is done)"
        one.add_argument(
            "agents", metavar="AGENT", nargs="*" if name == "restart" else "+", type=_agent,
            help=agents,
        )  # fmt: skip
        if name == "restart":
            one.add_argument("--all", action="store_true", help="restart every agent, one by one")
    reload = sub.add_parser(
        "reload", parents=[common], help="re-read the fleet and reconcile (= SIGHUP)"
    )
    reload.add_argument(
        "--dry-run",
        action="store_true",
        help="say what a reload would stop, start, restart and update in place; change nothing",
    )
    reload.add_argument("--json", action="store_true", help="the answer as JSON")
    logs = sub.add_parser(
        "logs", parents=[common], help="an agent's output (its log's tail), or the supervisor's"
    )
    logs.add_argument("agent", metavar="AGENT", nargs="?", type=_agent)
    logs.add_argument(
        "--supervisor",
        action="store_true",
        help="the supervisor's own events (<state>/logs/supervisor.log) instead of an agent's",
    )
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new output")
    logs.add_argument(
        "-n",
        "--lines",
        type=_lines,
        default=DEFAULT_LOG_LINES,
        help=f"lines from the end to start with (default {DEFAULT_LOG_LINES})",
    )
    shown = logs.add_mutually_exclusive_group()
    shown.add_argument(
        "--raw",
        dest="escape",
        action="store_false",
        default=None,
        help="write the agent's control characters as they are, even to a terminal (default: "
        "made visible on a terminal, ESC as ^[, as they are on a pipe)",
    )
    shown.add_argument(
        "--escape",
        dest="escape",
        action="store_true",
        help="make control characters visible on a pipe too",
    )
    run = sub.add_parser(
        "exec",
        parents=[common],
        help="run a command as an agent (in its tree: its MCP servers attach as the agent)",
        usage="mcphost ctl exec [--state DIR] AGENT -- CMD [ARGS...]",
    )
    run.add_argument("agent", metavar="AGENT", type=_agent)
    run.add_argument("argv", metavar="CMD", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return p


# -- rendering (pure) ----------------------------------------------------------------------------


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


def _clean(value: Any) -> str:
    """A cell: `-` for null; control characters shown as `?` (no terminal escapes)."""
    if value is None or value == "":
        return "-"
    text = str(value)
    return "".join(ch if ch.isprintable() else "?" for ch in text)


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


def _state_cell(agent: Mapping[str, Any]) -> str:
    """The state, with `fenced (<code>)` while the center fences the agent's current generation
    (the supervisor is replacing it: `ctl status --json` has the whole `fenced` record)."""
    state = _clean(agent.get("state"))
    protocol = agent.get("protocol_state")
    if protocol and agent.get("state") in _UP_STATES:  # an ACP agent: `running, acp busy`
        code = agent.get("state_reason_code")
        state += f", {_clean(agent.get('runner'))} {_clean(protocol)}"
        state += f" ({_clean(code)})" if code else ""
    fenced = agent.get("fenced")
    if isinstance(fenced, Mapping) and fenced.get("generation") == agent.get("generation"):
        return f"{state}, fenced ({_clean(fenced.get('code'))})"
    return state


def _exit_cell(agent: Mapping[str, Any]) -> str:
    """`signal 9: killed by SIGKILL`: the last exit and the reason, whichever there are."""
    parts = [agent.get(key) for key in ("last_exit", "last_reason")]
    return _clean(": ".join(_clean(part) for part in parts if part not in (None, "")))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def human_bytes(value: Any) -> str:
    """512K, 120M, 1.5G (binary units, at most 5 characters); `-` when unknown."""
    number = _number(value)
    if number is None:
        return "-"
    for unit in ("B", "K", "M", "G", "T"):
        if number < 1024 or unit == "T":
            break
        number /= 1024
    if unit == "B":
        return f"{int(number)}B"
    return f"{number:.1f}{unit}" if number < 10 else f"{int(number)}{unit}"


def human_cpu(value: Any) -> str:
    """0.4s, 12s, 3m12s, 2h05m: CPU time; `-` when unknown."""
    seconds = _number(value)
    if seconds is None:
        return "-"
    return f"{seconds:.1f}s" if seconds < 10 else human_duration(seconds)


def _usage_cells(usage: Any) -> tuple[str, ...]:
    """MEM, PEAK, CPU, PROCS, CALL/ERR, QUEUE of a row's `usage` (all `-` without one)."""
    if not isinstance(usage, Mapping):
        return ("-",) * 6
    calls, errors = _number(usage.get("center_calls")), _number(usage.get("center_errors"))
    return (
        human_bytes(usage.get("memory_current_bytes")),
        human_bytes(usage.get("memory_peak_bytes")),
        human_cpu(usage.get("cpu_seconds")),
        _clean(usage.get("processes")),
        f"{int(calls)}/{int(errors or 0)}" if calls else "-",
        _clean(usage.get("relay_queue_depth")),
    )


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
                _clean(agent.get("agent_id")),
                _state_cell(agent),
                _clean(agent.get("pid")),
                _clean(agent.get("generation")),
                _clean(agent.get("restarts")),
                up,
                _clean(agent.get("sessions")),
                *_usage_cells(agent.get("usage")),
                _clean(agent.get("sandbox")) + SHARED_UID.get(str(agent.get("identity")), ""),
                _exit_cell(agent),
            )
        )
    return rows


def center_line(center: Any) -> str:
    """`center: ok`, or `center: <code> (<fleet key>): <remedy>`; nothing from an older
    supervisor that does not report it."""
    if not isinstance(center, Mapping):
        return ""
    state = _clean(center.get("state"))
    if state == "ok":
        return "center: ok\n\n"
    key = center.get("fleet_key")
    return (
        f"center: {state}"
        + (f" ({_clean(key)})" if key else "")
        + f": {_clean(center.get('message'))}\n\n"
    )


def limits_line(limits: Any) -> str:
    """`limits: cgroup v1 (...)`, or `limits: none: <why> (agents run without limits)`; nothing
    from a supervisor that does not report it (docs/supervisor.md, "Limits")."""
    if not isinstance(limits, Mapping):
        return ""
    if limits.get("backend") == "none":
        return f"limits: none: {_clean(limits.get('reason'))} (agents run without limits)\n\n"
    defaults = limits.get("defaults")
    shown = ""
    if isinstance(defaults, Mapping):
        memory = defaults.get("memory_max")
        mib = f"{memory >> 20} MiB" if isinstance(memory, int) else "no limit"
        shown = (
            f"; per agent by default: memory {mib}, {_clean(defaults.get('pids_max'))} "
            f"processes, cpu weight {_clean(defaults.get('cpu_weight'))}"
        )
    return f"limits: cgroup {_clean(limits.get('backend'))}{shown}\n\n"


def _cut(cell: str, width: int) -> str:
    return cell if len(cell) <= width else cell[: max(width - 1, 0)] + "~"


def fit_columns(rows: list[tuple[str, ...]], width: int | None) -> list[list[str]]:
    """`rows` (the header first) fitted to `width` (`FIT`), as lists of cells."""
    columns = list(COLUMNS)
    table = [list(row) for row in rows]
    if width is None:
        return table

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
    return table


def status_table(agents: Sequence[Mapping[str, Any]], now: float, width: int | None = None) -> str:
    """The table, every line at most `width` characters when given (`FIT`)."""
    rows = fit_columns([COLUMNS, *status_rows(agents, now)], width)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=True)]
        line = "  ".join(cells).rstrip()
        out.append(line if width is None else line[:width])
    return "\n".join(out) + "\n"


# A dry run's lists, in the order a reload acts, with what each does to the agents in it.
DRY_RUN_LINES = (
    ("removed", "would stop"),
    ("added", "would start"),
    ("changed", "would restart"),
    ("updated", "would update in place"),
)


def describe_dry_run(result: Mapping[str, Any]) -> str:
    """`ctl reload --dry-run`: one line per kind of change that a reload would make."""
    lines = []
    for key, verb in DRY_RUN_LINES:
        value = result.get(key)
        if isinstance(value, list) and value:
            lines.append(f"{verb}: " + ", ".join(_clean(v) for v in value))
    return "\n".join(lines) if lines else "would change nothing"


def describe_result(command: str, agent: str | None, result: Any) -> str:
    """One line for start/stop/restart/reload."""
    if isinstance(result, Mapping):
        if command == "reload":
            parts = []
            for key in ("added", "removed", "changed", "updated", "unchanged"):
                value = result.get(key)
                if isinstance(value, list) and (value or key != "updated"):
                    names = ", ".join(_clean(v) for v in value)
                    parts.append(f"{len(value)} {key}" + (f" ({names})" if names else ""))
            if parts:
                return "reloaded: " + "; ".join(parts)
        else:
            bits = [
                f"{k} {_clean(result[k])}" for k in ("state", "pid", "generation") if k in result
            ]
            if result.get("already"):
                bits.insert(0, f"already {_clean(result['already'])}")
            if bits:
                return f"{_clean(result.get('agent_id', agent))}: {', '.join(bits)}"
    if result is None:
        return f"{command}: done"
    return json.dumps(result, ensure_ascii=False)


# -- main ----------------------------------------------------------------------------------------


def _fail(message: str, code: str) -> int:
    """Say the refusal; its exit code: 2 (usage) for an AGENT the fleet lacks, else 1."""
    print(f"mcphost ctl: {message} ({code})", file=sys.stderr)
    return EXIT_USAGE if code == R.UNKNOWN_AGENTS.code else EXIT_REFUSED


def _exec(args: argparse.Namespace, path: str) -> int:
    import signal

    from mcphost.supervisor.control.client import ExecClient

    client = ExecClient(path, args.agent, list(args.argv))

    def forward(signum: int, _frame: object) -> None:
        client.signal(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    try:
        code = client.wait()
    except ControlError as exc:
        if exc.code == "exec_failed":
            print(f"mcphost ctl: {exc.message} ({exc.code})", file=sys.stderr)
            return 127 if exc.details.get("not_found") else 126
        raise
    return code if code >= 0 else 128 - code


def _status(path: str, timeout: float, only: Sequence[str] = ()) -> dict[str, Any]:
    """The supervisor's status, `{"center", "agents", ...}`, its rows those of `only` when given
    (`ControlError` `unknown_agent`: `only_agents`); `ControlError` when it is not one."""
    result = request(path, "status", timeout=timeout)
    if isinstance(result, list):  # a supervisor from before the center's health
        result = {"center": None, "agents": result}
    if not isinstance(result, dict) or not isinstance(result.get("agents"), list):
        raise ControlError.row(R.REPLY_NOT_STATUS)
    if only:
        return {**result, "agents": only_agents(result["agents"], only, result.get("fleet"))}
    return result


def only_agents(rows: Sequence[Any], only: Sequence[str], fleet: Any = None) -> list[Any]:
    """The status rows of the agents `only` names, in the fleet's order (pure); `ControlError`
    `unknown_agent` for those the fleet does not have, as the supervisor refuses them
    (`control.protocol.unknown_agents`; `fleet`: the status's, where the agents come from)."""
    known = [str(row.get("agent_id")) for row in rows if isinstance(row, Mapping)]
    unknown = [agent for agent in only if agent not in known]
    if unknown:
        raise unknown_agents(unknown, known, fleet if isinstance(fleet, Mapping) else None)
    return [row for row in rows if isinstance(row, Mapping) and row.get("agent_id") in only]


def _terminal_size() -> tuple[int, int]:
    """stdout's terminal's (columns, lines); 80x24 when it says nothing (not `shutil`'s: its
    import costs ctl's start more than the rest of it)."""
    try:
        size = os.get_terminal_size(sys.stdout.fileno())
    except (OSError, ValueError):
        return 80, 24
    return (size.columns or 80, size.lines or 24)


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


def _watch(args: argparse.Namespace, path: str) -> int:
    """`status --watch` / `top`: a frame every `--interval` seconds until ^C (main's
    KeyboardInterrupt: exit 0)."""
    out = sys.stdout
    tty = out.isatty()
    if getattr(args, "json", False):
        return _fail("--watch shows the table; --json gives one status", "usage")
    try:
        if tty:
            out.write(HIDE + HOME + ERASE_BELOW)
        while True:
            result = _status(path, args.timeout, args.agents)
            size = _terminal_size() if tty else None
            out.write(
                watch_frame(result, time.time(), sort=args.sort, interval=args.interval, size=size)
            )
            out.flush()
            time.sleep(args.interval)
    finally:
        if tty:
            out.write(SHOW)
            out.flush()


def _run(args: argparse.Namespace, path: str) -> int:
    if args.command == "exec":
        return _exec(args, path)
    if args.command == "logs":
        out = sys.stdout
        texts: Iterable[str] = stream_logs(
            path, args.agent, lines=args.lines, follow=args.follow, timeout=args.timeout
        )
        if args.escape if args.escape is not None else out.isatty():
            texts = escaped(texts)
        for text in texts:
            out.write(text)
            out.flush()
        return EXIT_OK
    if args.command in ("status", "top"):
        if args.command == "top" or args.watch:
            return _watch(args, path)
        result = _status(path, args.timeout, args.agents)
        if args.json:
            sys.stdout.write(json.dumps(result, ensure_ascii=False, indent=2) + "\n")
        else:
            width = _terminal_size()[0] if sys.stdout.isatty() else None
            sys.stdout.write(center_line(result.get("center")))
            sys.stdout.write(limits_line(result.get("limits")))
            agents = sort_agents(result["agents"], args.sort)
            sys.stdout.write(status_table(agents, time.time(), width))
        return EXIT_OK
    if args.command == "restart" and args.all:
        return _restart_all(args, path)
    fields: dict[str, Any] = {}
    if args.command in ("start", "stop", "restart"):
        ids = list(dict.fromkeys(args.agents))
        # one: "agent", as every supervisor takes it; several: "agents", checked all at once
        if len(ids) == 1:
            fields["agent"] = ids[0]
        else:
            fields["agents"] = ids
        result = request(path, args.command, timeout=args.timeout, **fields)
        results = [result]
        if len(ids) > 1 and isinstance(result, dict) and isinstance(result.get("agents"), list):
            results = result["agents"]
        for agent, one in zip(ids, results, strict=False):
            print(describe_result(args.command, agent, one))
        return EXIT_OK
    if args.command == "reload" and args.dry_run:
        fields["dry_run"] = True
    result = request(path, args.command, timeout=args.timeout, **fields)
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(result, ensure_ascii=False, indent=2) + "\n")
    elif args.command == "reload" and args.dry_run and isinstance(result, Mapping):
        print(describe_dry_run(result))
    else:
        print(describe_result(args.command, None, result))
    return EXIT_OK


def _restart_all(args: argparse.Namespace, path: str) -> int:
    """`restart --all`: every agent of the fleet, one after the other (a line each); a
    refusal for one (an agent a reload removed meanwhile, say) is printed and the others still
    restarted (exit 1 then)."""
    agents = [_clean(row.get("agent_id")) for row in _status(path, args.timeout)["agents"]]
    code = EXIT_OK
    for agent in agents:
        try:
            result = request(path, "restart", timeout=args.timeout, agent=agent)
        except ControlError as exc:
            _fail(exc.message, exc.code)
            code = EXIT_REFUSED
            continue
        print(describe_result("restart", agent, result))
    return code


def _parse(argv: list[str]) -> argparse.Namespace:
    """Parse; for `exec`, everything after the first `--` is the command, taken verbatim."""
    parser = _parser()
    cut = argv.index("--") if "--" in argv else len(argv)
    if "exec" in argv[:cut] and cut < len(argv):
        args = parser.parse_args(argv[:cut])
        if args.command == "exec":
            args.argv = [*args.argv, *argv[cut + 1 if not args.argv else cut :]]
            return _checked_exec(parser, args)
    args = parser.parse_args(argv)
    if args.command == "logs" and (args.agent is None) == (not args.supervisor):
        parser.error("logs needs an AGENT or --supervisor (one of them)")
    if args.command == "restart" and (not args.agents) == (not args.all):
        parser.error("restart needs AGENTs or --all (one of them)")
    return _checked_exec(parser, args) if args.command == "exec" else args


def _checked_exec(parser: Parser, args: argparse.Namespace) -> argparse.Namespace:
    if args.argv[:1] == ["--"]:
        args.argv = args.argv[1:]
    if not args.argv:
        parser.error("exec needs a command: mcphost ctl exec AGENT -- CMD [ARGS...]")
    return args


def main(argv: list[str]) -> int:
    args = _parse(argv)
    state = args.state or os.environ.get(STATE_ENV, "").strip()
    if not state:
        print(
            f"mcphost ctl: give --state DIR (the supervisor's) or set {STATE_ENV}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    path = os.path.join(os.path.abspath(state), SOCKET_NAME)
    try:
        return _run(args, path)
    except NotRunning as exc:
        print(
            f"mcphost ctl: no supervisor is running on {state} ({exc.path}: {exc.reason}); "
            f"start it with `mcphost supervise --state {state} ...`",
            file=sys.stderr,
        )
        return EXIT_NOT_RUNNING
    except ControlError as exc:
        return _fail(exc.message, exc.code)
    except PermissionError:
        return _fail(
            f"cannot use {path}: permission denied; run `mcphost ctl` as the supervisor's user "
            "or root",
            "permission_denied",
        )
    except TimeoutError:
        return _fail(
            f"no answer from the supervisor within {args.timeout:g} s (it may still be working; "
            "check `mcphost ctl status`)",
            "timeout",
        )
    except KeyboardInterrupt:
        return EXIT_OK  # Ctrl-C ends a follow
    except BrokenPipeError:
        # stdout closed early (`| head`): not an error; keep Python from complaining at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except OSError as exc:
        return _fail(f"cannot talk to the supervisor at {path}: {exc.strerror}", "io_error")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
