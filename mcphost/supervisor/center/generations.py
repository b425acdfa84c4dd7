"""The fleet from the center: which agents the center assigns to this worker, and generations.

Owns: `fetch_fleet` (one `GET /admin/worker/agents` through the supervisor's
shared, pinned `AdminClient`; the worker's bearer is the client's, so the center answers for the
token's worker) and `parse_fleet`, the strict reading of that reply:

    {"worker_id": "<id>", "agents": [{"agent_id": "<id>", "generation": <n>?}, ...]}

- the body is at most `MAX_REPLY_BYTES`, JSON (`application/json`) that Python can parse (JSON
  nested deeper than the recursion limit is `json_nesting_too_deep`, never a `RecursionError`),
  an object, `worker_id` a string when present and `agents` a list of at most
  `MAX_AGENTS` objects, each with a string `agent_id` and, when the center says it, the highest
  `generation` it has seen for the agent (an integer 0…2**63-1, or null/absent: not said);
- every id matches the supervisor's agent-id grammar (`mcphost.names.AGENT_ID`: it becomes
  `<state>/agents/<id>/` and an `AC_MCP_AGENT_ID`), and no id appears twice.
Other keys (at the top or in an entry) are ignored, so a center may say more. Anything else is an
`AdminFailure` `admin_protocol_error` whose `details.reason` says what (`not_json`,
`json_nesting_too_deep`, `not_an_object`, `too_many_agents`, `invalid_agent_id`,
`duplicate_agent_id`, `invalid_generation`, `reply_too_large`); the center's own refusals (401 `auth_*`, 404 on a
center without the route, injected faults) arrive as the client classifies them
(`AdmissionRefused`, `CenterRefusal`, `AdminUnavailable`, `admin_timeout`, ...).

Also `Generations` (what the center said it has seen of each agent, and the next spawn's
generation: the reservation, else one above the center's last word) and `reserve_generation`: one `POST /admin/worker/agents/<id>/generation` `{"at_least": n}`, the
center handing out the agent's next generation (above every one it has seen, recorded before it
answers), bounded by `RESERVE_TIMEOUT`; its reply must be `{"generation": g}` with
`at_least <= g <= 2**63-1`, else `admin_protocol_error` (`details.reason` `invalid_generation`).

Must never: return an id outside the grammar (ids end up in paths), echo more than 80 characters
of a refused id, or build a request other than these two (the GET carries no agent identity, the
POST only the agent id in its path and no generation header).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TypeGuard
from urllib.parse import quote

from mcphost.admin.client import AdminClient, AdminRequest, Reply, read_capped
from mcphost.errors import AdminFailure
from mcphost.names import AGENT_ID_EXPECTED, is_agent_id
from mcphost.supervisor.state import MAX_GENERATION, generation_after

ROUTE = "/admin/worker/agents"
MAX_AGENTS = 10_000
MAX_REPLY_BYTES = 4 * 1024 * 1024  # 10,000 entries of the longest id fit in under 2 MiB
RESERVE_TIMEOUT = 5.0  # a spawn waits at most this long for the center's generation
RESERVE_MAX_REPLY_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Assigned:
    """The center's answer: agent ids in its order, and the generations it said it has seen."""

    ids: list[str]
    generations: dict[str, int] = field(default_factory=dict)


async def fetch_fleet(client: AdminClient) -> Assigned:
    """The agents the center binds to this worker, with the generations it has seen.

    Raises `ToolFailure` subclasses only (see the module docstring). A read: retried once when
    the center was unavailable."""
    reply = await client.call(AdminRequest("GET", ROUTE), retry_safe=True)
    return parse_fleet(reply, target=str(client.target))


async def reserve_generation(client: AdminClient, agent_id: str, at_least: int) -> int:
    """The agent's next generation from the center (>= `at_least`), recorded there.

    Raises `ToolFailure` subclasses only: a center without the route answers 404 or 405
    (`CenterRefusal`); not retried (a reservation that may have taken effect is not repeated)."""
    route = f"{ROUTE}/{quote(agent_id, safe='')}/generation"
    target = str(client.target)
    request = AdminRequest("POST", route, {"at_least": at_least})
    async with client.stream(
        request, timeout=min(RESERVE_TIMEOUT, client.call_timeout)
    ) as response:
        body = await read_capped(response, RESERVE_MAX_REPLY_BYTES, client.target)
    try:
        generation = json.loads(body).get("generation")
    except (ValueError, RecursionError, AttributeError):
        generation = None
    if not is_generation(generation) or generation < at_least:
        raise AdminFailure(
            "admin_protocol_error",
            f"the center's reply to {route} at {target} is not a generation of at least "
            f"{at_least}; the agent starts with its local generation. Report this reply to the "
            "center's operators",
            {"reason": "invalid_generation", "target": target, "agent_id": agent_id},
        )
    return int(generation)


def is_generation(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_GENERATION


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


def parse_fleet(reply: Reply, *, target: str = "the center") -> Assigned:
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
    generations: dict[str, int] = {}
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
        generation = entry.get("generation")
        if generation is not None and not is_generation(generation):
            raise _failure(
                "invalid_generation",
                f"has a generation for {agent_id} that is not an integer from 0 to "
                f"{MAX_GENERATION} at agents[{index}] ({_shown(generation)})",
                target,
                index=index,
                agent_id=agent_id,
            )
        if generation is not None:
            generations[agent_id] = generation
        seen.add(agent_id)
        ids.append(agent_id)
    return Assigned(ids, generations)


# After the center could not be reached for a generation, spawns use the local counter (and the
# center's last word) without asking again for this long: a hung center must not hold a fleet.
RESERVE_PAUSE = 30.0


class Generations:
    """What the center said it has seen of each agent's generations (its list, its 409s), and
    the next spawn's generation: the center's reservation, else one above its last word."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}
        self._paused_until = 0.0  # loop time: the center was unreachable, don't wait on it

    def saw(self, agent_id: str, generation: int) -> None:
        if generation > self.seen.get(agent_id, 0):
            self.seen[agent_id] = generation

    async def next(self, admin: AdminClient | None, agent_id: str, local: int) -> int:
        """The generation of the agent's next spawn (`local`: the state file's next): the
        center's reservation (above every generation it has seen), else at least one above what
        it last said it has seen (event `supervisor.generation_unreserved`)."""
        import asyncio

        from mcphost import events
        from mcphost.errors import AdminUnavailable, ToolFailure

        at_least = generation_after(self.seen.get(agent_id), at_least=local)
        loop = asyncio.get_running_loop()
        if admin is None or loop.time() < self._paused_until:
            return at_least
        try:
            generation = await reserve_generation(admin, agent_id, at_least)
        except ToolFailure as exc:
            if isinstance(exc, AdminUnavailable) or exc.code == "admin_timeout":
                self._paused_until = loop.time() + RESERVE_PAUSE
            events.emit(
                "supervisor.generation_unreserved",
                level="info",
                agent_id=agent_id,
                generation=at_least,
                code=exc.code,
                status=exc.status,
            )
            return at_least
        self.saw(agent_id, generation)
        return generation
