"""The pure argument bounds (`mcphost.argbounds`) and the bounded refusals both surfaces build."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcphost.argbounds import (
    LIMITS,
    MAX_DEPTH,
    MAX_KEYS_PER_OBJECT,
    MAX_NAME_CHARS,
    MAX_REPORTED_FIELDS,
    MAX_VALUES,
    Oversize,
    oversize,
    report_names,
    short_name,
)
from mcphost.catalog import CATALOG
from mcphost.host.results import arguments_too_large, invalid_arguments
from mcphost.relaytools import validation as V
from mcphost.relaytools.errors import ToolFailure as RelayFailure
from tests.thorough import examples


def nested(depth: int, leaf: Any = 0) -> Any:
    """`depth` containers deep: nested(1) is {"x": 0}."""
    value = leaf
    for level in range(depth):
        value = {"x": value} if level % 2 == 0 else [value]
    return value


class Untouchable(dict[str, Any]):
    """A dict whose members must never be looked at."""

    def items(self) -> Any:
        raise AssertionError("the members of an oversized object were walked")

    def __iter__(self) -> Any:
        raise AssertionError("the members of an oversized object were walked")


class UntouchableList(list[Any]):
    def __iter__(self) -> Any:
        raise AssertionError("the items of an oversized list were walked")


# -- oversize --------------------------------------------------------------------------------


# Ordinary tool arguments are a few keys with small values; generating 20 keys of up to 60
# leaves each cost ~40 s of CPU per run and proved nothing more about "ordinary".
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@examples(full=200, quick=40)
@given(st.dictionaries(st.text(max_size=12), json_values, max_size=10))
def test_ordinary_arguments_pass(arguments: dict[str, Any]) -> None:
    assert oversize(arguments) is None


def test_every_catalog_schema_is_far_inside_the_limits() -> None:
    for decl in CATALOG:
        assert len(decl.input_schema["properties"]) * 8 < MAX_KEYS_PER_OBJECT, decl.name


def test_the_limits_themselves_are_accepted() -> None:
    assert oversize({f"k{i}": i for i in range(MAX_KEYS_PER_OBJECT)}) is None
    assert oversize({"list": [0] * (MAX_VALUES - 1)}) is None
    assert oversize(nested(MAX_DEPTH)) is None


def test_one_key_too_many_is_refused_from_the_length_alone() -> None:
    wide = Untouchable({f"k{i}": i for i in range(MAX_KEYS_PER_OBJECT + 1)})
    assert oversize(wide) == Oversize("keys", "(arguments)", MAX_KEYS_PER_OBJECT + 1)
    inner = {"args": {f"k{i}": i for i in range(MAX_KEYS_PER_OBJECT + 1)}}
    assert oversize(inner) == Oversize("keys", "args", MAX_KEYS_PER_OBJECT + 1)


def test_one_level_too_deep_is_refused() -> None:
    found = oversize(nested(MAX_DEPTH + 1))
    assert found is not None and found.limit == "depth" and found.found == MAX_DEPTH + 1
    assert found.at.startswith("x[0].x"), found
    assert oversize({"a": nested(MAX_DEPTH - 1, leaf=[])}) is not None  # empty ones count too


def test_one_value_too_many_is_refused_before_walking_it() -> None:
    found = oversize({"list": UntouchableList([0] * MAX_VALUES)})
    assert found == Oversize("values", "list", MAX_VALUES + 1)
    spread = {f"k{i}": [[0, 0]] * 100 for i in range(MAX_KEYS_PER_OBJECT)}
    found = oversize(spread)
    assert found is not None and found.limit == "values" and found.found > MAX_VALUES


def test_paths_name_list_items_and_cut_long_keys() -> None:
    long_key = "k" * 10_000
    found = oversize({long_key: [{"y": [0] * (MAX_VALUES + 1)}]})
    assert found is not None
    assert found.at == f"{short_name(long_key)}[0].y"
    assert len(found.at) < MAX_NAME_CHARS + 60


@pytest.mark.parametrize(
    "found",
    [
        Oversize("keys", "(arguments)", 10**6),
        Oversize("depth", "a", 33),
        Oversize("values", "b", 1),
    ],
)
def test_details_carry_the_reason_and_every_limit(found: Oversize) -> None:
    details = found.details()
    assert details["reason"] == "arguments_too_large"
    assert {k: details[k] for k in LIMITS} == LIMITS
    assert ("found" in details) == (found.limit == "keys")
    assert ("found_at_least" in details) == (found.limit != "keys")
    assert found.at in found.message


# -- names -----------------------------------------------------------------------------------


def test_short_name_keeps_short_names_and_says_what_it_cut() -> None:
    assert short_name("task_id") == "task_id"
    assert short_name("a" * MAX_NAME_CHARS) == "a" * MAX_NAME_CHARS
    cut = short_name("a" * (MAX_NAME_CHARS + 5))
    assert cut == "a" * MAX_NAME_CHARS + "…[5 more characters]"


def test_report_names_shows_a_few_and_counts_the_rest() -> None:
    names = (f"n{i}" for i in range(10**6))  # a generator: only what is shown is consumed
    shown, omitted = report_names(names, 10**6)
    assert shown == [f"n{i}" for i in range(MAX_REPORTED_FIELDS)]
    assert omitted == 10**6 - MAX_REPORTED_FIELDS
    assert report_names(["a", "b"], 2) == (["a", "b"], 0)


# -- the host's refusals ---------------------------------------------------------------------


def extra(key: str) -> dict[str, Any]:
    return {"type": "extra_forbidden", "loc": (key,), "msg": "Extra inputs are not permitted"}


def test_invalid_arguments_lists_a_few_fields_identity_first() -> None:
    errors = [extra(f"k{i}") for i in range(1000)] + [extra("agent-id")]
    failure = invalid_arguments("get_task", errors, "agent-1")
    fields = failure.details["fields"]
    assert len(fields) == MAX_REPORTED_FIELDS
    assert fields[0]["field"] == "agent-id" and "identity is fixed" in fields[0]["problem"]
    assert [f["field"] for f in fields[1:]] == [f"k{i}" for i in range(MAX_REPORTED_FIELDS - 1)]
    assert failure.details["omitted_fields"] == 1001 - MAX_REPORTED_FIELDS
    assert failure.message.endswith(f"and {1001 - MAX_REPORTED_FIELDS} more field(s) not listed")
    assert len(failure.text()) < 3000


def test_invalid_arguments_is_unchanged_for_a_few_fields() -> None:
    failure = invalid_arguments(
        "get_task",
        [extra("agent_id"), {"type": "missing", "loc": ("task_id",), "msg": "Field required"}],
        "agent-1",
    )
    assert "omitted_fields" not in failure.details
    assert [f["field"] for f in failure.details["fields"]] == ["agent_id", "task_id"]
    assert failure.message == (
        "get_task was not called: agent_id: identity is fixed by this host's binding (agent "
        "agent-1) and cannot be passed as an argument; remove it; task_id: Field required"
    )


def test_invalid_arguments_cuts_huge_field_names() -> None:
    failure = invalid_arguments("get_task", [extra("k" * 5_000_000)], "agent-1")
    assert len(failure.text()) < 1000


def test_arguments_too_large_names_identity_keys_without_scanning() -> None:
    wide = Untouchable({"agent_id": "agent-2", **{f"k{i}": i for i in range(10_000)}})
    found = oversize(wide)
    assert found is not None
    failure = arguments_too_large("get_task", found, wide, "agent-1")
    assert failure.code == "invalid_arguments"
    assert failure.details["reason"] == "arguments_too_large"
    assert failure.details["found"] == 10_001 and failure.details["tool"] == "get_task"
    assert "agent_id: identity is fixed by this host's binding (agent agent-1)" in failure.message
    json.loads(failure.text())


# -- the relay tools' refusals ---------------------------------------------------------------


def relay_refusal(validate: Any, arguments: dict[str, Any]) -> RelayFailure:
    with pytest.raises(RelayFailure) as info:
        validate(arguments)
    return info.value


@pytest.mark.parametrize(
    ("validate", "base"),
    [
        (V.validate_list, {"command": "principals"}),
        (V.validate_help, {}),
        (V.validate_send, {"message": "m", "broadcast": True}),
        (V.validate_look, {"target_session": "b"}),
        (V.validate_raww, {"target_session": "b", "text": "t"}),
        (V.validate_choose, {"choice_request_id": "c", "outcome": "cancelled"}),
        (V.validate_updown, {"command": "up"}),
        (V.validate_new, {"command": "peer", "args": {"principal_id": "p"}}),
        (V.validate_change, {"command": "psk", "args": {"principal_id": "p"}}),
    ],
)
def test_every_relay_validator_is_bounded(validate: Any, base: dict[str, Any]) -> None:
    validate(base)  # the base is valid
    wide = Untouchable({**base, **{f"k{i}": i for i in range(MAX_KEYS_PER_OBJECT + 1)}})
    failure = relay_refusal(validate, wide)
    assert (failure.code, failure.rpc_code) == ("validation_invalid_params", -32602)
    assert failure.details is not None and failure.details["reason"] == "arguments_too_large"
    assert failure.message.startswith("arguments too large for ")
    deep = {**base, "x": nested(MAX_DEPTH + 3)}
    assert relay_refusal(validate, deep).details["limit"] == "depth"  # type: ignore[index]


def test_relay_unknown_fields_stay_verbatim_up_to_the_report_limit() -> None:
    names = [f"f{i:02d}" for i in range(MAX_REPORTED_FIELDS)]
    failure = V.unknown("send request", list(reversed(names)))
    assert failure.message == f"unknown parameter(s) for send request: {', '.join(names)}"
    assert failure.details == {"fields": names}


def test_relay_unknown_fields_beyond_the_limit_are_counted() -> None:
    names = [f"args.f{i:03d}" for i in range(200)]
    failure = V.unknown("new peer command", names)
    shown = names[:MAX_REPORTED_FIELDS]
    assert failure.details == {"fields": shown, "omitted_fields": 200 - MAX_REPORTED_FIELDS}
    assert failure.message == (
        f"unknown parameter(s) for new peer command: {', '.join(shown)} "
        f"and {200 - MAX_REPORTED_FIELDS} more"
    )
    long = V.unknown("look request", ["x" * 1_000_000])
    assert long.details == {"fields": [short_name("x" * 1_000_000)]}
    assert len(long.message) < 200
