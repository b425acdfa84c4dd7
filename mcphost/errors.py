"""Typed failures that reach a model or an operator: a stable snake_case code, a message that says
what to do next, structured details, and (for center replies) the HTTP status.

Owns: `CodedFailure`, the one base of every failure with a stable code (`code`, `message`,
`details`): the host's `ToolFailure` below, the relay tools' `ToolFailure`, the relay's
`RelayError` and `TmuxError`, the control socket's `ControlError`, the attach handshake's
`Refused`, `HomeError`, `SettingError` (and `BindingError`), the relay tools' `ConfigError` and
the center's `ApiError` derive from it. The base holds the triple and nothing of any wire: each
class keeps its own rendering (`payload()`, `data()`, `wire()`, `body()`, a handshake line), and
a seam that turns one into another passes the triple on (`Other.of(failure)`).

Also owns: `ToolFailure` and its JSON shape `{"error", "message", "details", "status"?}`, which is the
text of every `isError` result the host returns, and its small hierarchy of families: the
class says what kind of failure it is, the code says which one, so code that must tell failures
apart catches a class and never compares code strings.

    ToolFailure                 argument refusals, unknown tools, missing configuration
    ├── AdminFailure            the center or the way to it (mcphost.admin.client)
    │   ├── AdminUnavailable      not reachable, or hung up before answering (retryable reads)
    │   └── CenterRefusal         the center's own non-2xx answer, with its status
    │       └── AdmissionRefused    it refused the caller, not the request (auth_*, worker, ...)
    │           └── StaleGeneration   a newer host has taken over this agent
    └── FileFailure             workspace containment and transfers (mcphost.host.workspace, ...)
        ├── PathNotFound          a component of the path does not exist
        └── WorkspaceRootUnset    AC_MCP_AGENT_ROOT is not set

Every class takes the same arguments and has the same wire payload: a subclass never changes
what the model sees. The center's codes become classes in one place only, where its error
envelope is read (`mcphost.admin.client.http_failure`).

The relay tools keep their own failure type (`mcphost.relaytools.errors`): agentmux's contract is
a JSON-RPC error whose `data.details` may be `null`, which this payload never is.
Pure. Must never: carry a token, a raw traceback or an unbounded body.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar, Self


class CodedFailure(Exception):
    """A failure with a stable snake_case `code`, a `message` that says what to do, and
    structured `details` (a dict, or None where a wire tells "none" apart from empty).

    `str()` is the message (`code: message` where `shows_code`); `repr()` names the triple.
    Subclasses add their wire rendering and may narrow `details` (never None, for example)."""

    shows_code: ClassVar[bool] = False

    def __init__(self, code: str, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}" if self.shows_code else message)
        self.code = code
        self.message = message
        self.details: dict[str, Any] | None = dict(details) if details is not None else None

    @classmethod
    def of(cls, failure: CodedFailure) -> Self:
        """This class's failure with `failure`'s code, message and details (a seam's
        translation)."""
        return cls(failure.code, failure.message, failure.details)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.message!r}, {self.details!r})"


class ToolFailure(CodedFailure):
    """A failure with a stable code. `payload()` is what the model sees."""

    shows_code = True
    details: dict[str, Any]

    def __init__(
        self,
        code: str,
        message: str,
        details: Mapping[str, Any] | None = None,
        *,
        status: int | None = None,
    ) -> None:
        super().__init__(code, message, details or {})
        self.status = status

    def payload(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.code, "message": self.message}
        if self.status is not None:
            out["status"] = self.status
        out["details"] = self.details
        return out

    def text(self) -> str:
        return json.dumps(self.payload(), ensure_ascii=False, sort_keys=False)

    def again(self) -> ToolFailure:
        """A fresh failure of the same class, code, message, details and status (to raise a
        remembered failure again without sharing its traceback)."""
        return type(self)(self.code, self.message, self.details, status=self.status)


# -- the center and the way to it -----------------------------------------------------------


class AdminFailure(ToolFailure):
    """The center, or the transport to it, failed the call."""


class AdminUnavailable(AdminFailure):
    """The center was not reachable, or closed the connection before answering."""


class CenterRefusal(AdminFailure):
    """The center answered with a non-2xx status: its own code, message and details."""


class AdmissionRefused(CenterRefusal):
    """The center refused the caller (token, worker binding, generation), not the request."""


class StaleGeneration(AdmissionRefused):
    """A newer host generation has taken over this agent: this host must stop."""


# -- the workspace and file transfers -------------------------------------------------------


class FileFailure(ToolFailure):
    """A file tool refused a path or a transfer (containment, destination, size, changes)."""


class PathNotFound(FileFailure):
    """A component of a workspace path does not exist."""


class WorkspaceRootUnset(FileFailure):
    """The host has no workspace root (`AC_MCP_AGENT_ROOT`)."""
