"""Center reply -> tool result text: passthrough, failures, and JSON-aware truncation.

Owns: `success_text` (the center's JSON as text, cut to a budget at a JSON-aware boundary with a
note giving the omitted size, never mid UTF-8 character), `failure_result`, and the argument
refusals `invalid_arguments` / `arguments_too_large` (bounded in size whatever the input). Pure.
Must never: produce invalid JSON from valid JSON, or drop the fact that something was cut.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from mcphost.admin.client import nesting_failure
from mcphost.argbounds import MAX_REPORTED_FIELDS, Oversize, short_name
from mcphost.errors import ToolFailure
from mcphost.surface import ToolResult

MAX_RESULT_BYTES = 64 * 1024
_NOTE = (
    "the result was cut to fit the tool-result budget; ask for less (a narrower call) if you "
    "need the omitted part"
)


def _size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def _cut_str(text: str, budget: int) -> str:
    """Keep a prefix of `text` whose UTF-8 encoding fits `budget` bytes, on a char boundary."""
    encoded = text.encode()
    if len(encoded) <= budget:
        return text
    kept = encoded[: max(budget, 0)].decode("utf-8", "ignore")
    return f"{kept}…[{len(encoded) - len(kept.encode())} bytes omitted]"


_OMITTED_KEYS_BYTES = 200  # room kept for the `…omitted_keys` listing of a cut object


def _some_names(names: list[str], budget: int) -> list[str]:
    """As many of `names` (each cut short) as fit `budget` bytes, then a count of the rest."""
    kept: list[str] = []
    used = 2
    for name in names:
        shown = _cut_str(name, 40)
        if used + _size(shown) + 1 > budget:
            break
        kept.append(shown)
        used += _size(shown) + 1
    if len(kept) < len(names):
        kept.append(f"…[{len(names) - len(kept)} more keys]")
    return kept


def shrink(value: Any, budget: int) -> Any:
    """A pruned copy of `value` whose compact JSON is about `budget` bytes at most."""
    if _size(value) <= budget:
        return value
    if isinstance(value, str):
        return _cut_str(value, budget - 40)
    if isinstance(value, list):
        kept: list[Any] = []
        used = 2
        for index, item in enumerate(value):
            item_size = _size(item) + 1
            if used + item_size > budget:
                remaining = budget - used - 60
                if remaining > 200 and isinstance(item, (dict, list, str)):
                    kept.append(shrink(item, remaining))
                    index += 1
                kept.append(f"…[{len(value) - index} more items omitted]")
                return kept
            kept.append(item)
            used += item_size
        return kept
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        used = 2
        for key, item in value.items():
            entry = _size(key) + 1 + _size(item) + 1
            if used + entry > budget:
                remaining = budget - used - _size(key) - 40 - _OMITTED_KEYS_BYTES
                if remaining > 200 and isinstance(item, (dict, list, str)):
                    out[key] = shrink(item, remaining)
                omitted = [k for k in value if k not in out]
                if omitted:
                    out["…omitted_keys"] = _some_names(omitted, _OMITTED_KEYS_BYTES - 40)
                return out
            out[key] = item
            used += entry
        return out
    return value


def success_text(body: bytes, budget: int = MAX_RESULT_BYTES) -> str:
    """The center's 2xx body as tool-result text, within `budget` bytes (plus a small note)."""
    if len(body) <= budget:
        return body.decode("utf-8", "replace")
    try:
        parsed = json.loads(body)
    except RecursionError:  # nesting deeper than the recursion limit: classified, not a crash
        raise nesting_failure(len(body)) from None
    except ValueError:
        text = _cut_str(body.decode("utf-8", "replace"), budget)
        return text
    partial = shrink(parsed, budget - 300)
    kept = _size(partial)
    return json.dumps(
        {
            "truncated": True,
            "total_bytes": len(body),
            "omitted_bytes": max(len(body) - kept, 0),
            "note": _NOTE,
            "partial": partial,
        },
        ensure_ascii=False,
    )


def failure_result(failure: ToolFailure) -> ToolResult:
    return ToolResult(text=failure.text(), is_error=True)


IDENTITY_FIELDS = frozenset({"agent_id", "agentid", "agent", "agent_root", "worker_id"})
_IDENTITY_MAX_LEN = max(len(name) for name in IDENTITY_FIELDS)


def _identity_key(key: Any) -> bool:
    return (
        isinstance(key, str)
        and len(key) <= _IDENTITY_MAX_LEN
        and key.lower().replace("-", "_") in IDENTITY_FIELDS
    )


def _smuggles_identity(error: Mapping[str, Any]) -> bool:
    loc = error.get("loc", ())
    return error.get("type") == "extra_forbidden" and bool(loc) and _identity_key(loc[0])


def _identity_problem(agent_id: str) -> str:
    return (
        f"identity is fixed by this host's binding (agent {agent_id}) and cannot be "
        "passed as an argument; remove it"
    )


def invalid_arguments(tool: str, errors: Sequence[Mapping[str, Any]], agent_id: str) -> ToolFailure:
    """pydantic validation errors -> one `invalid_arguments` failure, small whatever the input.

    Names at most `MAX_REPORTED_FIELDS` fields (identity fields first, so the reason a smuggled
    `agent_id` was refused is never among the omitted), each name cut to `MAX_NAME_CHARS`, and
    counts the rest in `details.omitted_fields` (present only when something was left out).
    """
    chosen = itertools.islice(
        itertools.chain(
            (e for e in errors if _smuggles_identity(e)),
            (e for e in errors if not _smuggles_identity(e)),
        ),
        MAX_REPORTED_FIELDS,
    )
    fields: list[dict[str, Any]] = []
    for error in chosen:
        loc = error.get("loc", ())
        field = ".".join(short_name(str(part)) for part in loc) or "(arguments)"
        if _smuggles_identity(error):
            problem = _identity_problem(agent_id)
        elif error.get("type") == "extra_forbidden":
            problem = "unknown field; remove it (see the tool's input schema)"
        else:
            problem = str(error.get("msg", "invalid value"))
        fields.append({"field": field, "problem": problem})
    omitted = len(errors) - len(fields)
    listing = "; ".join(f"{f['field']}: {f['problem']}" for f in fields)
    details: dict[str, Any] = {"tool": tool, "fields": fields}
    if omitted > 0:
        listing += f"; and {omitted} more field(s) not listed"
        details["omitted_fields"] = omitted
    return ToolFailure("invalid_arguments", f"{tool} was not called: {listing}", details)


def arguments_too_large(
    tool: str, found: Oversize, arguments: Mapping[str, Any], agent_id: str
) -> ToolFailure:
    """An arguments object over a limit of `mcphost.argbounds`: refused unread, in a few bytes.

    Same code as any other argument refusal (`invalid_arguments`: the call was not made, fix the
    arguments), told apart by `details.reason = "arguments_too_large"` with the limits. Identity
    keys at the top level (an O(1) lookup each, never a scan) are still named as such.
    """
    message = (
        f"{tool} was not called: its arguments are too large to check ({found.message}); "
        "send only the fields of the tool's input schema"
    )
    identity = sorted(key for key in IDENTITY_FIELDS if key in arguments)
    if identity:
        message += f"; {', '.join(identity)}: {_identity_problem(agent_id)}"
    return ToolFailure(
        "invalid_arguments",
        message,
        {
            "tool": tool,
            **found.details(),
            "remedy": "call the tool with only the fields its inputSchema lists (tools/list)",
        },
    )
