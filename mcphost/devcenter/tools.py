"""Tool logic behind `/admin/agent-tools/<tool>`: lifecycle rules and access gates.

Owns: what each tool does once the app has authenticated the worker, checked that the agent
is bound to it, fenced the generation and validated the fields (see `specs`). Every handler
is `(center, agent_id, args) -> dict` and raises `ApiError` to refuse.
Must never: read the request or headers (identity arrives as `agent_id` only), or take an
agent id from anywhere but that argument.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

from mcphost.devcenter import ids
from mcphost.devcenter.errors import ApiError
from mcphost.devcenter.store import Store

LEASE = timedelta(minutes=10)
ACTIVE = ("open", "running")
FILE_URI_PREFIX = "ac://files/"


class Center(Protocol):
    store: Store


Handler = Callable[[Center, str, dict[str, Any]], dict[str, Any]]
HANDLERS: dict[str, Handler] = {}


def tool(name: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        HANDLERS[name] = fn
        return fn

    return register


# -- gates -------------------------------------------------------------------------------


def actor(agent_id: str) -> str:
    return f"agent:{agent_id}"


def load_task(store: Store, task_id: str) -> dict[str, Any]:
    task = store.task(task_id)
    if task is None:
        raise ApiError(
            404, "not_found", f"task {task_id!r} does not exist; check the id with get_my_work"
        )
    return task


def can_access_task(store: Store, agent_id: str, task: dict[str, Any]) -> bool:
    return agent_id in (task["assignee"], task["creator"]) or store.is_member(
        task["project_id"], agent_id
    )


def require_task_access(store: Store, agent_id: str, task: dict[str, Any]) -> None:
    if not can_access_task(store, agent_id, task):
        raise ApiError(
            403,
            "not_a_project_member",
            f"you are not the assignee, creator or a member of project {task['project_id']!r}",
        )


def require_own_task(agent_id: str, task: dict[str, Any]) -> None:
    if task["assignee"] != agent_id:
        raise ApiError(403, "not_agents_task", f"task {task['task_id']!r} is not assigned to you")


def require_status(task: dict[str, Any], allowed: tuple[str, ...], action: str) -> None:
    if task["status"] not in allowed:
        raise ApiError(
            409,
            "illegal_transition",
            f"cannot {action} task {task['task_id']!r} in status {task['status']!r} "
            f"(allowed from: {', '.join(allowed)}); read it with get_task",
        )


def require_project_member(store: Store, agent_id: str, project_id: str) -> None:
    if not store.is_member(project_id, agent_id):
        raise ApiError(
            403, "not_a_project_member", f"you are not a member of project {project_id!r}"
        )


def normalise_assignee(store: Store, project_id: str, raw: str) -> str:
    agent = raw.removeprefix("agent:")
    if store.agent(agent) is None or not store.is_member(project_id, agent):
        raise ApiError(
            400,
            "invalid_assignee",
            f"assignee {raw!r} is not an agent in project {project_id!r}; use an agent id of a project member",
        )
    return agent


def set_status(store: Store, task_id: str, status: str, lease: str | None = None) -> None:
    store.run(
        "UPDATE tasks SET status = ?, lease_expires_at = ?, updated_at = ? WHERE task_id = ?",
        status,
        lease,
        ids.stamp(),
        task_id,
    )


def add_message(store: Store, task_id: str, author: str, content: str) -> str:
    message_id = "m-" + ids.ulid()
    store.run(
        "INSERT INTO task_messages VALUES (?, ?, ?, ?, ?)",
        message_id,
        task_id,
        author,
        content,
        ids.stamp(),
    )
    return message_id


def task_view(store: Store, task: dict[str, Any]) -> dict[str, Any]:
    subs = store.all(
        "SELECT identity FROM subscriptions WHERE task_id = ? ORDER BY identity", task["task_id"]
    )
    messages = store.all(
        "SELECT message_id, author, content, posted_at FROM task_messages WHERE task_id = ? ORDER BY rowid",
        task["task_id"],
    )
    return {
        **task,
        "dispatch": bool(task["dispatch"]),
        "subscribers": [s["identity"] for s in subs],
        "messages": messages,
    }


# -- scopes (shared with files) ------------------------------------------------------------


def scope_allowed(store: Store, agent_id: str, scope: str, scope_id: str) -> bool:
    """May this agent place or read files on (scope, scope_id)?"""
    if scope == "task":
        task = store.task(scope_id)
        return task is not None and can_access_task(store, agent_id, task)
    if scope == "issue":
        issue = store.issue(scope_id)
        return issue is not None and store.is_member(issue["project_id"], agent_id)
    if scope == "project":
        return store.is_member(scope_id, agent_id)
    if scope == "agent":
        return scope_id == agent_id
    if scope == "tmp":
        return scope_id == agent_id
    # conversations are not modelled here; any conversation id is accepted.
    return scope == "conversation"


def require_scope(store: Store, agent_id: str, scope: str | None, scope_id: str | None) -> None:
    if scope is None and scope_id is None:
        return
    if scope is None:
        raise ApiError(400, "missing_scope", "scope_id was given without scope")
    if scope == "uploader":
        raise ApiError(400, "invalid_scope", "the uploader scope is internal to the center")
    if scope_id is None:
        raise ApiError(400, "missing_scope_id", f"scope {scope!r} needs a scope_id")
    if not scope_allowed(store, agent_id, scope, scope_id):
        raise ApiError(
            403,
            "scope_not_in_agent_domain",
            f"you may not use {scope}:{scope_id}; pick a task, issue or project you belong to, "
            "or agent/tmp with your own agent id",
        )


def file_reachable(store: Store, agent_id: str, file: dict[str, Any]) -> bool:
    if file["uploader"] == agent_id:
        return True
    refs = store.all("SELECT scope, scope_id FROM file_refs WHERE file_id = ?", file["file_id"])
    return any(scope_allowed(store, agent_id, r["scope"], r["scope_id"]) for r in refs)


def add_reference(store: Store, file_id: str, scope: str, scope_id: str, agent_id: str) -> str:
    reference_id = "r-" + ids.ulid()
    store.run(
        "INSERT INTO file_refs VALUES (?, ?, ?, ?, ?, ?)",
        reference_id,
        file_id,
        scope,
        scope_id,
        actor(agent_id),
        ids.stamp(),
    )
    return reference_id


# -- tools --------------------------------------------------------------------------------


@tool("get_my_work")
def get_my_work(c: Center, me: str, a: dict[str, Any]) -> dict[str, Any]:
    rows = c.store.all(
        "SELECT task_id, title, status, project_id, lease_expires_at FROM tasks "
        "WHERE assignee = ? AND status IN ('open', 'running') ORDER BY rowid",
        me,
    )
    return {"tasks": rows}


@tool("post_task_message")
def post_task_message(c: Center, me: str, a: dict[str, Any]) -> dict[str, Any]:
    task = load_task(c.store, a["task_id"])
    require_task_access(c.store, me, task)
    return {"message_id": add_message(c.store, task["task_id"], actor(me), a["content"])}


def _assign(c: Center, me: str, a: dict[str, Any]) -> dict[str, Any]:
    task = load_task(c.store, a["task_id"])
    require_task_access(c.store, me, task)
    require_status(task, ("open", "running", "failed"), "assign")
    assignee = normalise_assignee(c.store, task["project_id"], a["assignee"])
    c.store.run(
        "UPDATE tasks SET assignee = ?, updated_at = ? WHERE task_id = ?",
        assignee,
        ids.stamp(),
        task["task_id"],
    )
    return {"ok": True, "task_id": task["task_id"], "assignee": assignee}


tool("assign_task")(_assign)
tool("reassign_task")(_assign)


def _subscription(subscribe: bool) -> Handler:
    def handler(c: Center, me: str, a: dict[str, Any]) -> dict[str, Any]:
        task = load_task(c.store, a["task_id"])
        require_task_access(c.store, me, task)
        identity = a["identity"] or actor(me)
        if subscribe:
            c.store.run(
                "INSERT OR IGNORE INTO subscriptions VALUES (?, ?)", task["task_id"], identity
            )
        else:
            c.store.run(
                "DELETE FROM subscriptions WHERE task_id = ? AND identity = ?",
                task["task_id"],
                identity,
            )
        return {"ok": True}

    return handler


tool("subscribe")(_subscription(True))
tool("unsubscribe")(_subscription(False))


@tool("fail_task")
def fail_task(c: Center, me: str, a: dict[str, Any]) -> dict[str, Any]:
    task = load_task(c.store, a["task_id"])
    require_own_task(me, task)
    require_status(task, ACTIVE, "fail")
    set_status(c.store, task["task_id"], "failed")
    add_message(c.store, task["task_id"], actor(me), f"failed: {a['reason']}")
    return {"ok": True, "status": "failed"}


@tool("retry_failed_task")
def retry_failed_task(c: Center, me: str, a: dict[str, Any]) -> dict[str, Any]:
    task = load_task(c.store, a["task_id"])
    require_task_access(c.store, me, task)
    require_status(task, ("failed",), "retry")
    set_status(c.store, task["task_id"], "open")
    return {"ok": True, "status": "open"}


@tool("heartbeat")
def heartbeat(c: Center, me: str, a: dict[str, Any]) -> dict[str, Any]:
    task = load_task(c.store, a["task_id"])
    require_own_task(me, task)
    require_status(task, ACTIVE, "heartbeat")
    lease = ids.rfc3339(ids.now() + LEASE)
    set_status(c.store, task["task_id"], "running", lease)
    return {"ok": True, "task_id": task["task_id"], "status": "running", "lease_expires_at": lease}


@tool("complete_task")
def complete_task(c: Center, me: str, a: dict[str, Any]) -> dict[str, Any]:
    task = load_task(c.store, a["task_id"])
    require_own_task(me, task)
    require_status(task, ACTIVE, "complete")
    if a["summary"]:
        add_message(c.store, task["task_id"], actor(me), a["summary"])
    set_status(c.store, task["task_id"], "completed")
    return {"ok": True, "status": "completed"}


@tool("discard_task")
def discard_task(c: Center, me: str, a: dict[str, Any]) -> dict[str, Any]:
    task = load_task(c.store, a["task_id"])
    require_task_access(c.store, me, task)
    require_status(task, ("open", "running", "failed"), "discard")
    add_message(c.store, task["task_id"], actor(me), f"discarded: {a['reason']}")
    set_status(c.store, task["task_id"], "discarded")
    return {"ok": True, "status": "discarded"}


@tool("verify_task")
def verify_task(c: Center, me: str, a: dict[str, Any]) -> dict[str, Any]:
    task = load_task(c.store, a["task_id"])
    if task["creator"] != me and not c.store.is_member(task["project_id"], me):
        raise ApiError(
            403, "not_a_project_member", "only the creator or a project member may verify"
        )
    require_status(task, ("completed",), "verify")
    set_status(c.store, task["task_id"], "verified")
    return {"ok": True, "status": "verified"}


@tool("create_task")
def create_task(c: Center, me: str, a: dict[str, Any]) -> dict[str, Any]:
    project_id = a["project_id"]
    if c.store.project(project_id) is None:
        raise ApiError(404, "project_not_found", f"project {project_id!r} does not exist")
    require_project_member(c.store, me, project_id)
    issue_id = a["derived_from_issue"]
    if issue_id is not None:
        issue = c.store.issue(issue_id)
        if issue is None:
            raise ApiError(404, "issue_not_found", f"issue {issue_id!r} does not exist")
        if issue["project_id"] != project_id:
            raise ApiError(
                409,
                "derived_issue_project_mismatch",
                f"issue {issue_id!r} belongs to project {issue['project_id']!r}, not {project_id!r}",
            )
    assignee = (
        None if a["assignee"] is None else normalise_assignee(c.store, project_id, a["assignee"])
    )
    task_id = "t-" + ids.ulid()
    now = ids.stamp()
    c.store.run(
        "INSERT INTO tasks VALUES (?, ?, ?, ?, 'open', ?, ?, ?, ?, ?, NULL, ?, ?)",
        task_id,
        project_id,
        a["title"],
        a["description"],
        assignee,
        me,
        issue_id,
        int(bool(a["dispatch"])),
        a["dispatch_mode"] or "executor_fork",
        now,
        now,
    )
    return {"task_id": task_id}


@tool("update_task")
def update_task(c: Center, me: str, a: dict[str, Any]) -> dict[str, Any]:
    if a["description"] is not None and a["clear_description"]:
        raise ApiError(400, "invalid_input", "give description or clear_description, not both")
    task = load_task(c.store, a["task_id"])
    require_task_access(c.store, me, task)
    require_status(task, ("open", "running", "failed"), "update")
    title = a["title"] if a["title"] is not None else task["title"]
    description = task["description"]
    if a["clear_description"]:
        description = None
    elif a["description"] is not None:
        description = a["description"]
    c.store.run(
        "UPDATE tasks SET title = ?, description = ?, updated_at = ? WHERE task_id = ?",
        title,
        description,
        ids.stamp(),
        task["task_id"],
    )
    return task_view(c.store, load_task(c.store, task["task_id"]))


@tool("get_task")
def get_task(c: Center, me: str, a: dict[str, Any]) -> dict[str, Any]:
    task = load_task(c.store, a["task_id"])
    require_task_access(c.store, me, task)
    return task_view(c.store, task)


@tool("get_issue")
def get_issue(c: Center, me: str, a: dict[str, Any]) -> dict[str, Any]:
    issue = c.store.issue(a["issue_id"])
    if issue is None:
        raise ApiError(404, "not_found", f"issue {a['issue_id']!r} does not exist")
    require_project_member(c.store, me, issue["project_id"])
    tasks = c.store.all(
        "SELECT task_id FROM tasks WHERE derived_from_issue = ? ORDER BY rowid", issue["issue_id"]
    )
    return {**issue, "tasks": [t["task_id"] for t in tasks]}


def parse_file_uri(uri: str) -> str:
    file_id = uri.removeprefix(FILE_URI_PREFIX)
    if not uri.startswith(FILE_URI_PREFIX) or not ids.is_ulid(file_id):
        raise ApiError(
            400,
            "invalid_file_uri",
            f"{uri!r} is not ac://files/<ULID>; use the file_uri upload_file returned",
        )
    return file_id


@tool("attach_file")
def attach_file(c: Center, me: str, a: dict[str, Any]) -> dict[str, Any]:
    file_id = parse_file_uri(a["file_uri"])
    require_scope(c.store, me, a["scope"], a["scope_id"])
    file = c.store.file(file_id)
    if file is None:
        raise ApiError(
            404, "not_found", f"file {a['file_uri']!r} does not exist (was the upload completed?)"
        )
    if not file_reachable(c.store, me, file):
        raise ApiError(403, "not_reachable", f"file {a['file_uri']!r} is not reachable by you")
    return {"reference_id": add_reference(c.store, file_id, a["scope"], a["scope_id"], me)}


@tool("upload_file")
def upload_file(c: Center, me: str, a: dict[str, Any]) -> dict[str, Any]:
    require_scope(c.store, me, a["scope"], a["scope_id"])
    transfer_id = ids.ulid()
    file_id = ids.ulid()
    c.store.run(
        "INSERT INTO transfers (transfer_id, file_id, agent_id, filename, content_type, size, scope, scope_id,"
        " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        transfer_id,
        file_id,
        me,
        a["filename"],
        a["content_type"],
        a["size"],
        a["scope"],
        a["scope_id"],
        ids.stamp(),
    )
    return {
        "transfer_id": transfer_id,
        "transfer_uri": f"ac://transfers/{transfer_id}",
        "file_uri": FILE_URI_PREFIX + file_id,
        "scope": a["scope"],
        "scope_id": a["scope_id"],
    }
