"""The control socket's wire protocol (pure): what `mcphost ctl` and the supervisor both speak.

Owns: the request grammar (`parse_request`, `parse_signal`), the reply encoding (`encode`), its
bounds, the reading of a line either way as one JSON object (`decode`), and `ControlError` (a
refusal with a stable code, from `mcphost.supervisor.refusals`). The asyncio server is
`control.server`, the blocking client `control.client`.

Protocol: one connection, one request. The client sends one JSON line (at most `MAX_LINE` bytes
including the newline)

    {"op": "status" | "start" | "stop" | "restart" | "reload" | "logs" | "exec",
     "agent": "<id>",        start, stop, restart, logs, exec: required; otherwise refused
     "supervisor": true,     logs only, instead of "agent": the supervisor's own events
     "lines": N,             logs only: 0..MAX_LOG_LINES, default 50
     "follow": bool,         logs only: default false
     "dry_run": bool,        reload only: default false (say what it would do, change nothing)
     "argv": ["cmd", ...]}   exec only: required, 1..MAX_ARGV strings without NUL

and the server answers JSON lines, then closes:

    {"ok": true, "result": <JSON>}                                     every op but logs, exec
    {"ok": false, "error": {"code": "...", "message": "...", "details": {...}}}
    {"log": "<text chunk>"} ... {"ok": true, "end": true}              logs (an error may end it)
    {"ok": true, "started": {...}} ... {"ok": true, "exit": {"code": N, "status": "exit 7"}}
                                                                       exec (N < 0: that signal)

With `follow`, the log lines keep coming until the client closes (or half-closes) its side; the
server then stops reading the log. Codes are stable, every one of them in the table of
`mcphost.supervisor.refusals` (`bad_request`, `unknown_op`, `request_too_large`,
`forbidden_peer`, `busy`, `internal`, and the operations' `unknown_agent`, `reload_failed`,
`agent_not_running`, `exec_failed`, ...).

Exec: the request line is sent with exactly three file descriptors attached (`SCM_RIGHTS`: the
client's stdin, stdout, stderr), in the same `sendmsg`. After `started`, the client may send
`{"op": "signal", "signal": "SIGINT"}` lines (one of `EXEC_SIGNALS`), delivered to the command's
process group; anything else it sends is ignored. The client must send nothing after the request
until it has read `started`. When the command exits, the server sends `exit` and closes; when the
client's side closes first, the server ends the command's process group.

Must never: import anything beyond the stdlib's json and the refusals table (both ends import
it; `mcphost ctl` must start fast), or echo more than 80 characters of a value it refuses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Self

from mcphost.errors import CodedFailure
from mcphost.supervisor import refusals as R
from mcphost.supervisor.refusals import Refusal

MAX_LINE = 64 * 1024  # a request line, newline included
MAX_REPLY_LINE = 64 * 1024 * 1024  # what the client accepts per reply line (status of a big fleet)
MAX_LOG_LINES = 100_000
DEFAULT_LOG_LINES = 50
MAX_AGENT_CHARS = 256
LOG_CHUNK = 16 * 1024  # bytes of log text per {"log": ...} line
MAX_ARGV = 4096  # exec: arguments of the command
EXEC_FDS = 3  # exec: stdin, stdout, stderr, in that order

# What `ctl exec` may forward to the command's process group (by name: numbers differ by arch).
EXEC_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGKILL", "SIGUSR1", "SIGUSR2")

OPS = ("status", "start", "stop", "restart", "reload", "logs", "exec")
_AGENT_OPS = frozenset({"start", "stop", "restart", "logs", "exec"})
_FIELDS = {
    "status": frozenset({"op"}),
    "reload": frozenset({"op", "dry_run"}),
    "start": frozenset({"op", "agent"}),
    "stop": frozenset({"op", "agent"}),
    "restart": frozenset({"op", "agent"}),
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
    """One request line -> `{"op", "agent"?, "lines"?, "follow"?}` with defaults (`logs` of the
    supervisor: `"agent": None`); `ControlError` (`bad_request`, `unknown_op`) naming what is
    wrong. Values are never echoed beyond 80 chars."""
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
    elif op in _AGENT_OPS:
        agent = body.get("agent")
        if not isinstance(agent, str) or not agent:
            raise ControlError.row(R.NO_AGENT, op=op)
        if len(agent) > MAX_AGENT_CHARS or not agent.isprintable():
            raise ControlError.row(R.BAD_AGENT, limit=MAX_AGENT_CHARS)
        out["agent"] = agent
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
