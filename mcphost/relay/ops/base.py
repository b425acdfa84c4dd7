"""What one relay operation is: its request model, its response model, its capability, its run.

Owns: `Operation` (the request model it reads a body with, `mcphost.agentmux.operations`; the
policy capability it is authorized under; `run(state, principal, request, namespace)` -> its
response), `Response` (the base of every response body: `kind` first, then `schema_version`,
then the operation's fields in their declared order, an absent field omitted: `wire()`), and
`identified` (the `authenticated_identity` a verified principal's answer carries).

Must never: import an operation module (they import this), or do I/O.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

from mcphost.agentmux.operations import WireRequest
from mcphost.agentmux.wire import SCHEMA_VERSION, Principal
from mcphost.relay.state import RelayState

R = TypeVar("R", bound=WireRequest)


class Response(BaseModel):
    """A response body (§2.5): `wire()` is what the relay answers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    KIND: ClassVar[str]
    schema_version: str = SCHEMA_VERSION

    def wire(self) -> dict[str, Any]:
        """`{"kind", "schema_version", ...}`; a field that is None is absent (a dict field's own
        contents are kept as they are)."""
        return {"kind": self.KIND, **self.model_dump(exclude_none=True)}


class Entry(BaseModel):
    """A nested object of a response (a result, a listed principal): absent fields omitted."""

    model_config = ConfigDict(extra="forbid", frozen=True)


Run = Callable[[RelayState, Principal, R, "str | None"], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class Operation(Generic[R]):
    """One operation of the table: `request.OPERATION` is its name; `run` gets the relay's
    state, the connection's principal, the typed body and the frame's routing namespace."""

    request: type[R]
    capability: str | None
    run: Run[R]

    @property
    def name(self) -> str:
        return self.request.OPERATION


def identified(principal: Principal) -> str | None:
    """The `authenticated_identity` of an answer: the principal id when PSK-verified."""
    return principal.id if principal.verified else None
