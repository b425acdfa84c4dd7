"""The declarative tool table: every `/admin/agent-tools/<tool>` route as data.

Owns: each tool's request fields (type, required, enum, the code a missing value gets), its
success response schema, the statuses it may answer, and body validation against those
fields. `app` validates with it, `openapi` documents from it, so the two cannot drift.
Must never: do I/O or know about policy; the tool logic lives in `tools`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from mcphost.devcenter.errors import ApiError

FieldType = Literal["string", "integer", "boolean"]

SCOPES = ("task", "issue", "project", "conversation", "agent", "tmp")
DISPATCH_MODES = ("executor_fork", "supervisor_inline")
MAX_SIZE = 1 << 40  # 1 TiB: far above any real upload, well inside SQLite's 64-bit integers
MAX_GENERATION = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    type: FieldType = "string"
    required: bool = False
    description: str = ""
    enum: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    invalid_code: str = "invalid_input"

    @property
    def missing_code(self) -> str:
        return f"missing_{self.name}"

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.description:
            out["description"] = self.description
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        if self.enum:
            out["enum"] = [*self.enum, *([] if self.required else [None])]
        if self.type == "string" and self.required:
            out["minLength"] = 1
        if not self.required:
            out["nullable"] = True
        return out


AGENT_ID = Field(
    "agent_id", required=True, description="the operating agent (injected by the host)"
)


def _obj(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = list(required)
    return out


_S = {"type": "string"}
_NS = {"type": "string", "nullable": True}
_I = {"type": "integer"}
_B = {"type": "boolean"}
OK = _obj({"ok": {"type": "boolean", "enum": [True]}}, ("ok",))


def _ok_status(status: str) -> dict[str, Any]:
    return _obj(
        {"ok": {"type": "boolean", "enum": [True]}, "status": {"type": "string", "enum": [status]}},
        ("ok", "status"),
    )


TASK_SUMMARY = _obj(
    {"task_id": _S, "title": _S, "status": _S, "project_id": _S, "lease_expires_at": _NS},
    ("task_id", "title", "status", "project_id", "lease_expires_at"),
)
MESSAGE = _obj(
    {"message_id": _S, "author": _S, "content": _S, "posted_at": _S},
    ("message_id", "author", "content", "posted_at"),
)
TASK = _obj(
    {
        "task_id": _S,
        "project_id": _S,
        "title": _S,
        "description": _NS,
        "status": {
            "type": "string",
            "enum": ["open", "running", "completed", "failed", "discarded", "verified"],
        },
        "assignee": _NS,
        "creator": _S,
        "derived_from_issue": _NS,
        "dispatch": _B,
        "dispatch_mode": {"type": "string", "enum": list(DISPATCH_MODES)},
        "lease_expires_at": _NS,
        "created_at": _S,
        "updated_at": _S,
        "subscribers": {"type": "array", "items": _S},
        "messages": {"type": "array", "items": MESSAGE},
    },
    (
        "task_id",
        "project_id",
        "title",
        "description",
        "status",
        "assignee",
        "creator",
        "derived_from_issue",
        "dispatch",
        "dispatch_mode",
        "lease_expires_at",
        "created_at",
        "updated_at",
        "subscribers",
        "messages",
    ),
)
ISSUE = _obj(
    {
        "issue_id": _S,
        "project_id": _S,
        "title": _S,
        "description": _S,
        "status": _S,
        "tasks": {"type": "array", "items": _S},
    },
    ("issue_id", "project_id", "title", "description", "status", "tasks"),
)
ERROR = _obj({"error": _S, "message": _S}, ("error", "message"))


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    summary: str
    fields: tuple[Field, ...]
    response: dict[str, Any]
    errors: tuple[int, ...] = (400, 401, 403, 404, 409)
    status: int = 200
    allowed: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed", frozenset(["agent_id", *(f.name for f in self.fields)]))

    def request_schema(self) -> dict[str, Any]:
        props = {f.name: f.schema() for f in (AGENT_ID, *self.fields)}
        required = ["agent_id", *(f.name for f in self.fields if f.required)]
        return {
            "type": "object",
            "properties": props,
            "required": required,
            "additionalProperties": False,
        }


def check_shape(body: dict[str, Any], allowed: frozenset[str], fields: tuple[Field, ...]) -> None:
    """Unknown fields and wrong JSON types -> 400 invalid_input naming them."""
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ApiError(
            400,
            "invalid_input",
            f"unknown field(s) {', '.join(unknown)}; allowed fields are {', '.join(sorted(allowed))}",
        )
    wrong = []
    for f in (AGENT_ID, *fields):
        value = body.get(f.name)
        if value is None:
            continue
        ok = {
            "string": isinstance(value, str),
            "integer": isinstance(value, int) and not isinstance(value, bool),
            "boolean": isinstance(value, bool),
        }[f.type]
        if not ok:
            wrong.append(f"{f.name} must be a {f.type}")
    if wrong:
        raise ApiError(400, "invalid_input", "; ".join(wrong))


def check_values(body: dict[str, Any], fields: tuple[Field, ...]) -> dict[str, Any]:
    """Required fields present (else `missing_<name>`), enums and minimums; returns a clean copy
    where absent optional fields are None."""
    out: dict[str, Any] = {}
    for f in fields:
        value = body.get(f.name)
        if f.type == "string" and value == "" and not f.required:
            value = None
        if value is None or value == "":
            if f.required:
                raise ApiError(400, f.missing_code, f"{f.name} is required")
            out[f.name] = None
            continue
        if f.enum and value not in f.enum:
            raise ApiError(
                400, f.invalid_code, f"{f.name} must be one of {', '.join(f.enum)}; got {value!r}"
            )
        if f.minimum is not None and value < f.minimum:
            raise ApiError(400, "invalid_input", f"{f.name} must be >= {f.minimum}")
        if f.maximum is not None and value > f.maximum:
            raise ApiError(400, "invalid_input", f"{f.name} must be <= {f.maximum}")
        out[f.name] = value
    return out


TASK_ID = Field("task_id", required=True, description="the task")
_ASSIGN = (
    TASK_ID,
    Field("assignee", required=True, description="agent id (or agent:<id>) of a project member"),
)
_SUB = (TASK_ID, Field("identity", description="subscriber identity; defaults to agent:<agent_id>"))
_SCOPE = Field(
    "scope", enum=SCOPES, invalid_code="invalid_scope", description="where the file is placed"
)
_SCOPE_ID = Field("scope_id", description="the id within the scope")

TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool(
            "get_my_work",
            "Open or running tasks assigned to me, oldest first.",
            (),
            _obj({"tasks": {"type": "array", "items": TASK_SUMMARY}}, ("tasks",)),
        ),
        Tool(
            "post_task_message",
            "Post a message on a task (assignee, creator or project member).",
            (TASK_ID, Field("content", required=True, description="message text")),
            _obj({"message_id": _S}, ("message_id",)),
        ),
        Tool(
            "assign_task",
            "Assign a non-terminal task to a project member.",
            _ASSIGN,
            _obj({"ok": _B, "task_id": _S, "assignee": _S}, ("ok", "task_id", "assignee")),
        ),
        Tool(
            "reassign_task",
            "Reassign a non-terminal task to another project member.",
            _ASSIGN,
            _obj({"ok": _B, "task_id": _S, "assignee": _S}, ("ok", "task_id", "assignee")),
        ),
        Tool("subscribe", "Subscribe an identity to a task (idempotent).", _SUB, OK),
        Tool("unsubscribe", "Unsubscribe an identity from a task (idempotent).", _SUB, OK),
        Tool(
            "fail_task",
            "Fail my open or running task.",
            (TASK_ID, Field("reason", required=True, description="why it failed")),
            _ok_status("failed"),
        ),
        Tool("retry_failed_task", "Reopen a failed task.", (TASK_ID,), _ok_status("open")),
        Tool(
            "heartbeat",
            "Renew the 10-minute lease on my task (open -> running).",
            (TASK_ID,),
            _obj(
                {
                    "ok": _B,
                    "task_id": _S,
                    "status": {"type": "string", "enum": ["running"]},
                    "lease_expires_at": _S,
                },
                ("ok", "task_id", "status", "lease_expires_at"),
            ),
        ),
        Tool(
            "complete_task",
            "Complete my open or running task; the summary becomes a task message.",
            (TASK_ID, Field("summary", description="delivery summary")),
            _ok_status("completed"),
        ),
        Tool(
            "discard_task",
            "Discard an open, running or failed task.",
            (TASK_ID, Field("reason", required=True, description="why it is discarded")),
            _ok_status("discarded"),
        ),
        Tool(
            "create_task",
            "Create a task in a project I belong to.",
            (
                Field("project_id", required=True, description="the project"),
                Field("title", required=True, description="short title"),
                Field("description", description="longer description"),
                Field("derived_from_issue", description="an issue in the same project"),
                Field("assignee", description="agent id (or agent:<id>) of a project member"),
                Field("dispatch", "boolean", description="dispatch immediately"),
                Field("dispatch_mode", enum=DISPATCH_MODES, description="how it is dispatched"),
            ),
            _obj({"task_id": _S}, ("task_id",)),
        ),
        Tool(
            "update_task",
            "Update a non-terminal task's title or description.",
            (
                TASK_ID,
                Field("title", description="new title"),
                Field("description", description="new description"),
                Field("clear_description", "boolean", description="remove the description"),
            ),
            TASK,
        ),
        Tool("get_task", "Read a task with its subscribers and messages.", (TASK_ID,), TASK),
        Tool(
            "get_issue",
            "Read an issue (project members only).",
            (Field("issue_id", required=True, description="the issue"),),
            ISSUE,
        ),
        Tool("verify_task", "Verify a completed task.", (TASK_ID,), _ok_status("verified")),
        Tool(
            "attach_file",
            "Attach an uploaded file to a scope I may use.",
            (
                Field("file_uri", required=True, description="ac://files/<ULID>"),
                Field("scope", required=True, enum=SCOPES, invalid_code="invalid_scope"),
                Field("scope_id", required=True, description="the id within the scope"),
            ),
            _obj({"reference_id": _S}, ("reference_id",)),
        ),
        Tool(
            "upload_file",
            "Open an upload session; then PUT the bytes and POST complete.",
            (
                Field("filename", required=True, description="the file's base name"),
                Field("content_type", required=True, description="MIME type"),
                Field(
                    "size",
                    "integer",
                    required=True,
                    minimum=0,
                    maximum=MAX_SIZE,
                    description="bytes that will be PUT",
                ),
                _SCOPE,
                _SCOPE_ID,
            ),
            _obj(
                {
                    "transfer_id": _S,
                    "transfer_uri": _S,
                    "file_uri": _S,
                    "scope": _NS,
                    "scope_id": _NS,
                },
                ("transfer_id", "transfer_uri", "file_uri", "scope", "scope_id"),
            ),
        ),
    )
}

# The file routes outside /admin/agent-tools share the field machinery.
COMPLETE_FIELDS = (
    Field("sha256", required=True, description="hex SHA-256 of the bytes PUT"),
    Field("size", "integer", required=True, minimum=0, maximum=MAX_SIZE, description="bytes PUT"),
    _SCOPE,
    _SCOPE_ID,
)
COMPLETE_ALLOWED = frozenset(["agent_id", *(f.name for f in COMPLETE_FIELDS)])
COMPLETE_RESPONSE = _obj({"file_uri": _S, "reference_id": _NS}, ("file_uri", "reference_id"))
PUT_RESPONSE = _obj({"written": _B, "size": _I, "sha256": _S}, ("written", "size", "sha256"))

# GET /admin/worker/agents: the agents bound to the token's worker, by agent_id.
WORKER_AGENTS = _obj(
    {
        "worker_id": _S,
        "agents": {
            "type": "array",
            "items": _obj(
                {"agent_id": _S, "generation": {**_I, "minimum": 0}}, ("agent_id", "generation")
            ),
        },
    },
    ("worker_id", "agents"),
)
RESERVE_BODY = {
    **_obj({"at_least": {**_I, "minimum": 0, "maximum": MAX_GENERATION}}),
    "additionalProperties": False,
}
RESERVED = _obj({"agent_id": _S, "generation": {**_I, "minimum": 1}}, ("agent_id", "generation"))

FORK_FIELDS = (
    Field("task_id", required=True, description="the task the executor works on"),
    Field("model", description="model override"),
    Field("context", description="extra context for the executor"),
)
FORK_ALLOWED = frozenset(["agent_id", *(f.name for f in FORK_FIELDS)])
