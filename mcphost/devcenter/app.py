"""Routes of the center: the admin listener(s) and the runtime control socket.

Owns: the generic agent-tool handler (bearer -> faults -> body -> field shape -> agent on
worker -> generation fence -> field values -> tool logic -> padding), the worker's agent list
(`GET /admin/worker/agents`: bearer -> faults -> the token's worker's agents, each with the
highest generation seen), the generation reservation (`POST
/admin/worker/agents/<id>/generation`: bearer -> faults -> body -> agent on worker -> the next
generation, recorded), the control handlers (faults, request log, forks, workers, binding
agents to workers, rotating a worker's token) and runtime handlers, the JSON error middleware and the two route tables.
Must never: answer an admin route before authenticating it, accept an unknown body field,
or return a non-JSON error.
"""

from __future__ import annotations

import re
import sys
import traceback
from collections.abc import Awaitable, Callable

from aiohttp import web

from mcphost.devcenter import files, ids, openapi, specs
from mcphost.devcenter.center import CENTER_KEY, GENERATION_HEADER, Center
from mcphost.devcenter.control import Faults
from mcphost.devcenter.errors import ApiError
from mcphost.devcenter.store import token_file
from mcphost.devcenter.tools import HANDLERS

WORKER_ID = re.compile(r"w-[a-z0-9]{1,32}")

# -- handlers ------------------------------------------------------------------------------


async def agent_tool(request: web.Request) -> web.Response:
    center: Center = request.app[CENTER_KEY]
    worker = center.authenticate(request)
    name = request.match_info["tool"]
    spec = specs.TOOLS.get(name)
    if spec is None:
        raise ApiError(
            404, "unknown_tool", f"no agent tool {name!r}; see /openapi.json for the routes"
        )
    await center.faults.before(name)
    body = await center.json_body(request)
    specs.check_shape(body, spec.allowed, spec.fields)
    agent_id = center.gate(request, worker, body.get("agent_id"))
    args = specs.check_values(body, spec.fields)
    result = HANDLERS[name](center, agent_id, args)
    return web.json_response(center.faults.pad(name, result), status=spec.status)


async def worker_agents(request: web.Request) -> web.Response:
    """The agents bound to the worker whose token is presented (a supervisor's fleet)."""
    center: Center = request.app[CENTER_KEY]
    worker = await center.admit(request, "worker_agents")
    rows = center.store.all(
        "SELECT agent_id, COALESCE(generation, 0) AS generation FROM agents "
        "LEFT JOIN generations USING (agent_id) WHERE worker_id = ? ORDER BY agent_id",
        worker,
    )
    body = {"worker_id": worker, "agents": rows}
    return web.json_response(center.faults.pad("worker_agents", body))


async def reserve_generation(request: web.Request) -> web.Response:
    """The agent's next generation, above every one the center has seen, recorded at once."""
    center: Center = request.app[CENTER_KEY]
    worker = await center.admit(request, "worker_generation")
    body = await center.json_body(request)
    unknown = sorted(set(body) - {"at_least"})
    if unknown:
        raise ApiError(400, "invalid_input", f"unknown field(s) {', '.join(unknown)}")
    at_least = body.get("at_least", 0)
    if (
        not isinstance(at_least, int)
        or isinstance(at_least, bool)
        or not 0 <= at_least <= specs.MAX_GENERATION
    ):
        raise ApiError(
            400, "invalid_input", f"at_least must be an integer from 0 to {specs.MAX_GENERATION}"
        )
    agent_id = center.bound_agent(worker, request.match_info["agent_id"])
    generation = center.store.reserve_generation(agent_id, at_least, specs.MAX_GENERATION)
    if generation is None:
        raise ApiError(
            409,
            "generation_exhausted",
            f"agent {agent_id} has used every generation up to {specs.MAX_GENERATION}",
        )
    reply = {"agent_id": agent_id, "generation": generation}
    return web.json_response(center.faults.pad("worker_generation", reply))


async def add_worker(request: web.Request) -> web.Response:
    """Control: create a worker and its token file (tests with more workers than the seed)."""
    center: Center = request.app[CENTER_KEY]
    body = await center.json_body(request)
    worker_id = body.get("worker_id")
    if set(body) != {"worker_id"} or not isinstance(worker_id, str):
        raise ApiError(400, "invalid_input", 'send {"worker_id": "w-<letters, digits>"}')
    if not WORKER_ID.fullmatch(worker_id):
        raise ApiError(400, "invalid_input", "worker_id must match w-[a-z0-9]{1,32}")
    if not center.store.add_worker(center.state, worker_id):
        raise ApiError(409, "worker_exists", f"worker {worker_id} exists already")
    return web.json_response(
        {"ok": True, "worker_id": worker_id, "token_file": str(token_file(center.state, worker_id))}
    )


async def bind_agents(request: web.Request) -> web.Response:
    """Control: create agents on a worker, or move them to it (tests of the center fleet)."""
    center: Center = request.app[CENTER_KEY]
    body = await center.json_body(request)
    unknown = sorted(set(body) - {"worker_id", "agent_ids", "projects"})
    if unknown:
        raise ApiError(400, "invalid_input", f"unknown field(s) {', '.join(unknown)}")
    worker_id, agent_ids, projects = (
        body.get("worker_id"),
        body.get("agent_ids"),
        body.get("projects", []),
    )
    if not isinstance(worker_id, str) or not center.store.one(
        "SELECT 1 AS x FROM workers WHERE worker_id = ?", worker_id
    ):
        raise ApiError(404, "not_found", "worker_id must name a worker (w-1, w-2)")
    for name, values in (("agent_ids", agent_ids), ("projects", projects)):
        if not isinstance(values, list) or not all(
            isinstance(v, str) and 0 < len(v) <= 4096 for v in values
        ):
            raise ApiError(400, "invalid_input", f"{name} must be a list of non-empty strings")
    assert isinstance(agent_ids, list) and isinstance(projects, list)
    if any(center.store.project(p) is None for p in projects):
        raise ApiError(404, "project_not_found", "every project must exist (p-1, p-2)")
    with center.store.tx() as db:
        db.executemany(
            "INSERT INTO agents VALUES (?, ?) ON CONFLICT(agent_id) "
            "DO UPDATE SET worker_id = excluded.worker_id",
            [(agent_id, worker_id) for agent_id in agent_ids],
        )
        db.executemany(
            "INSERT OR IGNORE INTO project_members VALUES (?, ?)",
            [(p, agent_id) for p in projects for agent_id in agent_ids],
        )
    return web.json_response({"ok": True, "worker_id": worker_id, "agent_ids": agent_ids})


async def unbind_agent(request: web.Request) -> web.Response:
    """Control: delete an agent (and its project memberships)."""
    center: Center = request.app[CENTER_KEY]
    agent_id = request.match_info["agent_id"]
    with center.store.tx() as db:
        gone = db.execute("DELETE FROM agents WHERE agent_id = ?", (agent_id,)).rowcount
        db.execute("DELETE FROM project_members WHERE agent_id = ?", (agent_id,))
    if not gone:
        raise ApiError(404, "not_found", f"agent {agent_id!r} does not exist")
    return web.json_response({"ok": True, "agent_id": agent_id})


async def rotate_token(request: web.Request) -> web.Response:
    """Control: a new token for a worker, written to its token file; the old one is accepted
    for `overlap_seconds` more (tests of token rotation)."""
    center: Center = request.app[CENTER_KEY]
    body = await center.json_body(request)
    unknown = sorted(set(body) - {"overlap_seconds"})
    if unknown:
        raise ApiError(400, "invalid_input", f"unknown field(s) {', '.join(unknown)}")
    overlap = body.get("overlap_seconds", 0)
    if isinstance(overlap, bool) or not isinstance(overlap, int | float) or not overlap >= 0:
        raise ApiError(400, "invalid_input", "overlap_seconds must be a number >= 0")
    worker_id = request.match_info["worker_id"]
    until = center.store.rotate_token(center.state, worker_id, float(overlap))
    if until is None:
        raise ApiError(404, "not_found", "worker_id must name a worker (w-1, w-2)")
    return web.json_response({"ok": True, "worker_id": worker_id, "old_token_valid_until": until})


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
    return web.json_response(center.requests.last(limit))


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
        "INSERT INTO forks VALUES (?, ?, ?, ?, ?, ?, ?)",
        fork_id,
        agent_id,
        args["task_id"],
        args["model"],
        args["context"],
        ids.stamp(),
        request.headers.get(GENERATION_HEADER),  # recorded as sent (None: absent), not fenced
    )
    return web.json_response(
        {
            "ok": True,
            "status": "accepted",
            "fork_id": fork_id,
            "task_id": args["task_id"],
            "agent_id": agent_id,
        },
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
        # a repeated key shows its first value: the one the handlers read
        query = {key: request.query.getone(key) for key in request.query}
        request["log_entry"] = center.requests.record(
            request.method, request.path, query, dict(request.headers)
        )
    try:
        return await handler(request)
    except ApiError as exc:
        return web.json_response(exc.body(), status=exc.status)
    except web.HTTPMethodNotAllowed as exc:
        return web.json_response(
            {
                "error": "method_not_allowed",
                "message": f"{request.method} is not allowed here; use {', '.join(sorted(exc.allowed_methods))}",
            },
            status=405,
            headers={"Allow": ",".join(sorted(exc.allowed_methods))},
        )
    except web.HTTPNotFound:
        if request.path.startswith("/admin/agent-tools/"):
            return web.json_response(
                {
                    "error": "unknown_tool",
                    "message": "no such agent tool; see /openapi.json for the routes",
                },
                status=404,
            )
        return web.json_response(
            {"error": "not_found", "message": f"no route {request.path}; see /openapi.json"},
            status=404,
        )
    except web.HTTPException:
        raise
    except ConnectionError:
        # the client hung up mid-request (a cancelled upload or download): not a center bug,
        # and no one is left to read the answer (499: client closed request)
        return web.json_response(
            {"error": "client_closed_request", "message": "the client closed the connection"},
            status=499,
        )
    except Exception as exc:  # a bug in the reference center: say so, in the envelope
        traceback.print_exc(file=sys.stderr)
        return web.json_response(
            {
                "error": "internal",
                "message": f"devcenter bug ({type(exc).__name__}); see its stderr",
            },
            status=500,
        )


def admin_app(center: Center, *, control: bool) -> web.Application:
    app = web.Application(middlewares=[json_errors], client_max_size=1024**2)
    app[CENTER_KEY] = center
    app.router.add_post("/admin/agent-tools/{tool}", agent_tool)
    app.router.add_put("/admin/files/transfer/{transfer_id}", files.put_transfer)
    app.router.add_post("/admin/files/transfer/{transfer_id}/complete", files.complete_transfer)
    app.router.add_get("/admin/files/{file_id}", files.download, allow_head=False)
    app.router.add_get("/admin/worker/agents", worker_agents, allow_head=False)
    app.router.add_post("/admin/worker/agents/{agent_id}/generation", reserve_generation)
    app.router.add_get("/healthz", healthz, allow_head=False)
    app.router.add_get("/openapi.json", openapi_json, allow_head=False)
    if control:
        app.router.add_post("/_devcenter/workers", add_worker)
        app.router.add_post("/_devcenter/agents", bind_agents)
        app.router.add_delete("/_devcenter/agents/{agent_id}", unbind_agent)
        app.router.add_post("/_devcenter/faults", set_faults)
        app.router.add_post("/_devcenter/workers/{worker_id}/token", rotate_token)
        app.router.add_get("/_devcenter/requests", get_requests, allow_head=False)
        app.router.add_get("/_devcenter/forks", list_forks, allow_head=False)
    return app


def runtime_app(center: Center) -> web.Application:
    app = web.Application(middlewares=[json_errors])
    app[CENTER_KEY] = center
    app.router.add_post("/runtime/fork_executor", fork_executor)
    app.router.add_get("/runtime/forks", list_forks, allow_head=False)
    return app
