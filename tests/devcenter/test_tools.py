"""Black-box tests of the admin agent-tool routes, over the real Unix socket."""

from __future__ import annotations

from typing import Any

import pytest

from mcphost.testing import DevCenter


def create(center: DevCenter, title: str, **extra: Any) -> str:
    reply = center.call("create_task", {"project_id": "p-1", "title": title, **extra})
    assert reply.status == 200, reply.body
    return str(reply.json()["task_id"])


# -- authentication and the agent gate -----------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({}, "auth_missing"),
        ({"Authorization": "Basic abc"}, "auth_missing"),
        ({"Authorization": "Bearer nope_123"}, "auth_invalid_format"),
        ({"Authorization": "Bearer acat_unknown"}, "auth_unknown"),
    ],
)
def test_auth_codes(devcenter_session: DevCenter, headers: dict[str, str], code: str) -> None:
    reply = devcenter_session.request(
        "POST", "/admin/agent-tools/get_my_work", {"agent_id": "agent-1"}, headers
    )
    assert reply.status == 401
    assert reply.error == code
    assert reply.json()["message"]


def test_auth_comes_before_route_lookup(devcenter_session: DevCenter) -> None:
    assert (
        devcenter_session.request("POST", "/admin/agent-tools/no_such_tool", {}).error
        == "auth_missing"
    )
    reply = devcenter_session.call("no_such_tool")
    assert (reply.status, reply.error) == (404, "unknown_tool")


def test_wrong_method_and_unknown_path_are_json(devcenter_session: DevCenter) -> None:
    reply = devcenter_session.request("GET", "/admin/agent-tools/get_my_work")
    assert (reply.status, reply.error) == (405, "method_not_allowed")
    reply = devcenter_session.request("GET", "/nowhere")
    assert (reply.status, reply.error) == (404, "not_found")


def test_agent_gate(devcenter_session: DevCenter) -> None:
    c = devcenter_session
    assert c.call("get_my_work", {"agent_id": ""}).error == "missing_agent_id"
    reply = c.call("get_my_work", agent_id="agent-nobody")
    assert (reply.status, reply.error) == (404, "not_found")
    reply = c.call("get_my_work", agent_id="agent-x")
    assert (reply.status, reply.error) == (403, "agent_not_bound_to_worker")
    # agent-x's own worker token works for agent-x, and not for agent-1
    assert c.call("get_my_work", agent_id="agent-x", token=c.worker_token("w-2")).status == 200
    assert c.call("get_my_work", token=c.worker_token("w-2")).error == "agent_not_bound_to_worker"


def test_body_validation(devcenter_session: DevCenter) -> None:
    c = devcenter_session
    auth = {"Authorization": f"Bearer {c.token}"}
    reply = c.request("POST", "/admin/agent-tools/get_my_work", b"{not json", auth)
    assert (reply.status, reply.error) == (400, "invalid_json")
    reply = c.request("POST", "/admin/agent-tools/get_my_work", b"[1]", auth)
    assert (reply.status, reply.error) == (400, "invalid_json")
    # an empty body is {} -> agent_id missing
    assert (
        c.request("POST", "/admin/agent-tools/get_my_work", b"", auth).error == "missing_agent_id"
    )
    reply = c.call("get_my_work", {"smuggled": 1, "other": 2})
    assert (reply.status, reply.error) == (400, "invalid_input")
    assert "other" in reply.json()["message"] and "smuggled" in reply.json()["message"]
    reply = c.request("POST", "/admin/agent-tools/get_my_work", b'{"agent_id": "\\ud800"}', auth)
    assert (reply.status, reply.error) == (400, "invalid_json")
    reply = c.call("upload_file", {"filename": "f", "content_type": "t", "size": 1 << 70})
    assert (reply.status, reply.error) == (400, "invalid_input")
    reply = c.call("create_task", {"project_id": "p-1", "title": 5})
    assert (reply.status, reply.error) == (400, "invalid_input")
    assert "title" in reply.json()["message"]


# -- generation fencing --------------------------------------------------------------------


def test_generation_fencing(devcenter: DevCenter) -> None:
    c = devcenter
    assert c.call("get_my_work").status == 200  # missing header = generation 0
    assert c.call("get_my_work", generation=3).status == 200
    assert c.call("get_my_work", generation=3).status == 200  # equal is fine
    reply = c.call("get_my_work", generation=2)
    assert (reply.status, reply.error) == (409, "stale_generation")
    assert "newer host generation" in reply.json()["message"]
    assert c.call("get_my_work").error == "stale_generation"
    assert c.call("get_my_work", generation=4).status == 200
    # fences are per agent
    assert c.call("get_my_work", agent_id="agent-2", generation=1).status == 200
    reply = c.request(
        "POST",
        "/admin/agent-tools/get_my_work",
        {"agent_id": "agent-1"},
        {"Authorization": f"Bearer {c.token}", "X-AC-MCP-Generation": "two"},
    )
    assert (reply.status, reply.error) == (400, "invalid_generation")
    for bad in (-1, 1 << 64):
        assert c.call("get_my_work", generation=bad).error == "invalid_generation"
    # fences survive a restart
    c.restart()
    assert c.call("get_my_work", generation=3).error == "stale_generation"


# -- task lifecycle ------------------------------------------------------------------------


def test_task_lifecycle(devcenter_session: DevCenter, unique: str) -> None:
    c = devcenter_session
    task = create(c, f"lifecycle {unique}", assignee="agent-1", description="d")
    work = c.call("get_my_work").json()["tasks"]
    mine = [t for t in work if t["task_id"] == task]
    assert mine == [
        {
            "task_id": task,
            "title": f"lifecycle {unique}",
            "status": "open",
            "project_id": "p-1",
            "lease_expires_at": None,
        }
    ]
    beat = c.call("heartbeat", {"task_id": task}).json()
    assert beat["status"] == "running" and beat["lease_expires_at"].endswith("Z")
    assert (
        c.call("post_task_message", {"task_id": task, "content": "hello"})
        .json()["message_id"]
        .startswith("m-")
    )
    assert c.call("post_task_message", {"task_id": task}).error == "missing_content"
    assert c.call("verify_task", {"task_id": task}).error == "illegal_transition"
    assert c.call("complete_task", {"task_id": task, "summary": "done it"}).json() == {
        "ok": True,
        "status": "completed",
    }
    assert task not in [t["task_id"] for t in c.call("get_my_work").json()["tasks"]]
    reply = c.call("heartbeat", {"task_id": task})
    assert (reply.status, reply.error) == (409, "illegal_transition")
    assert c.call("verify_task", {"task_id": task}).json() == {"ok": True, "status": "verified"}
    got = c.call("get_task", {"task_id": task}).json()
    assert got["status"] == "verified"
    assert [m["content"] for m in got["messages"]] == ["hello", "done it"]
    assert got["messages"][0]["author"] == "agent:agent-1"


def test_fail_retry_discard(devcenter_session: DevCenter, unique: str) -> None:
    c = devcenter_session
    task = create(c, f"fail {unique}", assignee="agent-1")
    assert c.call("fail_task", {"task_id": task}).error == "missing_reason"
    assert c.call("fail_task", {"task_id": task, "reason": "broken"}).json()["status"] == "failed"
    assert c.call("fail_task", {"task_id": task, "reason": "again"}).error == "illegal_transition"
    assert c.call("retry_failed_task", {"task_id": task}).json() == {"ok": True, "status": "open"}
    assert c.call("retry_failed_task", {"task_id": task}).error == "illegal_transition"
    assert (
        c.call("discard_task", {"task_id": task, "reason": "no longer needed"}).json()["status"]
        == "discarded"
    )
    assert c.call("discard_task", {"task_id": task, "reason": "x"}).error == "illegal_transition"
    assert (
        c.call("assign_task", {"task_id": task, "assignee": "agent-2"}).error
        == "illegal_transition"
    )


def test_assignee_only_tools(devcenter_session: DevCenter, unique: str) -> None:
    c = devcenter_session
    task = create(c, f"theirs {unique}", assignee="agent-2")
    for tool, extra in (("heartbeat", {}), ("complete_task", {}), ("fail_task", {"reason": "r"})):
        reply = c.call(tool, {"task_id": task, **extra})
        assert (reply.status, reply.error) == (403, "not_agents_task"), tool
    assert c.call("heartbeat", {"task_id": task}, agent_id="agent-2").status == 200
    assert c.call("heartbeat", {"task_id": "t-missing"}).error == "not_found"


def test_assign_and_subscribe(devcenter_session: DevCenter, unique: str) -> None:
    c = devcenter_session
    task = create(c, f"assign {unique}")
    assert c.call("assign_task", {"task_id": task, "assignee": "agent-2"}).json() == {
        "ok": True,
        "task_id": task,
        "assignee": "agent-2",
    }
    assert (
        c.call("reassign_task", {"task_id": task, "assignee": "agent:agent-1"}).json()["assignee"]
        == "agent-1"
    )
    reply = c.call("assign_task", {"task_id": task, "assignee": "agent-nobody"})
    assert (reply.status, reply.error) == (400, "invalid_assignee")
    assert c.call("assign_task", {"task_id": task}).error == "missing_assignee"
    for _ in range(2):  # idempotent
        assert c.call("subscribe", {"task_id": task}).json() == {"ok": True}
    assert c.call("subscribe", {"task_id": task, "identity": "user:u-9"}).json() == {"ok": True}
    assert c.call("get_task", {"task_id": task}).json()["subscribers"] == [
        "agent:agent-1",
        "user:u-9",
    ]
    assert c.call("unsubscribe", {"task_id": task}).json() == {"ok": True}
    assert c.call("unsubscribe", {"task_id": task}).json() == {"ok": True}
    assert c.call("get_task", {"task_id": task}).json()["subscribers"] == ["user:u-9"]


def test_create_task_checks(devcenter_session: DevCenter, unique: str) -> None:
    c = devcenter_session
    assert c.call("create_task", {"title": "x"}).error == "missing_project_id"
    assert c.call("create_task", {"project_id": "p-1"}).error == "missing_title"
    assert c.call("create_task", {"project_id": "p-1", "title": ""}).error == "missing_title"
    reply = c.call("create_task", {"project_id": "p-9", "title": "x"})
    assert (reply.status, reply.error) == (404, "project_not_found")
    reply = c.call("create_task", {"project_id": "p-2", "title": "x"})
    assert (reply.status, reply.error) == (403, "not_a_project_member")
    reply = c.call("create_task", {"project_id": "p-1", "title": "x", "derived_from_issue": "i-2"})
    assert (reply.status, reply.error) == (409, "derived_issue_project_mismatch")
    reply = c.call("create_task", {"project_id": "p-1", "title": "x", "derived_from_issue": "i-9"})
    assert (reply.status, reply.error) == (404, "issue_not_found")
    reply = c.call("create_task", {"project_id": "p-1", "title": "x", "dispatch_mode": "yolo"})
    assert (reply.status, reply.error) == (400, "invalid_input")
    task = create(
        c,
        f"full {unique}",
        description="desc",
        derived_from_issue="i-1",
        dispatch=True,
        dispatch_mode="supervisor_inline",
    )
    assert task.startswith("t-") and len(task) == 28
    got = c.call("get_task", {"task_id": task}).json()
    assert {
        k: got[k]
        for k in ("project_id", "description", "creator", "assignee", "dispatch", "dispatch_mode")
    } == {
        "project_id": "p-1",
        "description": "desc",
        "creator": "agent-1",
        "assignee": None,
        "dispatch": True,
        "dispatch_mode": "supervisor_inline",
    }
    assert task in c.call("get_issue", {"issue_id": "i-1"}).json()["tasks"]


def test_update_task(devcenter_session: DevCenter, unique: str) -> None:
    c = devcenter_session
    task = create(c, f"update {unique}", description="old")
    reply = c.call(
        "update_task", {"task_id": task, "description": "new", "clear_description": True}
    )
    assert (reply.status, reply.error) == (400, "invalid_input")
    updated = c.call("update_task", {"task_id": task, "title": f"renamed {unique}"}).json()
    assert (updated["title"], updated["description"]) == (f"renamed {unique}", "old")
    assert (
        c.call("update_task", {"task_id": task, "clear_description": True}).json()["description"]
        is None
    )
    assert (
        c.call("update_task", {"task_id": task, "description": "again"}).json()["description"]
        == "again"
    )
    c.call("discard_task", {"task_id": task, "reason": "done"})
    assert c.call("update_task", {"task_id": task, "title": "late"}).error == "illegal_transition"


def test_read_gates(devcenter_session: DevCenter, unique: str) -> None:
    c = devcenter_session
    issue = c.call("get_issue", {"issue_id": "i-1"}).json()
    assert {k: issue[k] for k in ("issue_id", "project_id", "status")} == {
        "issue_id": "i-1",
        "project_id": "p-1",
        "status": "open",
    }
    reply = c.call("get_issue", {"issue_id": "i-2"})
    assert (reply.status, reply.error) == (403, "not_a_project_member")
    assert c.call("get_issue", {"issue_id": "i-404"}).error == "not_found"
    # a task in p-2 (created by agent-x via its own worker) is invisible to agent-1
    x_token = c.worker_token("w-2")
    reply = c.call(
        "create_task",
        {"project_id": "p-2", "title": f"private {unique}"},
        agent_id="agent-x",
        token=x_token,
    )
    private = reply.json()["task_id"]
    reply = c.call("get_task", {"task_id": private})
    assert (reply.status, reply.error) == (403, "not_a_project_member")
    assert (
        c.call("post_task_message", {"task_id": private, "content": "hi"}).error
        == "not_a_project_member"
    )
    assert c.call("get_task", {"task_id": "t-nothing"}).error == "not_found"
