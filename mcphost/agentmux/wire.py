"""The relay wire protocol's frames and errors (reference `agentmux-relay.md` §2): pure.

Owns: parsing one client line into a `Hello` or a `Request` (`parse_frame`; an in-process
client's request dict: `parse_request`; an in-process client's typed body, an
`agentmux.operations` model, is `WireRequest.request`, its values checked by `check_values` as a
decoded frame's are), building the
relay's frames (`hello_ack`, `response`, `error_response`, `event`) and their bytes (`encode`:
compact JSON + "\\n"), the §2.8 error shape (`RelayError.wire`), the raww size bound (`RAWW_MAX_BYTES`), and principal ids
(`parse_principal`: split at the last "@", the namespace classifies the kind).

Bounds, and why these: a frame line is at most `MAX_FRAME_BYTES` (1 MiB, the newline not
counted). The largest thing a client legitimately sends is a `raww` text (capped at 32 KiB by the
relay tools) or a `send` message; JSON escaping grows text at most sixfold (`\\u001b`), so
1 MiB holds any real frame with room to spare, while a line without an end costs the relay at
most 1 MiB per connection. Nesting is at most `MAX_DEPTH` (64) levels: real frames are four or
five deep, and a deeper document is refused before anything walks it recursively
(`json.loads`'s own RecursionError is refused the same way).

Parsing follows the Rust relay's serde reading where it is observable on the wire: a line
that is not one JSON object with `frame` "hello" or "request", a field of the wrong type, an
unknown `operation`, a duplicate key, NaN/Infinity or a lone surrogate escape is
"failed to parse relay request" (`validation_invalid_arguments`, `{"cause": ...}`), after which
the server closes the connection (§2.1). Unknown extra fields are ignored (§2.4). A hello
with another `schema_version` is `validation_invalid_schema_version`; a malformed
`principal_id` is `validation_invalid_principal_id`.

Omit, never null (§7): optional fields of the frames built here (`request_id`, an error's
`details`, an event's optional payload fields) are left out when absent. A `request_id` of
null in a client frame reads as absent, as serde's `Option` does.

Must never: print or repr an identity token (`Hello.identity_token` is kept out of `repr`),
do I/O, or accept a frame it cannot re-encode.

Why hand-written: no library speaks agentmux's relay protocol; it is a few JSON shapes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from mcphost.errors import CodedFailure

SCHEMA_VERSION = "1"
MAX_FRAME_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_PRINCIPAL_ID_CHARS = 256
SOCKET_TRUST = "socket-trust"
RAWW_MAX_BYTES = 32 * 1024  # a raww text, in bytes of UTF-8 (operations.RawwRequest, tmux)

PARSE_FAILED = "failed to parse relay request"

# §2.4, the newer ones included: any other operation is a frame serde could not read.
OPERATIONS = frozenset(
    {
        "up",
        "down",
        "list",
        "send",
        "look",
        "raww",
        "choices_pick",
        "choices_list",
        "new_peer",
        "change_psk",
        "change_scope",
        "drop_peer",
        "identity_introspect",
        "list_relays",
        "discover_namespaces",
        "discover_principals",
    }
)

Kind = Literal["session", "user", "application", "relay"]
_KINDS: dict[str, Kind] = {"GLOBAL": "user", "EXTERNAL": "application", "RELAY": "relay"}


class RelayError(CodedFailure):
    """A relay failure with a stable snake_case code: one §2.8 error object on the wire."""

    def wire(self) -> dict[str, Any]:
        """`{"code", "message", "details"?}`: details omitted when None."""
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details is not None:
            out["details"] = self.details
        return out


@dataclass(frozen=True)
class Hello:
    schema_version: str
    principal_id: str
    identity_token: str = field(repr=False)  # a PSK: never printed


class TypedBody(Protocol):
    """A request body as its operation's model (`agentmux.operations.WireRequest`: this module
    stands below it, so it names what it reads of one, not the class)."""

    operation: str

    def wire(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Request:
    request_id: str | None
    namespace: str | None
    operation: str
    # the whole "request" object, "operation" included: decoded (a socket frame, a dict an
    # in-process client built) or typed (the operation's model, an in-process client's)
    body: dict[str, Any] | TypedBody


@dataclass(frozen=True)
class Principal:
    id: str  # "alpha@party"
    name: str  # "alpha"
    namespace: str  # "party" | "GLOBAL" | "EXTERNAL" | "RELAY"
    kind: Kind
    verified: bool = False  # PSK-backed (set by authentication, never by parsing)


def raww_text_too_large(size: int) -> RelayError:
    """raww text over `RAWW_MAX_BYTES` of UTF-8."""
    return RelayError(
        "validation_invalid_params",
        f"text must be at most {RAWW_MAX_BYTES} bytes of UTF-8 (got {size})",
        {"max_bytes": RAWW_MAX_BYTES, "bytes": size},
    )


def json_type(value: Any) -> str:
    """The JSON type name of a parsed value ("null", "boolean", "number", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def parse_principal(text: str) -> Principal:
    """`<id>@<namespace>`, split at the last "@", both parts non-empty; at most 256 characters,
    none of them whitespace or control characters. Raises `validation_invalid_principal_id`."""
    name, at, namespace = text.rpartition("@") if isinstance(text, str) else ("", "", "")
    if (
        not at
        or not name
        or not namespace
        or len(text) > MAX_PRINCIPAL_ID_CHARS
        or any(c.isspace() or not c.isprintable() for c in text)
    ):
        shown = text[:MAX_PRINCIPAL_ID_CHARS] if isinstance(text, str) else repr(text)[:80]
        raise RelayError(
            "validation_invalid_principal_id",
            "principal_id must be <id>@<namespace> with both parts non-empty",
            {"principal_id": shown},
        )
    return Principal(text, name, namespace, _KINDS.get(namespace, "session"))


def _parse_failure(cause: str) -> RelayError:
    return RelayError("validation_invalid_arguments", PARSE_FAILED, {"cause": cause})


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate field `{key[:80]}`")
        out[key] = value
    return out


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _check_tree(value: Any) -> None:
    """Depth at most MAX_DEPTH; every string (keys too) encodable as UTF-8. Iterative."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            item.encode("utf-8")  # a lone surrogate escape raises UnicodeEncodeError
        elif isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                raise ValueError(f"nesting deeper than {MAX_DEPTH} levels")
            if isinstance(item, dict):
                for key, child in item.items():
                    key.encode("utf-8")
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)


def _optional_str(frame: dict[str, Any], name: str) -> str | None:
    value = frame.get(name)
    if value is None or isinstance(value, str):
        return value
    raise _parse_failure(f"invalid type for `{name}`: expected a string")


def _required_str(obj: dict[str, Any], name: str, where: str) -> str:
    value = obj.get(name)
    if value is None:
        raise _parse_failure(f"missing field `{name}` in {where}")
    if not isinstance(value, str):
        raise _parse_failure(f"invalid type for `{name}` in {where}: expected a string")
    return value


def parse_frame(line: bytes) -> Hello | Request:
    """One client line (its trailing newline optional) as a Hello or a Request; raises
    RelayError: the parse failure of §2.1, or a hello's schema / principal id refusal."""
    if line.endswith(b"\n"):
        line = line[:-1]
    if len(line) > MAX_FRAME_BYTES:
        raise _parse_failure(f"frame longer than {MAX_FRAME_BYTES} bytes")
    try:
        text = line.decode("utf-8")
        frame = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant)
        _check_tree(frame)
    except RecursionError:
        raise _parse_failure(f"nesting deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError:
        raise _parse_failure("frame is not valid UTF-8") from None
    except UnicodeEncodeError:
        raise _parse_failure("a string holds a lone surrogate escape") from None
    except ValueError as exc:
        raise _parse_failure(str(exc)[:200]) from None
    if not isinstance(frame, dict):
        raise _parse_failure("a frame must be a JSON object")
    kind = frame.get("frame")
    if kind == "hello":
        return _hello(frame)
    if kind == "request":
        return _request(frame)
    if kind is None:
        raise _parse_failure("missing field `frame`")
    shown = kind[:80] if isinstance(kind, str) else type(kind).__name__
    raise _parse_failure(f"unknown frame `{shown}`, expected `hello` or `request`")


def _hello(frame: dict[str, Any]) -> Hello:
    schema = _required_str(frame, "schema_version", "hello")
    principal_id = _required_str(frame, "principal_id", "hello")
    token = _required_str(frame, "identity_token", "hello")
    if schema != SCHEMA_VERSION:
        raise RelayError(
            "validation_invalid_schema_version",
            f"unsupported schema_version; this relay speaks {SCHEMA_VERSION}",
            {"schema_version": schema[:80], "supported_schema_version": SCHEMA_VERSION},
        )
    parse_principal(principal_id)
    return Hello(schema, principal_id, token)


def _request(frame: dict[str, Any]) -> Request:
    request_id = _optional_str(frame, "request_id")
    namespace = _optional_str(frame, "namespace")
    body = frame.get("request")
    if body is None:
        raise _parse_failure("missing field `request`")
    if not isinstance(body, dict):
        raise _parse_failure("invalid type for `request`: expected an object")
    operation = _required_str(body, "operation", "request")
    if operation not in OPERATIONS:
        raise _parse_failure(f"unknown operation `{operation[:80]}`")
    return Request(request_id, namespace, operation, body)


def check_values(value: Any) -> None:
    """What `parse_frame` checks of a decoded frame's values (depth, strings encodable as
    UTF-8), for one an in-process client built; RelayError (the parse failure) otherwise."""
    try:
        _check_tree(value)
    except UnicodeEncodeError:
        raise _parse_failure("a string holds a lone surrogate escape") from None
    except ValueError as exc:
        raise _parse_failure(str(exc)[:200]) from None


def parse_request(frame: dict[str, Any]) -> Request:
    """A request frame an in-process client built as a dict (no JSON line to decode): the
    checks `parse_frame` makes on a decoded request frame, with its failures."""
    check_values(frame)
    return _request(frame)


# -- relay -> client ---------------------------------------------------------------------------


def hello_ack(principal_id: str) -> dict[str, Any]:
    return {"frame": "hello_ack", "schema_version": SCHEMA_VERSION, "principal_id": principal_id}


def response(request_id: str | None, body: dict[str, Any]) -> dict[str, Any]:
    """A response frame; `request_id` omitted when None (the request had none)."""
    out: dict[str, Any] = {"frame": "response"}
    if request_id is not None:
        out["request_id"] = request_id
    out["response"] = body
    return out


def error_response(request_id: str | None, err: RelayError) -> dict[str, Any]:
    return response(request_id, {"kind": "error", "error": err.wire()})


def utc_now() -> str:
    """RFC 3339 UTC to the second, as the relay stamps events: `2026-05-01T10:00:05Z`."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def event(
    event_type: str,
    target_session: str,
    payload: dict[str, Any],
    *,
    created_at: str | None = None,
) -> dict[str, Any]:
    """A stream event frame (§2.7); `created_at` defaults to now."""
    return {
        "frame": "event",
        "event": {
            "event_type": event_type,
            "target_session": target_session,
            "created_at": created_at if created_at is not None else utc_now(),
            "payload": payload,
        },
    }


def encode(frame: dict[str, Any]) -> bytes:
    """Compact JSON + "\\n". Raises ValueError for what JSON cannot carry (NaN, a lone
    surrogate, a non-JSON value)."""
    try:
        text = json.dumps(frame, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return text.encode("utf-8") + b"\n"
    except (TypeError, UnicodeError, RecursionError) as exc:
        raise ValueError(f"frame cannot be encoded: {type(exc).__name__}") from None
