"""Reply -> result mapping: passthrough, JSON-aware truncation, failures."""

import json

from hypothesis import given
from hypothesis import strategies as st

from mcphost.admin.client import http_failure
from mcphost.host.results import invalid_arguments, shrink, success_text
from tests.thorough import examples


def test_small_bodies_pass_through_verbatim() -> None:
    body = b'{"tasks": [], "note": "\xc3\xa9"}'
    assert success_text(body) == body.decode()


def test_big_list_is_cut_on_an_item_boundary_with_a_note() -> None:
    body = json.dumps({"tasks": [{"id": i, "title": "x" * 100} for i in range(5000)]}).encode()
    text = success_text(body, budget=8192)
    out = json.loads(text)
    assert out["truncated"] is True and out["total_bytes"] == len(body)
    assert out["omitted_bytes"] > 0
    items = out["partial"]["tasks"]
    assert isinstance(items[-1], str) and "more items omitted" in items[-1]
    assert all(isinstance(i, dict) and i["title"] == "x" * 100 for i in items[:-1])
    assert len(text.encode()) < 8192 + 400


def test_multibyte_strings_are_never_split() -> None:
    body = json.dumps({"description": "é€😀" * 50_000}, ensure_ascii=False).encode()
    out = json.loads(success_text(body, budget=4096))
    kept = out["partial"]["description"]
    kept.encode("utf-8")  # would raise on a lone surrogate
    assert "bytes omitted" in kept


def test_non_json_body_is_cut_on_a_character_boundary() -> None:
    text = success_text(("ü" * 100_000).encode(), budget=1000)
    assert text.startswith("ü") and "bytes omitted" in text


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=300),
    lambda children: (
        st.lists(children, max_size=30)
        | st.dictionaries(st.text(max_size=10), children, max_size=30)
    ),
    max_leaves=400,
)


@examples(full=150, quick=30)
@given(json_values, st.integers(min_value=600, max_value=5000))
def test_shrink_always_gives_valid_json_near_the_budget(value: object, budget: int) -> None:
    out = shrink(value, budget)
    encoded = json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode()
    json.loads(encoded)
    assert len(encoded) <= budget + 400


def test_the_omitted_keys_of_a_cut_object_stay_within_the_budget() -> None:
    wide = {f"k{i:03d}" + "x" * 300: i for i in range(100)}  # listing them all took 16 KB
    out = shrink(wide, 1000)
    encoded = json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode()
    assert len(encoded) <= 1000 + 400
    assert out["…omitted_keys"][-1].endswith("more keys]")


def test_center_envelope_is_kept_intact() -> None:
    failure = http_failure(
        409, b'{"error":"illegal_transition","message":"task is completed","extra":1}'
    )
    assert failure.payload() == {
        "error": "illegal_transition",
        "message": "task is completed",
        "status": 409,
        "details": {"extra": 1},
    }


def test_non_envelope_error_is_admin_http_error() -> None:
    failure = http_failure(404, b"404 page not found")
    assert failure.code == "admin_http_error" and failure.status == 404
    assert failure.details["body"] == "404 page not found"


def test_invalid_arguments_explains_identity() -> None:
    failure = invalid_arguments(
        "get_task",
        [{"type": "extra_forbidden", "loc": ("agent_id",), "msg": "Extra inputs"}],
        "agent-1",
    )
    assert failure.code == "invalid_arguments"
    assert "fixed by this host's binding (agent agent-1)" in failure.message
    assert failure.details["fields"][0]["field"] == "agent_id"
