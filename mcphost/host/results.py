"""Center reply -> tool result text: passthrough, failures, and JSON-aware truncation.

Owns: `success_text` (the center's JSON as text, cut to a budget at a JSON-aware boundary with a
note giving the omitted size, never mid UTF-8 character) and `failure_result`. Pure.
Must never: produce invalid JSON from valid JSON, or drop the fact that something was cut.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from mcphost.errors import ToolFailure
from mcphost.mcpwire.protocol import ToolResult

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
                remaining = budget - used - _size(key) - 40
                if remaining > 200 and isinstance(item, (dict, list, str)):
                    out[key] = shrink(item, remaining)
                omitted = [k for k in value if k not in out]
                if omitted:
                    out["…omitted_keys"] = omitted[:50]
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


def invalid_arguments(tool: str, errors: Sequence[Mapping[str, Any]], agent_id: str) -> ToolFailure:
    """pydantic validation errors -> one `invalid_arguments` failure naming every field."""
    fields: list[dict[str, Any]] = []
    for error in errors:
        field = ".".join(str(part) for part in error.get("loc", ())) or "(arguments)"
        if error.get("type") == "extra_forbidden":
            root = field.split(".")[0]
            if root.lower().replace("-", "_") in IDENTITY_FIELDS:
                problem = (
                    f"identity is fixed by this host's binding (agent {agent_id}) and cannot be "
                    "passed as an argument; remove it"
                )
            else:
                problem = "unknown field; remove it (see the tool's input schema)"
        else:
            problem = str(error.get("msg", "invalid value"))
        fields.append({"field": field, "problem": problem})
    listing = "; ".join(f"{f['field']}: {f['problem']}" for f in fields)
    return ToolFailure(
        "invalid_arguments",
        f"{tool} was not called: {listing}",
        {"tool": tool, "fields": fields},
    )
