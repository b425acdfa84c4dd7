"""The control socket's wire protocol (pure): what `mcphost ctl` and the supervisor both speak.

Owns: the request grammar (`parse_request`, `parse_signal`), the reply encoding (`encode`), its
bounds, the reading of a line either way as one JSON object (`decode`), and `ControlError` (a
refusal with a stable code, from `mcphost.supervisor.refusals`). The asyncio server is
`control.server`, the blocking client `control.client`.

Protocol: one connection, one request. The client sends one JSON line (at most `MAX_LINE` bytes
including the newline)

    {"op": "status" | "start" | "stop" | "restart" | "reload" | "logs" | "exec",
     "agent": "<id>",        start, stop, restart, logs, exec: required; otherwise refused
     "agents": ["<id>", ...] start, stop, restart: instead of "agent", 1..MAX_AGENTS ids, all
                             checked before any is acted on (one unknown: nothing is done)
     "supervisor": true,     logs only, instead of "agent": the supervisor's own events
     "lines": N,             logs only: 0..MAX_LOG_LINES, default 50
     "follow": bool,         logs only: default false
     "dry_run": bool,        reload only: default false (say what it would do, change nothing)
     "argv": ["cmd", ...]}   exec only: required, 1..MAX_ARGV strings without NUL

and the server answers JSON lines, then closes:

    {"ok": true, "result": <JSON>}                                     every op but logs, exec
                                       (with "agents": {"agents": [<one result per id>, ...]})
    {"ok": false, "error": {"code": "...", "message": "...", "details": {...}}}
    {"log": "<text chunk>"} ... {"ok": true, "end": true}              logs (an error may end it)
    {"ok": true, "started": {...}} ... {"ok": true, "exit": {"code": N, "status": "exit 7"}}
                                                                       exec (N < 0: that signal)

With `follow`, the log lines keep coming until the client closes (or half-closes) its side; the
server then stops reading the log. Codes are stable, every one of them in the table of
`mcphost.supervisor.refusals` (`bad_request`, `unknown_op`, `request_too_large`,
`forbidden_peer`, `busy`, `internal`, and the operations' `unknown_agent`, `reload_failed`,
`agent_not_running`, `exec_failed`, ...). `unknown_agent` is built in one place for the server and
for ctl's own filter (`unknown_agents`).

Exec: the request line is sent with exactly three file descriptors attached (`SCM_RIGHTS`: the
client's stdin, stdout, stderr), in the same `sendmsg`. After `started`, the client may send
`{"op": "signal", "signal": "SIGINT"}` lines (one of `EXEC_SIGNALS`), delivered to the command's
process group; anything else it sends is ignored. The client must send nothing after the request
until it has read `started`. When the command exits, the server sends `exit` and closes; when the
client's side closes first, the server ends the command's process group.

Must never: import anything beyond the stdlib's json and the refusals table at module level (both
ends import it; `mcphost ctl` must start fast: `signal` and `difflib` only in the function that
needs them), echo more than 80 characters of a value it refuses, or show an unknown agent id
that is like none of the fleet's (`unknown_agents`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Self

from mcphost.errors import CodedFailure
from mcphost.supervisor import refusals as R
from mcphost.supervisor.refusals import Refusal

MAX_LINE = 64 * 1024  # a request line, newline included
MAX_REPLY_LINE = 64 * 1024 * 1024  # what the client accepts per reply line (status of a big fleet)
MAX_LOG_LINES = 100_000
DEFAULT_LOG_LINES = 50
MAX_AGENT_CHARS = 256
MAX_AGENTS = 1024  # start, stop, restart: ids in one request
LOG_CHUNK = 16 * 1024  # bytes of log text per {"log": ...} line
MAX_ARGV = 4096  # exec: arguments of the command
EXEC_FDS = 3  # exec: stdin, stdout, stderr, in that order

# What `ctl exec` may forward to the command's process group (by name: numbers differ by arch).
EXEC_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGKILL", "SIGUSR1", "SIGUSR2")

OPS = ("status", "start", "stop", "restart", "reload", "logs", "exec")
_AGENT_OPS = frozenset({"logs", "exec"})
_AGENTS_OPS = frozenset({"start", "stop", "restart"})  # "agent", or several: "agents"
_FIELDS = {
    "status": frozenset({"op"}),
    "reload": frozenset({"op", "dry_run"}),
    "start": frozenset({"op", "agent", "agents"}),
    "stop": frozenset({"op", "agent", "agents"}),
    "restart": frozenset({"op", "agent", "agents"}),
    "logs": frozenset({"op", "agent", "supervisor", "lines", "follow"}),
    "exec": frozenset({"op", "agent", "argv"}),
}


class ControlError(CodedFailure):
    """A refusal on the control socket: a stable snake_case `code`, a `message` that says what
    to do, and JSON `details`. The handler raises it; the client raises it for `ok: false`."""

    shows_code = True
    details: dict[str, Any]

    def __init__(self, code: str, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(code, message, details or {})

    def wire(self) -> dict[str, Any]:
        return {
            "ok": False,
            "error": {"code": self.code, "message": self.message, "details": self.details},
        }

    @classmethod
    def row(cls, refusal: Refusal, details: dict[str, Any] | None = None, **fields: Any) -> Self:
        """The refusal `refusal` of the table, its message filled with `fields`."""
        return cls(refusal.code, refusal.message(**fields), details)


# -- the request grammar (pure) ----------------------------------------------------------------


def decode(line: bytes, not_json: R.Refusal, not_object: R.Refusal) -> dict[str, Any]:
    """One line of the wire, either way, as the JSON object it must be; else `ControlError` of
    `not_json` or `not_object` (the request's refusals, or the client's for a reply)."""
    try:
        body = json.loads(line)
    except (ValueError, RecursionError):
        raise ControlError.row(not_json) from None
    if not isinstance(body, dict):
        raise ControlError.row(not_object)
    return body


def parse_request(line: bytes) -> dict[str, Any]:
    """One request line -> `{"op", "agent"?, "agents"?, "lines"?, "follow"?}` with defaults
    (`logs` of the supervisor: `"agent": None`; start, stop, restart: `"agents"`, the ids in
    order without repeats, and `"agent"` too when the request named one); `ControlError`
    (`bad_request`, `unknown_op`) naming what is wrong. Values are never echoed beyond 80
    chars."""
    body = decode(line, R.NOT_JSON, R.NOT_OBJECT)
    op = body.get("op")
    if not isinstance(op, str):
        raise ControlError.row(R.NO_OP, {"ops": list(OPS)})
    if op not in _FIELDS:
        raise ControlError.row(R.UNKNOWN_OP, {"ops": list(OPS)}, op=_short(op), ops=", ".join(OPS))
    unknown = sorted(str(k)[:80] for k in set(body) - _FIELDS[op])
    if unknown:
        raise ControlError.row(
            R.EXTRA_FIELDS, {"allowed": sorted(_FIELDS[op])}, op=op, fields=", ".join(unknown)
        )
    out: dict[str, Any] = {"op": op}
    supervisor = body.get("supervisor", False)
    if op == "logs" and (not isinstance(supervisor, bool) or (supervisor and "agent" in body)):
        raise ControlError.row(R.BAD_SUPERVISOR)
    if supervisor:
        out["agent"] = None
    elif op in _AGENTS_OPS and "agents" in body:
        out["agents"] = _agents(op, body)
    elif op in _AGENT_OPS | _AGENTS_OPS:
        agent = body.get("agent")
        if not isinstance(agent, str) or not agent:
            raise ControlError.row(R.NO_AGENT, op=op)
        if not _is_agent(agent):
            raise ControlError.row(R.BAD_AGENT, limit=MAX_AGENT_CHARS)
        out["agent"] = agent
        if op in _AGENTS_OPS:
            out["agents"] = [agent]
    if op == "logs":
        lines = body.get("lines", DEFAULT_LOG_LINES)
        if isinstance(lines, bool) or not isinstance(lines, int):
            raise ControlError.row(R.BAD_LINES)
        if not 0 <= lines <= MAX_LOG_LINES:
            raise ControlError.row(R.LINES_RANGE, limit=MAX_LOG_LINES)
        follow = body.get("follow", False)
        if not isinstance(follow, bool):
            raise ControlError.row(R.BAD_FOLLOW)
        out["lines"], out["follow"] = lines, follow
    if op == "reload":
        dry_run = body.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise ControlError.row(R.BAD_DRY_RUN)
        out["dry_run"] = dry_run
    if op == "exec":
        out["argv"] = _argv(body.get("argv"))
    return out


def _is_agent(agent: object) -> bool:
    return isinstance(agent, str) and 0 < len(agent) <= MAX_AGENT_CHARS and agent.isprintable()


def _agents(op: str, body: Mapping[str, Any]) -> list[str]:
    """The `"agents"` of a start, stop or restart: 1..MAX_AGENTS ids, without `"agent"`."""
    agents = body["agents"]
    if (
        "agent" in body
        or not isinstance(agents, list)
        or not 0 < len(agents) <= MAX_AGENTS
        or not all(_is_agent(agent) for agent in agents)
    ):
        raise ControlError.row(R.BAD_AGENTS, op=op, limit=MAX_AGENTS, chars=MAX_AGENT_CHARS)
    return list(dict.fromkeys(agents))


def unknown_agents(
    unknown: Sequence[str], known: Sequence[str], fleet: Mapping[str, Any] | None = None
) -> ControlError:
    """`unknown_agent` for the ids of `unknown`, none of them among `known` (the fleet's ids);
    `fleet`: where the fleet's agents come from (`{"path", "agents_from"}`: status's `fleet`),
    named in the message. An id close to one of the fleet's (a typo: `difflib`) is named with
    the closest; any other is only counted: a value like no agent id of the fleet may be a
    token typed in the wrong place (a token passes the agent-id grammar). Details:
    `agents` (those named), `not_shown` (how many others), `did_you_mean` ({id: the fleet's
    closest}), `known_count` and `fleet` (its file's path). Pure."""
    import difflib

    named: list[str] = []
    suggestions: dict[str, str] = {}
    ids = list(dict.fromkeys(unknown))
    for agent in ids:
        close = difflib.get_close_matches(agent, known, n=1)
        if close:
            suggestions[agent] = close[0]
            named.append(f"{_short(agent)} (did you mean {_short(close[0])}?)")
    hidden = len(ids) - len(named)
    shown = list(named)
    if hidden:
        noun = "value" if hidden == 1 else "values"
        shown.append(f"{hidden} {noun} not shown (like none of the fleet's ids)")
    path = fleet.get("path") if isinstance(fleet, Mapping) else None
    if isinstance(fleet, Mapping) and fleet.get("agents_from") == "center":
        source = "The center assigns this worker"
    elif isinstance(path, str) and path:
        source = f"The fleet file {path} defines"
    else:
        source = "The fleet has"
    count = len(known)
    return ControlError.row(
        R.UNKNOWN_AGENTS,
        {
            "agents": list(suggestions),
            "not_shown": hidden,
            "did_you_mean": suggestions,
            "known_count": count,
            "fleet": path if isinstance(path, str) else None,
        },
        agents=", ".join(shown),
        source=source,
        known=f"{count} agent{'' if count == 1 else 's'}" if count else "no agents",
    )


def _argv(argv: Any) -> list[str]:
    if not isinstance(argv, list) or not argv:
        raise ControlError.row(R.NO_ARGV)
    if len(argv) > MAX_ARGV:
        raise ControlError.row(R.ARGV_TOO_LONG, limit=MAX_ARGV)
    if not all(isinstance(arg, str) and "\0" not in arg for arg in argv):
        raise ControlError.row(R.BAD_ARGV)
    if not argv[0]:
        raise ControlError.row(R.NO_COMMAND)
    return list(argv)


def parse_signal(line: bytes) -> int | None:
    """An exec client's `{"op": "signal", "signal": "SIGINT"}` -> the signal number; None for
    anything else (ignored by the server)."""
    import signal

    try:
        body = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(body, dict) or body.get("op") != "signal" or set(body) != {"op", "signal"}:
        return None
    name = body.get("signal")
    if not isinstance(name, str) or name not in EXEC_SIGNALS:
        return None
    return int(getattr(signal, name))


def _short(value: str) -> str:
    return repr(value[:80] + ("…" if len(value) > 80 else ""))


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
