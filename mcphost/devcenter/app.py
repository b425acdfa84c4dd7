"""Wiring of the center's HTTP surface: auth, the agent gate, generation fencing, routes.

Owns: `Center` (the state a request needs: store, faults, request log, blob dir), the
admission sequence every admin route runs (bearer -> faults -> body -> fields -> agent on
worker -> generation fence), the JSON error middleware, and the route tables of the admin
listener and the runtime control socket.
Must never: answer an admin route before authenticating it, accept an unknown body field,
or return a non-JSON error.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from mcphost.devcenter import files, ids, openapi, specs
from mcphost.devcenter.control import Faults, RequestLog
from mcphost.devcenter.errors import ApiError
from mcphost.devcenter.store import TOKEN_PREFIX, Store
from mcphost.devcenter.tools import HANDLERS

GENERATION_HEADER = "X-AC-MCP-Generation"
CENTER_KEY = "center"


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
            raise ApiError(401, "auth_unknown", "this worker token is not known to the center; check AC_MCP_WORKER_TOKEN")
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
        except ValueError:
            raise ApiError(400, "invalid_generation", f"{GENERATION_HEADER} must be an integer") from None
        if not agent_id:
            raise ApiError(400, "missing_agent_id", "agent_id is required (the host injects it)")
        if not isinstance(agent_id, str):
            raise ApiError(400, "invalid_input", "agent_id must be a string")
        agent = self.store.agent(agent_id)
        if agent is None:
            raise ApiError(404, "not_found", f"agent {agent_id!r} does not exist")
        if agent["worker_id"] != worker:
            raise ApiError(403, "agent_not_bound_to_worker", "agent is not bound to this worker")
        newer = self.store.fence_generation(agent_id, generation)
        if newer is not None:
            raise ApiError(
                409,
                "stale_generation",
                f"a newer host generation ({newer}) has taken over agent {agent_id}; this host "
                f"(generation {generation}) must stop",
            )
        return agent_id


# -- handlers ------------------------------------------------------------------------------


async def agent_tool(request: web.Request) -> web.Response:
    center: Center = request.app[CENTER_KEY]
    worker = center.authenticate(request)
    name = request.match_info["tool"]
    spec = specs.TOOLS.get(name)
    if spec is None:
        raise ApiError(404, "unknown_tool", f"no agent tool {name!r}; see /openapi.json for the routes")
    await center.faults.before(name)
    body = await center.json_body(request)
    specs.check_shape(body, spec.allowed, spec.fields)
    agent_id = center.gate(request, worker, body.get("agent_id"))
    args = specs.check_values(body, spec.fields)
    result = HANDLERS[name](center, agent_id, args)
    return web.json_response(center.faults.pad(name, result), status=spec.status)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def openapi_json(request: web.Request) -> web.Response:
    return web.json_response(openapi.document())


async def set_faults(request: web.Request) -> web.Response:
    center: Center = request.app[CENTER_KEY]
    center.faults = Faults.parse(await center.json_body(request))
    return web.json_response({"ok": True, "faults": center.faults.as_json()})


async def get_requests(request: web.Request) -> web.Response:
    center: Center = request.app[CENTER_KEY]
    try:
        limit = int(request.query.get("limit", "50"))
    except ValueError:
        raise ApiError(400, "invalid_input", "limit must be an integer") from None
    return web.json_response({"requests": center.requests.last(limit)})


async def fork_executor(request: web.Request) -> web.Response:
    center: Center = request.app[CENTER_KEY]
    body = await center.json_body(request)
    specs.check_shape(body, specs.FORK_ALLOWED, specs.FORK_FIELDS)
    if not body.get("task_id"):
        raise ApiError(400, "missing_task_id", "task_id is required")
    agent_id = body.get("agent_id")
    if not agent_id:
        raise ApiError(400, "missing_agent_id", "agent_id is required")
    if center.store.agent(agent_id) is None:
        raise ApiError(404, "not_found", f"agent {agent_id!r} does not exist")
    args = specs.check_values(body, specs.FORK_FIELDS)
    fork_id = "f-" + ids.ulid()
    center.store.run(
        "INSERT INTO forks VALUES (?, ?, ?, ?, ?, ?)",
        fork_id,
        agent_id,
        args["task_id"],
        args["model"],
        args["context"],
        ids.stamp(),
    )
    return web.json_response(
        {"ok": True, "status": "accepted", "fork_id": fork_id, "task_id": args["task_id"], "agent_id": agent_id},
        status=202,
    )


async def list_forks(request: web.Request) -> web.Response:
    center: Center = request.app[CENTER_KEY]
    return web.json_response({"forks": center.store.all("SELECT * FROM forks ORDER BY rowid")})


# -- middleware ----------------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_UNLOGGED = ("/_devcenter/", "/healthz", "/openapi.json", "/runtime/")


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    center: Center = request.app[CENTER_KEY]
    if not request.path.startswith(_UNLOGGED):
        request["log_entry"] = center.requests.record(request.method, request.path, dict(request.headers))
    try:
        return await handler(request)
    except ApiError as exc:
        return web.json_response(exc.body(), status=exc.status)
    except web.HTTPMethodNotAllowed as exc:
        return web.json_response(
            {"error": "method_not_allowed", "message": f"{request.method} is not allowed here; use {', '.join(sorted(exc.allowed_methods))}"},
            status=405,
            headers={"Allow": ",".join(sorted(exc.allowed_methods))},
        )
    except web.HTTPNotFound:
        if request.path.startswith("/admin/agent-tools/"):
            return web.json_response(
                {"error": "unknown_tool", "message": "no such agent tool; see /openapi.json for the routes"},
                status=404,
            )
        return web.json_response(
            {"error": "not_found", "message": f"no route {request.path}; see /openapi.json"}, status=404
        )


def admin_app(center: Center, *, control: bool) -> web.Application:
    app = web.Application(middlewares=[json_errors], client_max_size=1024**2)
    app[CENTER_KEY] = center
    app.router.add_post("/admin/agent-tools/{tool}", agent_tool)
    app.router.add_put("/admin/files/transfer/{transfer_id}", files.put_transfer)
    app.router.add_post("/admin/files/transfer/{transfer_id}/complete", files.complete_transfer)
    app.router.add_get("/admin/files/{file_id}", files.download, allow_head=False)
    app.router.add_get("/healthz", healthz, allow_head=False)
    app.router.add_get("/openapi.json", openapi_json, allow_head=False)
    if control:
        app.router.add_post("/_devcenter/faults", set_faults)
        app.router.add_get("/_devcenter/requests", get_requests, allow_head=False)
        app.router.add_get("/_devcenter/forks", list_forks, allow_head=False)
    return app


def runtime_app(center: Center) -> web.Application:
    app = web.Application(middlewares=[json_errors])
    app[CENTER_KEY] = center
    app.router.add_post("/runtime/fork_executor", fork_executor)
    app.router.add_get("/runtime/forks", list_forks, allow_head=False)
    return app
