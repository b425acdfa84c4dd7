"""The relay tools' error taxonomy: one exception type carrying a stable code, and its JSON-RPC form.

Owns: `ToolFailure` (code, message, details) and `ClaimConflict`, the one relay error the
stream acts on (it retries the Hello, then reports it as itself, `claim_conflict`) rather than
passing through, the rule that maps a code to a
JSON-RPC error code (`validation_*` and `authorization_forbidden` -> -32602, everything else ->
-32603: agentmux's contract names the class by the code, so this rule reads codes), the
relay I/O classification (Python exception -> Rust-style `io_error_kind` -> `relay_unavailable` /
`relay_timeout` / `internal_unexpected_failure`), and the constructors for the failures this
package raises itself.

Both derive from `mcphost.errors.CodedFailure` (the triple); why not `mcphost.errors.ToolFailure`: the host's failures become `isError` tool results with
`details` always an object; agentmux's contract is a JSON-RPC error whose `data.details` may be
`null` (kept as `None`, distinct from `{}`, when a relay error passes through) and whose code
class follows from the code. Same idea, a different wire contract, so folding the two into one
class would make one of them lie about `details`; the families stay apart, and neither surface
can catch the other's failures by accident.

Must never: do I/O, or put a credential (PSK) into a message or details.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from mcphost.errors import CodedFailure

INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

REMEDY = "mcphost relay-tools --bundle <name> --session-name <id>"

CLAIM_CONFLICT = "runtime_identity_claim_conflict"

UNAVAILABLE_KINDS = frozenset(
    {
        "NotFound",
        "ConnectionRefused",
        "ConnectionAborted",
        "ConnectionReset",
        "BrokenPipe",
        "UnexpectedEof",
    }
)


class ToolFailure(CodedFailure):
    """A failure that reaches the MCP client as a JSON-RPC error with `data: {code, message, details}`."""

    @property
    def rpc_code(self) -> int:
        return rpc_code_for(self.code)

    def data(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


class ClaimConflict(ToolFailure):
    """The relay refused the Hello: this identity is still claimed by a live connection."""


def rpc_code_for(code: str) -> int:
    """-32602 for caller-fixable failures (validation, authorization), -32603 for the rest."""
    if code.startswith("validation_") or code == "authorization_forbidden":
        return INVALID_PARAMS
    return INTERNAL_ERROR


# -- failures raised by the MCP side --------------------------------------------------------


def invalid_params(message: str, details: Mapping[str, Any] | None = None) -> ToolFailure:
    return ToolFailure("validation_invalid_params", message, details)


def unknown_fields(context: str, fields: Sequence[str]) -> ToolFailure:
    names = sorted(fields)
    return invalid_params(
        f"unknown parameter(s) for {context}: {', '.join(names)}", {"fields": names}
    )


def invalid_args(command_label: str, reason: str, help_query: str) -> ToolFailure:
    return invalid_params(
        f"invalid args for {command_label} command",
        {
            "reason": reason,
            "hint": f"pass args as a JSON object; use help query '{help_query}' for exact schema",
        },
    )


def unknown_sender() -> ToolFailure:
    """The server is unassociated: it has no bundle and session to speak for."""
    return ToolFailure(
        "validation_unknown_sender",
        "sender session is not configured for this MCP server; start it with "
        f"`{REMEDY}` or set AGENTMUX_BUNDLE and AGENTMUX_SESSION",
        {"reason": "unassociated_server", "remedy": REMEDY},
    )


def startup_fault(code: str, message: str) -> ToolFailure:
    """Association was requested but could not be built; the original fault code is kept."""
    return ToolFailure(
        code,
        f"MCP server started but could not build an operational context: {message}",
        {"reason": "startup_fault", "startup_fault_code": code, "startup_fault_message": message},
    )


def claim_conflict(principal_id: str, retried_s: float, refusal: ToolFailure) -> ClaimConflict:
    """The relay still refused the Hello after the retries: another live connection holds this
    principal. Reported as itself (not as a saturated relay), with the relay's details kept."""
    details = dict(refusal.details or {})
    details.update(principal_id=principal_id, retried_for_ms=round(retried_s * 1000))
    return ClaimConflict(
        CLAIM_CONFLICT,
        f"relay identity {principal_id} is held by another live connection (still after "
        f"{retried_s:g} s of retries): another process speaks to the relay as this session. End "
        "that process (or its MCP session), then retry",
        details,
    )


def unexpected_response(response: Any) -> ToolFailure:
    return ToolFailure(
        "internal_unexpected_failure",
        "relay returned unexpected response variant",
        {"response": response},
    )


def from_relay_error(error: Any) -> ToolFailure:
    """A relay `{"kind":"error","error":{code,message,details?}}` passes through unchanged (as a
    `ClaimConflict` when it is one: the only relay code read here)."""
    if not isinstance(error, dict) or not isinstance(error.get("code"), str):
        return unexpected_response({"kind": "error", "error": error})
    message = error.get("message")
    details = error.get("details")
    kind = ClaimConflict if error["code"] == CLAIM_CONFLICT else ToolFailure
    return kind(
        error["code"],
        message if isinstance(message, str) else error["code"],
        details if isinstance(details, dict) else None,
    )


# -- relay I/O ------------------------------------------------------------------------------


class RelayIOError(Exception):
    """A transport failure talking to the relay, already classified with a Rust `ErrorKind` name."""

    def __init__(self, kind: str, cause: str) -> None:
        super().__init__(cause)
        self.kind = kind
        self.cause = cause


def io_kind(exc: BaseException) -> str:
    """The Rust `std::io::ErrorKind` name agentmux clients expect for a Python exception."""
    if isinstance(exc, RelayIOError):
        return exc.kind
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return "TimedOut"
    if isinstance(exc, FileNotFoundError):
        return "NotFound"
    if isinstance(exc, ConnectionRefusedError):
        return "ConnectionRefused"
    if isinstance(exc, ConnectionAbortedError):
        return "ConnectionAborted"
    if isinstance(exc, ConnectionResetError):
        return "ConnectionReset"
    if isinstance(exc, BrokenPipeError):
        return "BrokenPipe"
    if isinstance(exc, (asyncio.IncompleteReadError, EOFError)):
        return "UnexpectedEof"
    if isinstance(exc, PermissionError):
        return "PermissionDenied"
    return "Other"


def relay_io_failure(socket_path: str, exc: BaseException) -> ToolFailure:
    """Map a relay transport failure to `relay_timeout` / `relay_unavailable` / internal."""
    kind = io_kind(exc)
    cause = exc.cause if isinstance(exc, RelayIOError) else (str(exc) or type(exc).__name__)
    details = {"relay_socket": socket_path, "io_error_kind": kind, "cause": cause}
    if kind == "TimedOut":
        return ToolFailure(
            "relay_timeout", "relay timed out; relay may be saturated or unresponsive", details
        )
    if kind in UNAVAILABLE_KINDS:
        return ToolFailure(
            "relay_unavailable",
            "relay is unavailable; start the agentmux relay (agentmux host relay) "
            "with the same state directory",
            details,
        )
    return ToolFailure("internal_unexpected_failure", "relay request failed", details)
