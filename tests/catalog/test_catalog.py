"""The catalog as data: schemas, identity, tiers, and the exact fields of seed 003."""

from typing import Any

import pytest
from pydantic import ValidationError

from mcphost.catalog import BY_NAME, CATALOG

SEED_FIELDS = {
    "get_my_work": set(),
    "post_task_message": {"task_id", "content"},
    "assign_task": {"task_id", "assignee"},
    "reassign_task": {"task_id", "assignee"},
    "subscribe": {"task_id", "identity"},
    "unsubscribe": {"task_id", "identity"},
    "fail_task": {"task_id", "reason"},
    "retry_failed_task": {"task_id"},
    "heartbeat": {"task_id"},
    "complete_task": {"task_id", "summary"},
    "discard_task": {"task_id", "reason"},
    "create_task": {
        "project_id",
        "title",
        "description",
        "derived_from_issue",
        "assignee",
        "dispatch",
        "dispatch_mode",
    },
    "update_task": {"task_id", "title", "description", "clear_description"},
    "fork_executor": {"task_id", "model", "context"},
    "get_task": {"task_id"},
    "get_issue": {"issue_id"},
    "verify_task": {"task_id"},
    "attach_file": {"file_uri", "scope", "scope_id"},
}


def walk_objects(schema: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(schema, dict):
        if schema.get("type") == "object":
            found.append(schema)
        for value in schema.values():
            found += walk_objects(value)
    elif isinstance(schema, list):
        for value in schema:
            found += walk_objects(value)
    return found


def test_seed_tools_have_exactly_the_seed_fields() -> None:
    for name, fields in SEED_FIELDS.items():
        assert set(BY_NAME[name].input_schema["properties"]) == fields, name


@pytest.mark.parametrize("decl", CATALOG, ids=lambda d: d.name)
def test_every_object_schema_is_closed_and_has_no_agent_id(decl: Any) -> None:
    schema = decl.input_schema
    objects = walk_objects(schema)
    assert objects and all(o.get("additionalProperties") is False for o in objects)
    assert "agent_id" not in repr(schema)
    assert "null" not in repr(schema), "optional fields are just not required"
    assert decl.description and decl.summary


@pytest.mark.parametrize("decl", CATALOG, ids=lambda d: d.name)
def test_smuggled_identity_is_refused_by_every_model(decl: Any) -> None:
    for smuggled in ({"agent_id": "other"}, {"agentId": "other"}, {"AGENT_ID": "x"}):
        with pytest.raises(ValidationError):
            decl.input.model_validate(smuggled)


def test_property_named_title_survives_schema_compaction() -> None:
    assert "title" in BY_NAME["create_task"].input_schema["properties"]
    assert BY_NAME["create_task"].input_schema["required"] == ["project_id", "title"]


def test_annotations_are_true_where_set() -> None:
    assert BY_NAME["get_task"].annotations["readOnlyHint"] is True
    assert BY_NAME["complete_task"].annotations["destructiveHint"] is True
    assert BY_NAME["heartbeat"].annotations["idempotentHint"] is True
    assert "destructiveHint" not in BY_NAME["get_task"].annotations


def test_routes() -> None:
    assert BY_NAME["get_task"].route == "/admin/agent-tools/get_task"
    assert BY_NAME["fork_executor"].route == "/runtime/fork_executor"


def test_update_task_refuses_contradictory_description() -> None:
    with pytest.raises(ValidationError):
        BY_NAME["update_task"].input.model_validate(
            {"task_id": "t", "description": "x", "clear_description": True}
        )


def test_optional_fields_are_omitted_not_nulled() -> None:
    params = BY_NAME["complete_task"].input.model_validate({"task_id": " t-1 "})
    assert params.model_dump(mode="json", exclude_none=True) == {"task_id": "t-1"}
