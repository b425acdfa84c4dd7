"""The fleet from the center: which agents the center assigns to this worker.

Owns: `fetch_assigned` (one `GET /admin/worker/agents` through the supervisor's shared, pinned
`AdminClient`; the worker's bearer is the client's, so the center answers for the token's worker)
and `parse_assigned`, the strict reading of that reply:

    {"worker_id": "<id>", "agents": [{"agent_id": "<id>"}, ...]}

- the body is at most `MAX_REPLY_BYTES`, JSON (`application/json`) that Python can parse (JSON
  nested deeper than the recursion limit is `json_nesting_too_deep`, never a `RecursionError`),
  an object, `worker_id` a string when present and `agents` a list of at most
  `MAX_AGENTS` objects, each with a string `agent_id`;
- every id matches the supervisor's agent-id grammar (`mcphost.names.AGENT_ID`: it becomes
  `<state>/agents/<id>/` and an `AC_MCP_AGENT_ID`), and no id appears twice.
Other keys (at the top or in an entry) are ignored, so a center may say more. Anything else is an
`AdminFailure` `admin_protocol_error` whose `details.reason` says what (`not_json`,
`json_nesting_too_deep`, `not_an_object`, `too_many_agents`, `invalid_agent_id`,
`duplicate_agent_id`, `reply_too_large`); the center's own refusals (401 `auth_*`, 404 on a
center without the route, injected faults) arrive as the client classifies them
(`AdmissionRefused`, `CenterRefusal`, `AdminUnavailable`, `admin_timeout`, ...).

Must never: return an id outside the grammar (ids end up in paths), echo more than 80 characters
of a refused id, or build a request other than this one GET (no identity of an agent in it).
"""

from __future__ import annotations

import json
from typing import Any

from mcphost.admin.client import AdminClient, AdminRequest, Reply
from mcphost.errors import AdminFailure
from mcphost.names import AGENT_ID_EXPECTED, is_agent_id

ROUTE = "/admin/worker/agents"
MAX_AGENTS = 10_000
MAX_REPLY_BYTES = 4 * 1024 * 1024  # 10,000 entries of the longest id fit in under 2 MiB


async def fetch_assigned(client: AdminClient) -> list[str]:
    """The ids of the agents the center binds to this worker, in the center's order.

    Raises `ToolFailure` subclasses only (see the module docstring). A read: retried once when
    the center was unavailable."""
    reply = await client.call(AdminRequest("GET", ROUTE), retry_safe=True)
    return parse_assigned(reply, target=str(client.target))


def _failure(reason: str, message: str, target: str, **details: Any) -> AdminFailure:
    return AdminFailure(
        "admin_protocol_error",
        f"the center's agent list for this worker ({ROUTE} at {target}) {message}; nothing was "
        "changed. Report this reply to the center's operators",
        {"reason": reason, "target": target, **details},
    )


def _shown(value: Any) -> str:
    if not isinstance(value, str):
        return f"a JSON {type(value).__name__}" if value is not None else "missing"
    text = value
    return repr(text[:80] + ("…" if len(text) > 80 else ""))


def parse_assigned(reply: Reply, *, target: str = "the center") -> list[str]:
    """The strict reading of a 2xx reply of `GET /admin/worker/agents` (see the module)."""
    body = reply.body
    if len(body) > MAX_REPLY_BYTES:
        raise _failure(
            "reply_too_large",
            f"is {len(body)} bytes, over the {MAX_REPLY_BYTES} a list of {MAX_AGENTS} "
            "agents can need",
            target,
            reply_bytes=len(body),
            limit_bytes=MAX_REPLY_BYTES,
        )
    if reply.content_type != "application/json":
        raise _failure(
            "not_json",
            f"came as {reply.content_type or 'no content type'}, not application/json",
            target,
        )
    try:
        data = json.loads(body)
    except RecursionError:
        raise _failure(
            "json_nesting_too_deep",
            "is JSON nested too deeply to read",
            target,
            reply_bytes=len(body),
        ) from None
    except ValueError:
        raise _failure("not_json", "is not JSON", target, reply_bytes=len(body)) from None
    if not isinstance(data, dict) or not isinstance(data.get("agents"), list):
        raise _failure("not_an_object", 'is not an object with an "agents" list', target)
    if "worker_id" in data and not isinstance(data["worker_id"], str):
        raise _failure("not_an_object", '"worker_id" is not a string', target)
    entries: list[Any] = data["agents"]
    if len(entries) > MAX_AGENTS:
        raise _failure(
            "too_many_agents",
            f"names {len(entries)} agents; one supervisor runs at most {MAX_AGENTS}",
            target,
            agents=len(entries),
            limit=MAX_AGENTS,
        )
    ids: list[str] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        agent_id = entry.get("agent_id") if isinstance(entry, dict) else None
        if not isinstance(agent_id, str) or not is_agent_id(agent_id):
            shown = _shown(agent_id if isinstance(entry, dict) else entry)
            raise _failure(
                "invalid_agent_id",
                f"has an agent id that is not {AGENT_ID_EXPECTED} at agents[{index}] ({shown})",
                target,
                index=index,
                expected=AGENT_ID_EXPECTED,
            )
        if agent_id in seen:
            raise _failure(
                "duplicate_agent_id",
                f"names {agent_id} twice",
                target,
                index=index,
                agent_id=agent_id,
            )
        seen.add(agent_id)
        ids.append(agent_id)
    return ids
