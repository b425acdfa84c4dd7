"""`mcphost ctl`: ask a running supervisor for its agents' status, start/stop/restart one, reload
the fleet, read an agent's log, or run a command as an agent.

    mcphost ctl --state DIR status [AGENT...] [--json]   --json: {"center": {...}, "agents": [...]}
    mcphost ctl --state DIR status --watch [--sort cpu|mem] [--interval S]   (= ctl top)
    mcphost ctl --state DIR start|stop|restart AGENT...
    mcphost ctl --state DIR restart --all
    mcphost ctl --state DIR reload [--dry-run] [--json]
    mcphost ctl --state DIR logs AGENT|--supervisor [--follow] [-n N] [--raw | --escape]
    mcphost ctl --state DIR logs --supervisor [--json | --log-format auto|json|text]
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

`logs --supervisor` prints the supervisor's own events (journal.py): to a terminal as readable
lines (termtext.py's `readable`: local time, level, event, agent, `key=value`, control characters
made visible), to a pipe or file as the journal's JSON lines; `--json` or `--log-format` choose.
`logs` prints
an agent's output, which the agent chose: to a terminal, control characters are
made visible (`escape_controls`: ESC as `^[`, so an OSC 52 clipboard write or a screen clear
is shown, not executed); to a pipe or file, the text is written as it is. `--raw` and
`--escape` force one or the other.

Owns: argument parsing (`mcphost.cliargs.Parser`), `--state` and the socket's path, asking
the supervisor (`control.client`), `status AGENT...`'s choice of rows (`only_agents`), `top`'s
refresh loop, and turning replies into stdout/stderr and exit codes. What it prints of a reply
(the status table after the center's and the limits' lines, `top`'s frames, the one-line
answers, an agent's log text escaped for a terminal) is ctlview.py's.
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
from collections.abc import Callable, Iterable, Mapping, Sequence
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
from mcphost.supervisor.operator.ctlview import (
    ERASE_BELOW,
    HIDE,
    HOME,
    SHOW,
    SORTS,
    center_line,
    clean,
    describe_dry_run,
    describe_result,
    escaped,
    limits_line,
    sort_agents,
    status_table,
    watch_frame,
)
from mcphost.termtext import readable

STATE_ENV = "MCPHOST_STATE"
SOCKET_NAME = "control.sock"
EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_NOT_RUNNING = 0, 1, 2, 3


# -- the arguments -------------------------------------------------------------------------------


def _lines(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a whole number") from None
    if not 0 <= value <= MAX_LOG_LINES:
        raise argparse.ArgumentTypeError(f"expected 0 to {MAX_LOG_LINES}")
    return value


def _seconds(lowest: float, highest: float) -> Callable[[str], float]:
    """An argument of seconds from `lowest` (excluded when it is 0) to `highest`."""

    def seconds(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError("expected seconds") from None
        if not (lowest < value if lowest == 0 else lowest <= value) or not value <= highest:
            raise argparse.ArgumentTypeError(f"expected seconds from {lowest:g} to {highest:g}")
        return value

    return seconds


_timeout = _seconds(0, 86400)
_interval = _seconds(0.1, 3600)


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
    form = logs.add_mutually_exclusive_group()
    form.add_argument(
        "--log-format",
        choices=("auto", "json", "text"),
        help="--supervisor's events as json (the journal's lines), text (one readable line "
        "each) or auto, the default: text on a terminal, json otherwise",
    )
    form.add_argument(
        "--json",
        dest="log_format",
        action="store_const",
        const="json",
        help="--supervisor's events as the journal's JSON lines, even on a terminal",
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


# -- asking and answering ------------------------------------------------------------------------


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
        form = args.log_format or "auto"
        if args.supervisor and (form == "text" or (form == "auto" and out.isatty())):
            texts = readable(texts)  # JSON lines as lines for people, controls made visible
        elif args.escape if args.escape is not None else out.isatty():
            texts = escaped(texts)  # JSON leaves DEL and C1 as they are
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
    agents = [clean(row.get("agent_id")) for row in _status(path, args.timeout)["agents"]]
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
    if args.command == "logs" and args.log_format is not None and not args.supervisor:
        parser.error("--log-format and --json are for --supervisor (an agent's log is its text)")
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
