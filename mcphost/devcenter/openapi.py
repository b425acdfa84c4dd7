"""The OpenAPI 3.0 document of the admin listener, generated from the tool table.

Owns: `document()`: every admin route with its request schema (additionalProperties false),
success and error responses, the generation header and the bearer security scheme. Used for
schemathesis fuzzing and for the OpenAPI -> MCP peer benchmark, so it must stay truthful.
Must never: describe a route the app does not serve, or be written by hand (it derives from
`specs`, the same data the app validates with).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from mcphost import __version__
from mcphost.devcenter import specs

_ERROR_TEXT = {
    400: "invalid request (invalid_json, invalid_input, missing_*, invalid_generation, ...)",
    401: "authentication failed (auth_missing, auth_invalid_format, auth_unknown)",
    403: "forbidden (agent_not_bound_to_worker, not_a_project_member, not_agents_task, ...)",
    404: "not found (not_found, project_not_found, issue_not_found)",
    409: "conflict (stale_generation, illegal_transition, blob_exists, ...)",
    422: "the completion does not match the bytes received",
}
_ERROR_REF = {"$ref": "#/components/schemas/Error"}
_GENERATION = {
    "name": "X-AC-MCP-Generation",
    "in": "header",
    "required": False,
    "description": "the host generation; a lower one than the highest seen for the agent is refused (409)",
    "schema": {"type": "integer", "minimum": 0, "maximum": specs.MAX_GENERATION},
}


def _agent_query() -> dict[str, Any]:
    return {
        "name": "agent_id",
        "in": "query",
        "required": True,
        "schema": {"type": "string", "minLength": 1},
    }


def _path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _responses(
    ok: int, ok_schema: dict[str, Any] | None, errors: tuple[int, ...], *, binary: bool = False
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if binary:
        out[str(ok)] = {
            "description": "the file's bytes, with its recorded MIME type",
            "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
        }
    else:
        out[str(ok)] = {
            "description": "success",
            "content": {"application/json": {"schema": ok_schema}},
        }
    for status in sorted({*errors, 400, 401}):
        out[str(status)] = {
            "description": _ERROR_TEXT[status],
            "content": {"application/json": {"schema": _ERROR_REF}},
        }
    return out


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


@cache
def document() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for tool in specs.TOOLS.values():
        paths[f"/admin/agent-tools/{tool.name}"] = {
            "post": {
                "operationId": tool.name,
                "summary": tool.summary,
                "tags": ["agent-tools"],
                "parameters": [_GENERATION],
                "requestBody": _json_body(tool.request_schema()),
                "responses": _responses(tool.status, tool.response, tool.errors),
            }
        }
    complete_props = {f.name: f.schema() for f in (specs.AGENT_ID, *specs.COMPLETE_FIELDS)}
    complete_schema = {
        "type": "object",
        "properties": complete_props,
        "required": ["agent_id", "sha256", "size"],
        "additionalProperties": False,
    }
    paths["/admin/files/transfer/{transfer_id}"] = {
        "put": {
            "operationId": "put_transfer_bytes",
            "summary": "Stream the bytes of an upload session (write-once).",
            "tags": ["files"],
            "parameters": [_path_param("transfer_id"), _agent_query(), _GENERATION],
            "requestBody": {
                "required": True,
                "content": {
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
                },
            },
            "responses": _responses(200, specs.PUT_RESPONSE, (400, 401, 403, 404, 409)),
        }
    }
    paths["/admin/files/transfer/{transfer_id}/complete"] = {
        "post": {
            "operationId": "complete_transfer",
            "summary": "Finish an upload: check sha256 and size, record the file, optionally place it.",
            "tags": ["files"],
            "parameters": [_path_param("transfer_id"), _GENERATION],
            "requestBody": _json_body(complete_schema),
            "responses": _responses(200, specs.COMPLETE_RESPONSE, (400, 401, 403, 404, 409, 422)),
        }
    }
    paths["/admin/files/{file_id}"] = {
        "get": {
            "operationId": "download_file",
            "summary": "Stream a file's bytes (uploader, or attached to a scope the agent belongs to).",
            "tags": ["files"],
            "parameters": [_path_param("file_id"), _agent_query(), _GENERATION],
            "responses": _responses(200, None, (400, 401, 403, 404, 409), binary=True),
        }
    }
    paths["/admin/worker/agents"] = {
        "get": {
            "operationId": "worker_agents",
            "summary": "The agents bound to the worker whose token is presented (its fleet).",
            "tags": ["worker"],
            "responses": _responses(200, specs.WORKER_AGENTS, (401,)),
        }
    }
    paths["/admin/worker/agents/{agent_id}/generation"] = {
        "post": {
            "operationId": "reserve_generation",
            "summary": "Reserve the agent's next host generation: above every one the center has "
            "seen (and at least at_least), recorded before the reply.",
            "tags": ["worker"],
            "parameters": [_path_param("agent_id")],
            "requestBody": _json_body(specs.RESERVE_BODY),
            "responses": _responses(200, specs.RESERVED, (400, 401, 403, 404, 409)),
        }
    }
    paths["/healthz"] = {
        "get": {
            "operationId": "healthz",
            "summary": "Liveness; no authentication.",
            "security": [],
            "responses": {
                "200": {
                    "description": "alive",
                    "content": {"application/json": {"schema": specs.OK}},
                }
            },
        }
    }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "mcphost devcenter admin API",
            "version": __version__,
            "description": "The reference center's admin surface. Every agent-tool route is POST JSON and "
            "requires a worker bearer token (acat_...); agent_id must name an agent bound to that worker.",
        },
        "servers": [{"url": "/"}],
        "security": [{"workerToken": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {
                "workerToken": {"type": "http", "scheme": "bearer", "bearerFormat": "acat_<token>"}
            },
            "schemas": {"Error": specs.ERROR},
        },
    }
