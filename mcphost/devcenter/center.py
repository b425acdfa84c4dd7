"""The per-process center state and the admission sequence every admin route runs.

Owns: `Center` (store, fault table, request log, blob dir) and its steps: bearer ->
worker (`authenticate`), faults (`admit`), JSON object body (`json_body`), agent on worker
(`bound_agent`) and generation fencing (`gate`; a 409 `stale_generation` names the generation
sent and the current one). `CENTER_KEY` is how handlers find it on the aiohttp app.
Must never: let a request through with an unknown or mismatched token, or remember a
generation for an agent the token's worker does not own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aiohttp import web

from mcphost.devcenter.control import Faults, RequestLog
from mcphost.devcenter.errors import ApiError
from mcphost.devcenter.specs import MAX_GENERATION
from mcphost.devcenter.store import TOKEN_PREFIX, Store

GENERATION_HEADER = "X-AC-MCP-Generation"


class Center:
    def __init__(self, store: Store, state: Path) -> None:
        self.store = store
        self.state = state
        self.blob_dir = state / "blobs"
        self.blob_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.faults = Faults()
        self.requests = RequestLog()

    # -- admission -------------------------------------------------------------------------

    def authenticate(self, request: web.Request) -> str:
        """Bearer token -> worker id, or 401 with a specific code."""
        header = request.headers.get("Authorization", "").strip()
        scheme, _, token = header.partition(" ")
        if not header or scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "auth_missing", "send Authorization: Bearer <worker token>")
        token = token.strip()
        if not token.startswith(TOKEN_PREFIX):
            raise ApiError(401, "auth_invalid_format", f"bearer must start with {TOKEN_PREFIX}")
        worker = self.store.worker_for_token(token)
        if worker is None:
            raise ApiError(
                401,
                "auth_unknown",
                "this worker token is not known to the center; check AC_MCP_WORKER_TOKEN",
            )
        return worker

    async def admit(self, request: web.Request, fault_key: str) -> str:
        worker = self.authenticate(request)
        await self.faults.before(fault_key)
        return worker

    async def json_body(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        if not raw.strip():
            body: Any = {}
        else:
            try:
                body = json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ApiError(400, "invalid_json", f"the body is not JSON: {exc}") from None
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(
                400, "invalid_json", "the body contains invalid Unicode (a lone surrogate)"
            ) from None
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(400, "invalid_json", "the body contains a lone surrogate") from None
        entry = request.get("log_entry")
        if entry is not None:
            entry["body"] = body
        if not isinstance(body, dict):
            raise ApiError(400, "invalid_json", "the body must be a JSON object")
        return body

    def gate(self, request: web.Request, worker: str, agent_id: Any) -> str:
        """The agent-on-worker check plus generation fencing; returns the agent id."""
        raw_gen = request.headers.get(GENERATION_HEADER, "").strip()
        try:
            generation = int(raw_gen) if raw_gen else 0
            if not 0 <= generation <= MAX_GENERATION:
                raise ValueError(raw_gen)
        except ValueError:
            raise ApiError(
                400,
                "invalid_generation",
                f"{GENERATION_HEADER} must be an integer from 0 to {MAX_GENERATION}",
            ) from None
        agent_id = self.bound_agent(worker, agent_id)
        newer = self.store.fence_generation(agent_id, generation)
        if newer is not None:
            raise ApiError(
                409,
                "stale_generation",
                f"a newer host generation ({newer}) has taken over agent {agent_id}; this host "
                f"(generation {generation}) must stop",
                generation=generation,
                current_generation=newer,
            )
        return agent_id

    def bound_agent(self, worker: str, agent_id: Any) -> str:
        """`agent_id` if it names an agent bound to `worker`; else 400, 404 or 403."""
        if not agent_id:
            raise ApiError(400, "missing_agent_id", "agent_id is required (the host injects it)")
        if not isinstance(agent_id, str):
            raise ApiError(400, "invalid_input", "agent_id must be a string")
        agent = self.store.agent(agent_id)
        if agent is None:
            raise ApiError(404, "not_found", f"agent {agent_id!r} does not exist")
        if agent["worker_id"] != worker:
            raise ApiError(403, "agent_not_bound_to_worker", "agent is not bound to this worker")
        return agent_id


CENTER_KEY = web.AppKey("center", Center)
