"""Every refusal the supervisor gives a client: one table of codes and messages (like supervisord's
`Faults`), for the attach handshake (`refused <code> <message>`, sessions.py) and the control
socket (`{"ok": false, "error": {"code", "message", "details"}}`, control/).

Owns: `Refusal` (a stable snake_case code and the message that says what to do, a template whose
`{names}` the raiser fills), every refusal of the two wires below, and `Refused`, the exception
of the attach handshake (the control socket's is `control.protocol.ControlError`, which carries
details too). A code may have several entries (one per situation); a message is written here
once, never at the place that raises it.

Must never: import anything but the ground floor's failure base (`mcphost.errors`, itself
standard library only: `mcphost ctl` imports this module through the control client and must
start fast; the hub, the identity registry and the control server import it), or hold a
code that is not in docs/supervisor-internals.md (tests/supervisor/test_refusals.py checks both
ways, and that nothing under mcphost/supervisor/ raises a literal code).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from mcphost.errors import CodedFailure


class Refusal(NamedTuple):
    """One row of the table: `code` on the wire, `text` the message with `{names}` to fill."""

    code: str
    text: str

    def message(self, **fields: Any) -> str:
        return self.text.format(**fields) if fields else self.text


class Refused(CodedFailure):
    """Raised by `identify` or `surface_for` (and the identity registry's `vouch`): the pump gets
    `refused <code> <message>` (no details: the handshake line has no room for them)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)

    @classmethod
    def row(cls, refusal: Refusal, **fields: Any) -> Refused:
        return cls(refusal.code, refusal.message(**fields))


# -- the attach handshake (sessions.py, identity.py, the supervisor's identify hook) -----------
NOT_IN_FLEET = Refusal(
    "not_in_fleet",
    "process {pid} does not run inside any agent this supervisor started; attach entries work "
    "only from within an agent's process tree",
)
AGENT_GONE = Refusal("agent_not_running", "agent {agent} is no longer in the fleet")
SESSION_CLOSED = Refusal("agent_not_running", "the session was closed")
UID_MISMATCH = Refusal(
    "uid_mismatch", "process {pid} runs as uid {uid}, agent {agent} as {agent_uid}"
)
PEER_GONE = Refusal("peer_gone", "process {pid} exited while it was identified")
PEER_UNREADABLE = Refusal("peer_gone", "the connecting process's credentials could not be read")
TOO_MANY_SESSIONS = Refusal(
    "too_many_sessions",
    "agent {agent} already holds {limit} sessions on this surface; close one (end its MCP "
    "client) before attaching another",
)
NO_BUNDLE = Refusal(
    "surface_unavailable", "agent {agent} has no bundle in the fleet file, so no relay tools"
)
SURFACE_FAILED = Refusal(
    "surface_unavailable",
    "the tools of agent {agent} could not be set up; the supervisor's log has the details",
)
IDENTIFY_FAILED = Refusal(
    "internal_unexpected_failure",
    "the supervisor failed to identify this process; its log has the details",
)
# -- MCP over HTTP (serving/streamable.py; the surfaces' identify_http) ----------------------
HTTP_NOT_HTTP = Refusal(
    "not_an_http_agent",
    'uid {uid} is not the own uid of an agent whose fleet entry says mcp_transport = "http"; '
    "use the entries of your own config",
)
HTTP_UID_SHARED = Refusal(
    "uid_shared",
    "uid {uid} is shared by agents {agents} (or with the supervisor), so it cannot name one "
    "agent; give each agent its own uid (a root supervisor does) or use the pump",
)
HTTP_UNKNOWN_PEER = Refusal(
    "peer_unknown", "the owner of this connection could not be found; reconnect"
)
HTTP_NO_PATH = Refusal("not_found", "{path} is not an MCP endpoint; use /mcp/center or /mcp/relay")
HTTP_TOO_LARGE = Refusal(
    "request_too_large", "a request body may hold at most {limit} bytes; send a smaller request"
)
HTTP_TOO_MANY = Refusal(
    "too_many_requests",
    "this agent has {limit} requests in progress already; wait for one to finish",
)
HTTP_BUDGET = Refusal(
    "budget_spent",
    "this agent's requests in progress hold its whole byte budget; retry when they are answered",
)
HTTP_SESSION_GONE = Refusal(
    "session_closed",
    "this session is not yours or has ended (a restart, a stop or a reload ends it); start a "
    "new session",
)
HTTP_NO_SESSION = Refusal(
    "session_required", "only a POST may start a session; send Mcp-Session-Id with the others"
)
# both wires
STOPPING = Refusal("supervisor_stopping", "the supervisor is shutting down")

# -- the control socket: the server (control/server.py, control/protocol.py) ------------------
NOT_JSON = Refusal("bad_request", "the request is not one JSON line")
NOT_OBJECT = Refusal("bad_request", "the request must be a JSON object")
NO_OP = Refusal("bad_request", 'the request needs "op" (a string)')
UNKNOWN_OP = Refusal("unknown_op", "unknown op {op}; expected one of {ops}")
EXTRA_FIELDS = Refusal("bad_request", "{op} takes no field(s) {fields}")
NO_AGENT = Refusal("bad_request", '{op} needs "agent" (a non-empty string)')
BAD_AGENT = Refusal("bad_request", '"agent" must be at most {limit} printable characters')
BAD_AGENTS = Refusal(
    "bad_request",
    '{op} takes "agent" (one id) or "agents" (a list of 1 to {limit} ids, each at most {chars} '
    "printable characters), not both",
)
BAD_LINES = Refusal("bad_request", '"lines" must be an integer')
LINES_RANGE = Refusal("bad_request", '"lines" must be from 0 to {limit}')
BAD_FOLLOW = Refusal("bad_request", '"follow" must be true or false')
BAD_SUPERVISOR = Refusal(
    "bad_request", 'logs takes "supervisor": true (the supervisor\'s log) or "agent", not both'
)
BAD_DRY_RUN = Refusal("bad_request", '"dry_run" must be true or false')
NO_ARGV = Refusal("bad_request", 'exec needs "argv" (a non-empty list of strings)')
ARGV_TOO_LONG = Refusal("bad_request", '"argv" may hold at most {limit} arguments')
BAD_ARGV = Refusal("bad_request", '"argv" must be strings without NUL characters')
NO_COMMAND = Refusal("bad_request", '"argv" must start with the command to run')
FDS_NOT_EXEC = Refusal("bad_request", "{op} takes no file descriptors; only exec passes them")
FDS_COUNT = Refusal(
    "bad_request",
    "exec passes exactly {expected} file descriptors (stdin, stdout, stderr) with the request "
    "line (SCM_RIGHTS); got {got}",
)
EXEC_EARLY = Refusal(
    "bad_request", "exec: send nothing after the request until the started line was read"
)
TOO_LARGE = Refusal(
    "request_too_large", "a control request is one JSON line of at most {limit} bytes"
)
FORBIDDEN_PEER = Refusal(
    "forbidden_peer",
    "uid {uid} may not use this supervisor's control socket; run `mcphost ctl` as uid {owner} or "
    "root",
)
FLEET_PEER = Refusal(
    "forbidden_peer",
    "a process the supervisor started (an agent, its commands, or what they left behind) may "
    "not use its control socket; run `mcphost ctl` from outside the fleet",
)
BUSY = Refusal("busy", "the supervisor is serving {limit} control connections; retry")
INTERNAL = Refusal("internal", "the supervisor failed to {op} ({exception}); see its log")
LOCK_HELD = Refusal(
    "control_in_use",
    "{who} already runs on this state directory (it holds {lock}); stop it first, or give this "
    "one another --state",
)
NOT_A_SOCKET = Refusal(
    "control_in_use",
    "{path} exists and is not a socket; it was left alone. Remove it, or give the supervisor "
    "another --state",
)
LISTENED_ON = Refusal(
    "control_in_use",
    "something already listens on {path} (another supervisor?); stop it first, or give this one "
    "another --state",
)
UNPROBEABLE = Refusal(
    "control_in_use", "{path} exists and cannot be probed ({errname}); it was left alone"
)
CHANGED_WHILE_BINDING = Refusal(
    "control_in_use",
    "{path} changed under us while binding; check who can write its directory",
)

# -- the control socket: the operations (operations.py, the supervisor's reload) --------------
# control.protocol.unknown_agents fills it (the one place that decides which ids are shown)
UNKNOWN_AGENTS = Refusal(
    "unknown_agent",
    "not in the fleet: {agents}; nothing was done. {source} {known}: `mcphost ctl status` "
    "lists them",
)
UNSTARTED = Refusal(
    "agent_not_running",
    "agent {agent} is in the fleet but could not be set up ({reason}); nothing was done. Fix "
    "that, then `mcphost ctl reload` (a reload tries it again)",
)
NOT_RUNNING = Refusal(
    "agent_not_running",
    "agent {agent} is {state}, not running: a command runs as an agent only while the agent "
    "runs; `mcphost ctl start {agent}` and retry",
)
# execs.py raises it with the reason the command could not start (ExecFailed).
EXEC_FAILED = Refusal("exec_failed", "{problem}")
FLEET_INVALID = Refusal("reload_failed", "the fleet file was not applied: {problem}")
RELAY_UNWRITABLE = Refusal(
    "reload_failed",
    "the relay's configuration could not be written, so the fleet was not applied (nothing was "
    "stopped): {problem}; fix {directory}, then reload (or start the supervisor again)",
)
CENTER_FLEET_CHANGED = Refusal(
    "reload_failed",
    "[center] fleet changed (where the agents come from); it takes effect only when the "
    "supervisor restarts (nothing was applied)",
)
TOKEN_UNREADABLE = Refusal(
    "reload_failed",
    "[center] token_file {path} {problem}: expected {expected} (nothing was applied)",
)
CENTER_LIST_UNREADABLE = Refusal(
    "reload_failed", "the center's agent list could not be read ({code}): {problem}"
)
CENTER_LIST_INVALID = Refusal("reload_failed", "the center's agent list was not applied: {problem}")

# -- the control socket: what the client concludes itself (control/client.py) -----------------
REPLY_CUT = Refusal("protocol_error", "the supervisor's reply line is cut or too long")
REPLY_NOT_JSON = Refusal("protocol_error", "the supervisor's reply is not JSON")
REPLY_NOT_OBJECT = Refusal("protocol_error", "the supervisor's reply is not an object")
REPLY_NO_ERROR = Refusal("protocol_error", "the supervisor refused without saying why")
REPLY_NONE = Refusal("protocol_error", "the supervisor closed the connection without answering")
REPLY_NO_END = Refusal("protocol_error", "the supervisor closed the log stream without an end")
REPLY_UNEXPECTED = Refusal("protocol_error", "the supervisor's exec reply is unexpected")
REPLY_NOT_STATUS = Refusal("protocol_error", "the supervisor's status is not {center, agents}")
SUPERVISOR_GONE = Refusal(
    "supervisor_gone",
    "the supervisor closed the connection before the command exited (it ends the command when "
    "that happens); check `mcphost ctl status` and the supervisor's log",
)

ATTACH = (
    NOT_IN_FLEET,
    AGENT_GONE,
    SESSION_CLOSED,
    UID_MISMATCH,
    PEER_GONE,
    PEER_UNREADABLE,
    TOO_MANY_SESSIONS,
    NO_BUNDLE,
    SURFACE_FAILED,
    IDENTIFY_FAILED,
    STOPPING,
)
HTTP = (
    HTTP_NOT_HTTP,
    HTTP_UID_SHARED,
    HTTP_UNKNOWN_PEER,
    HTTP_NO_PATH,
    HTTP_TOO_LARGE,
    HTTP_TOO_MANY,
    HTTP_BUDGET,
    HTTP_SESSION_GONE,
    HTTP_NO_SESSION,
    TOO_MANY_SESSIONS,
    NO_BUNDLE,
    SURFACE_FAILED,
    IDENTIFY_FAILED,
    STOPPING,
)
CONTROL = (
    NOT_JSON,
    NOT_OBJECT,
    NO_OP,
    UNKNOWN_OP,
    EXTRA_FIELDS,
    NO_AGENT,
    BAD_AGENT,
    BAD_AGENTS,
    BAD_LINES,
    LINES_RANGE,
    BAD_FOLLOW,
    BAD_SUPERVISOR,
    BAD_DRY_RUN,
    NO_ARGV,
    ARGV_TOO_LONG,
    BAD_ARGV,
    NO_COMMAND,
    FDS_NOT_EXEC,
    FDS_COUNT,
    EXEC_EARLY,
    TOO_LARGE,
    FORBIDDEN_PEER,
    FLEET_PEER,
    BUSY,
    INTERNAL,
    LOCK_HELD,
    NOT_A_SOCKET,
    LISTENED_ON,
    UNPROBEABLE,
    CHANGED_WHILE_BINDING,
    UNKNOWN_AGENTS,
    UNSTARTED,
    NOT_RUNNING,
    STOPPING,
    EXEC_FAILED,
    FLEET_INVALID,
    RELAY_UNWRITABLE,
    CENTER_FLEET_CHANGED,
    TOKEN_UNREADABLE,
    CENTER_LIST_UNREADABLE,
    CENTER_LIST_INVALID,
    REPLY_CUT,
    REPLY_NOT_JSON,
    REPLY_NOT_OBJECT,
    REPLY_NO_ERROR,
    REPLY_NONE,
    REPLY_NO_END,
    REPLY_UNEXPECTED,
    REPLY_NOT_STATUS,
    SUPERVISOR_GONE,
)
