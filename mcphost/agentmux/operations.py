"""Typed request bodies of the relay wire, one model per operation (reference §2.4-§2.6).

Owns: the field names, defaults, constants and request rules of the operations both ends speak
(every operation of §2.4: send, raww, look, choices_pick, new_peer, change_psk, drop_peer,
change_scope, and the bodies without rules of their own: list, up, down, choices_list,
list_relays, discover_namespaces, discover_principals, identity_introspect; the look bounds
`LOOK_LINES_MIN` / `LOOK_LINES_MAX`, which the relay tools' schemas state; the raww bound
`RAWW_MAX_BYTES` is `wire`'s, which the relay's pane writer shares), and the ONE reader of such
a body (`<Model>.read(body)`), with the codes and messages of its refusals. The relay tools
build with it (`relaytools/validation.py` reads the checked tool arguments through `read`;
`handlers.py` sends `wire()`), the relay parses with it (`relay/behaviour.py` and
`relay/credentials.py` read `request.body` through `read`): a body is validated once, by one
set of rules, whichever end meets the flaw first. `MODELS` maps each operation to its model
(the relay's operation table reads a body through it).

Reading a body:
- a field the relay stamps itself is refused (`STAMPED`: choices_pick's caller identity fields);
- unknown fields are dropped, as the wire says (§2.4; the relay tools refused them already
  against the tool's own schema, with its own message), and null reads as absent (§7);
- the rest is validated strictly (no coercion: "1" is not a number, 1 is not a boolean); a field
  of the wrong JSON type is `validation_invalid_params` "invalid type for <field>: expected <a
  string>, got <number>", details `{field, expected, got}` (`invalid_type`, with `EXPECTED`:
  the relay tools' schema check refuses a wrong type in the same words through them);
- then the operation's rules, in agentmux's order, each with its own code (see the models).

Every refusal is a `RelayError`; the relay tools carry it as a `ToolFailure` unchanged. In
process, the relay tools hand the model itself to the relay (`request(namespace)`: a
`wire.Request` whose body is the model); over the socket they send `wire()`.

Must never: do I/O, consult the configuration or the requester (who may send what is the
relay's decision, made after this), or import `mcphost.relay` / `mcphost.relaytools`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mcphost.agentmux.wire import (
    RAWW_MAX_BYTES,
    RelayError,
    Request,
    check_values,
    json_type,
    raww_text_too_large,
)

LOOK_LINES_MIN = 1
LOOK_LINES_MAX = 1000
CHOOSE_OUTCOMES = ("selected", "cancelled")
DESTINATIONS = ("response", "config", "path")
# what a field's JSON Schema states beyond its type (the relay tools' schemas are generated
# from these models: relaytools/params.py)
UINT32: dict[str, Any] = {"format": "uint32", "minimum": 0}

# a JSON (schema) type -> what a field of it expects, in the relay tools' words: the tools'
# schema check (relaytools/validation.py) and the body reader below both say it so
EXPECTED = {
    "string": "a string",
    "boolean": "a boolean",
    "integer": "a non-negative integer",
    "array": "an array of strings",
    "object": "a JSON object",
}
NON_STRING_ITEM = "an array with a non-string item"  # what an array of strings got instead
# a pydantic error type -> the JSON type it stands for
_JSON_TYPE = {
    "string_type": "string",
    "bool_type": "boolean",
    "int_type": "integer",
    "list_type": "array",
    "dict_type": "object",
}


def invalid_type(name: str, expected: str, got: str) -> RelayError:
    """The refusal of a field of the wrong JSON type (module doc), wherever it is met."""
    return RelayError(
        "validation_invalid_params",
        f"invalid type for {name}: expected {expected}, got {got}",
        {"field": name, "expected": expected, "got": got},
    )


def _type_error(exc: ValidationError, data: Mapping[str, Any]) -> RelayError:
    first = exc.errors()[0]
    loc = first["loc"]
    name = str(loc[0]) if loc else "request"
    if len(loc) > 1:  # an item of an array
        return invalid_type(name, EXPECTED["array"], NON_STRING_ITEM)
    if first["type"] == "literal_error":
        expected = "the operation's name"
    else:
        expected = EXPECTED.get(_JSON_TYPE.get(first["type"], ""), "a value")
    return invalid_type(name, expected, json_type(data.get(name)))


class WireRequest(BaseModel):
    """The fields every request body may carry; subclasses add the operation's own."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    operation: str
    request_id: str | None = None
    requester_session: str | None = None

    OPERATION: ClassVar[str]
    # fields sent as null when absent (upstream's own bodies do); every other absent one is omitted
    NULLS_SENT: ClassVar[frozenset[str]] = frozenset()
    # fields the relay stamps itself: a body carrying one is refused, not read with it dropped
    STAMPED: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def read(cls, body: Mapping[str, Any]) -> Self:
        """The typed body: a `STAMPED` field refused (`validation_invalid_params`), unknown
        fields and nulls dropped, the rest strictly validated, then the operation's rules.
        Raises RelayError."""
        stamped = sorted(cls.STAMPED & body.keys())
        if stamped:
            raise RelayError(
                "validation_invalid_params",
                f"{stamped[0]} is stamped by the relay from the caller's identity: leave it out",
                {"field": stamped[0]},
            )
        data = {k: v for k, v in body.items() if k in cls.model_fields and v is not None}
        data.setdefault("operation", cls.OPERATION)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise _type_error(exc, data) from None

    def wire(self) -> dict[str, Any]:
        """The body as sent, fields in declaration order: an absent one omitted, except the
        `NULLS_SENT` (send's and raww's `request_id`, ...), sent as null as the relay tools
        always have."""
        return {k: v for k, v in self.model_dump().items() if v is not None or k in self.NULLS_SENT}

    def request(self, namespace: str | None = None) -> Request:
        """This body as an in-process request (no frame, no JSON): the relay reads the model
        itself. Its values are checked as a decoded frame's are (`wire.check_values`); its
        rules ran when it was read."""
        check_values(self.model_dump())
        return Request(None, namespace, self.operation, self)


class SendRequest(WireRequest):
    """`send` (§1.5): refusals in order `validation_invalid_arguments` (blank message),
    `validation_conflicting_targets`, `validation_empty_targets`, `validation_unknown_target`
    (a blank target). Targets are sent as given: qualifying bare names is the tools' job,
    resolving them the relay's."""

    OPERATION: ClassVar[str] = "send"
    NULLS_SENT: ClassVar[frozenset[str]] = frozenset({"request_id", "requester_session"})
    operation: Literal["send"] = "send"
    message: str = ""
    targets: list[str] = []
    broadcast: bool = False

    @model_validator(mode="after")
    def _rules(self) -> Self:
        if not self.message.strip():
            raise RelayError("validation_invalid_arguments", "message must be non-empty")
        if self.broadcast and self.targets:
            raise RelayError(
                "validation_conflicting_targets", "targets must be empty when broadcast=true"
            )
        if not self.broadcast and not self.targets:
            raise RelayError(
                "validation_empty_targets", "provide at least one target or set broadcast=true"
            )
        for target in self.targets:
            if not target.strip():
                raise RelayError(
                    "validation_unknown_target",
                    "each target must be non-empty",
                    {"target": target},
                )
        return self


class RawwRequest(WireRequest):
    """`raww` (§1.7): `validation_unknown_target` (blank target_session), then
    `validation_invalid_params` (no text; text over `RAWW_MAX_BYTES` of UTF-8)."""

    OPERATION: ClassVar[str] = "raww"
    NULLS_SENT: ClassVar[frozenset[str]] = frozenset({"request_id", "requester_session"})
    operation: Literal["raww"] = "raww"
    target_session: str = ""
    text: str | None = None
    no_enter: bool = False

    @model_validator(mode="after")
    def _rules(self) -> Self:
        if not self.target_session.strip():
            raise RelayError("validation_unknown_target", "target_session must be non-empty")
        if self.text is None:
            raise RelayError("validation_invalid_params", "text is required", {"field": "text"})
        size = len(self.text.encode("utf-8", "surrogatepass"))
        if size > RAWW_MAX_BYTES:
            raise raww_text_too_large(size)
        return self

    @property
    def raw_text(self) -> str:
        assert self.text is not None  # _rules refused a body without one
        return self.text


class LookRequest(WireRequest):
    """`look` (§1.6): `validation_unknown_target` (blank target_session), then
    `validation_invalid_lines` (`lines` outside `LOOK_LINES_MIN..LOOK_LINES_MAX`), then
    `validation_invalid_params` (a negative `offset`; the relay refuses any other non-zero one
    for a tmux target after resolving it, `validation_offset_unsupported`)."""

    OPERATION: ClassVar[str] = "look"
    NULLS_SENT: ClassVar[frozenset[str]] = frozenset({"requester_session"})
    operation: Literal["look"] = "look"
    target_session: str = ""
    lines: int | None = Field(None, json_schema_extra=UINT32)
    offset: int | None = Field(None, json_schema_extra=UINT32)

    @model_validator(mode="after")
    def _rules(self) -> Self:
        if not self.target_session.strip():
            raise RelayError("validation_unknown_target", "target_session must be non-empty")
        lines = self.lines
        if lines is not None and not LOOK_LINES_MIN <= lines <= LOOK_LINES_MAX:
            raise RelayError(
                "validation_invalid_lines",
                f"lines must be between {LOOK_LINES_MIN} and {LOOK_LINES_MAX}",
                {"lines": lines, "min": LOOK_LINES_MIN, "max": LOOK_LINES_MAX},
            )
        if self.offset is not None and self.offset < 0:
            raise RelayError(
                "validation_invalid_params",
                "offset must be a non-negative integer",
                {"field": "offset", "offset": self.offset},
            )
        return self


class ChoicesPickRequest(WireRequest):
    """`choices_pick` (the `choose` tool, §1.8): every refusal `validation_invalid_params`, in
    order: a caller identity field (`decided_by`, `ui_session_id`, `operator_session_id`,
    `bundle_name`: the relay stamps the decider from the connection, acp.md §4), a blank
    `choice_request_id`, an `outcome` other than "selected" / "cancelled", "selected" without a
    non-blank `option_id`, "cancelled" with one."""

    OPERATION: ClassVar[str] = "choices_pick"
    STAMPED: ClassVar[frozenset[str]] = frozenset(
        {"decided_by", "ui_session_id", "operator_session_id", "bundle_name"}
    )
    operation: Literal["choices_pick"] = "choices_pick"
    choice_request_id: str = ""
    outcome: str | None = Field(None, json_schema_extra={"enum": list(CHOOSE_OUTCOMES)})
    option_id: str | None = None

    @model_validator(mode="after")
    def _rules(self) -> Self:
        if not self.choice_request_id.strip():
            raise RelayError(
                "validation_invalid_params",
                "choice_request_id must be a non-empty string",
                {"field": "choice_request_id"},
            )
        if self.outcome not in CHOOSE_OUTCOMES:
            details: dict[str, Any] = {"field": "outcome"}
            if self.outcome is not None:
                details["value"] = self.outcome
            raise RelayError(
                "validation_invalid_params", 'outcome must be "selected" or "cancelled"', details
            )
        if self.outcome == "selected" and not (self.option_id or "").strip():
            raise RelayError(
                "validation_invalid_params",
                "selected outcome requires explicit non-empty option_id",
                {"field": "option_id", "outcome": "selected"},
            )
        if self.outcome == "cancelled" and self.option_id is not None:
            raise RelayError(
                "validation_invalid_params",
                "cancelled outcome must omit option_id",
                {"field": "option_id", "outcome": "cancelled"},
            )
        return self


class CredentialRequest(WireRequest):
    """A credential operation's body: `principal_id` required (`validation_invalid_principal_id`),
    and for new_peer / change_psk a `destination` `{"kind": "response" | "config" | "path",
    "path"?}` (absent: "response"; another shape `validation_invalid_arguments`; a path
    destination without a string path `validation_invalid_output_path`). Whether the path is
    usable, and whether `config` suits the principal's type, is the relay's to check (I/O)."""

    principal_id: str | None = None

    @model_validator(mode="after")
    def _rules(self) -> Self:
        if not self.principal_id:
            raise RelayError(
                "validation_invalid_principal_id",
                f"principal_id is required for {self.OPERATION.replace('_', ' ')}",
                {"principal_id": self.principal_id},
            )
        destination = getattr(self, "destination", None)
        if destination is None:
            return self
        if not isinstance(destination, dict) or destination.get("kind") not in DESTINATIONS:
            raise RelayError(
                "validation_invalid_arguments",
                'destination must be {"kind": "response" | "config" | "path"}',
                {"field": "destination"},
            )
        if destination["kind"] == "path" and not isinstance(destination.get("path"), str):
            raise RelayError(
                "validation_invalid_output_path",
                "output_path must be an absolute path",
                {"path": destination.get("path")},
            )
        return self

    @property
    def principal(self) -> str:
        assert self.principal_id  # _rules refused a body without one
        return self.principal_id


class NewPeerRequest(CredentialRequest):
    OPERATION: ClassVar[str] = "new_peer"
    NULLS_SENT: ClassVar[frozenset[str]] = frozenset({"scope"})
    operation: Literal["new_peer"] = "new_peer"
    scope: str | None = None
    destination: Any = None  # its shape is checked by _rules, with the relay's own refusal


class ChangePskRequest(CredentialRequest):
    OPERATION: ClassVar[str] = "change_psk"
    operation: Literal["change_psk"] = "change_psk"
    destination: Any = None


class DropPeerRequest(CredentialRequest):
    OPERATION: ClassVar[str] = "drop_peer"
    operation: Literal["drop_peer"] = "drop_peer"


class ChangeScopeRequest(CredentialRequest):
    OPERATION: ClassVar[str] = "change_scope"
    operation: Literal["change_scope"] = "change_scope"
    scope: str | None = None


class ListRequest(WireRequest):
    """`list` (§1.3): the namespace is the frame's, not the body's."""

    OPERATION: ClassVar[str] = "list"
    NULLS_SENT: ClassVar[frozenset[str]] = frozenset({"requester_session"})
    operation: Literal["list"] = "list"


class UpRequest(WireRequest):
    OPERATION: ClassVar[str] = "up"
    operation: Literal["up"] = "up"


class DownRequest(WireRequest):
    OPERATION: ClassVar[str] = "down"
    operation: Literal["down"] = "down"


class ChoicesListRequest(WireRequest):
    OPERATION: ClassVar[str] = "choices_list"
    operation: Literal["choices_list"] = "choices_list"


class IdentityIntrospectRequest(WireRequest):
    OPERATION: ClassVar[str] = "identity_introspect"
    operation: Literal["identity_introspect"] = "identity_introspect"


class ListRelaysRequest(WireRequest):
    OPERATION: ClassVar[str] = "list_relays"
    operation: Literal["list_relays"] = "list_relays"


class DiscoverNamespacesRequest(WireRequest):
    """`discover_namespaces`: `relay` names a peer relay (the relay refuses any, §1.12)."""

    OPERATION: ClassVar[str] = "discover_namespaces"
    operation: Literal["discover_namespaces"] = "discover_namespaces"
    relay: str | None = None


class DiscoverPrincipalsRequest(WireRequest):
    """`discover_principals`: `namespace` is required, after the relay's `relay` check."""

    OPERATION: ClassVar[str] = "discover_principals"
    operation: Literal["discover_principals"] = "discover_principals"
    relay: str | None = None
    namespace: str | None = None


MODELS: dict[str, type[WireRequest]] = {
    model.OPERATION: model
    for model in (
        ListRequest, LookRequest, SendRequest, RawwRequest, UpRequest, DownRequest,
        ChoicesListRequest, ChoicesPickRequest, NewPeerRequest, ChangePskRequest,
        DropPeerRequest, ChangeScopeRequest, IdentityIntrospectRequest, ListRelaysRequest,
        DiscoverNamespacesRequest, DiscoverPrincipalsRequest,
    )
}  # fmt: skip
