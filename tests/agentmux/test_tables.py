"""agentmux's tables (mcphost/agentmux/tables.py): strict refuses every flaw naming file and key;
lenient forgives it, the key read as absent. The strict messages are pinned where each file is
read (tests/agentmux/test_bundlefile.py, tests/relay/test_config.py, tests/relay/test_policy.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mcphost.agentmux.tables import LENIENT, STRICT, Source, Table
from mcphost.agentmux.wire import RelayError

SOURCE = Source(Path("/cfg/x.toml"), "test configuration")

# (the document, how it is read, what the lenient reading gives, the strict refusal's key)
FLAWS: list[tuple[dict[str, Any], str, Any, str]] = [
    ({"k": 1}, "string", None, "k: expected a string, got a number"),
    ({}, "required", None, "k: missing required field"),
    ({"k": " "}, "string", None, "k: must be non-empty"),
    ({"k": "a\x00b"}, "string", None, "k: must not contain NUL"),
    ({"k": "yes"}, "boolean", True, "k: expected a boolean, got a string"),
    ({"k": "5"}, "integer", None, "k: expected an integer, got a string"),
    ({"k": True}, "integer", None, "k: expected an integer, got a boolean"),
    ({"k": 0}, "integer", None, "k: must be between 1 and 9, got 0"),
    ({"k": ["a", 1, "b"]}, "strings", ("a", "b"), "k: expected an array of strings"),
    ({"k": "a"}, "strings", (), "k: expected an array of strings"),
    ({"k": []}, "table", None, "k: expected a table, got an array"),
    ({"k": [{"a": 1}, 2, {"a": 3}]}, "tables", ["k[0]", "k[2]"], "k: expected an array of tables"),
    ({"k": {"a": 1}}, "tables", [], "k: expected an array of tables"),
    (
        {"k": [{"name": "1X", "value": "v"}, {"name": "A", "value": "v"}, {"name": "A"}]},
        "environment",
        (("A", "v"),),
        "k[0].name: '1X' is not an environment variable name",
    ),
    (
        {"k": [{"name": "A", "value": "v"}, {"name": "A", "value": "w"}]},
        "environment",
        (("A", "v"),),
        "k[1].name: 'A' is set twice",
    ),
    ({"format-version": 2}, "format_version", None, "format-version: unsupported format version"),
    ({"k_y": 1, "k-y": 2}, "done", None, "k_y: unknown field (keys are kebab-case: 'k-y')"),
]


def read(table: Table, how: str) -> Any:
    if how == "required":
        return table.string("k", required=True)
    if how == "boolean":
        return table.boolean("k", True)
    if how == "integer":
        return table.integer("k", low=1, high=9)
    if how == "tables":
        return [t.where for t in table.tables("k")]
    if how == "environment":
        return table.environment("k")
    if how == "format_version":
        return table.format_version()
    if how == "done":
        table.raw("k-y")
        return table.done()
    return getattr(table, how)("k")


@pytest.mark.parametrize(("doc", "how", "forgiven", "refusal"), FLAWS)
def test_strict_refuses_and_lenient_reads_as_absent(
    doc: dict[str, Any], how: str, forgiven: Any, refusal: str
) -> None:
    with pytest.raises(RelayError) as caught:
        read(Table(SOURCE, doc), how)
    assert caught.value.code == "validation_invalid_arguments"
    assert refusal in caught.value.message
    assert caught.value.message.startswith("test configuration is invalid: /cfg/x.toml: ")
    assert read(Table(SOURCE, doc, reading=LENIENT), how) == forgiven


def test_a_lenient_table_reads_its_subtables_leniently_and_well_formed_keys_alike() -> None:
    doc = {"sub": {"n": 3, "x": 1}, "s": "v"}
    for reading in (STRICT, LENIENT):
        top = Table(SOURCE, doc, reading=reading)
        sub = top.table("sub")
        assert sub is not None and sub.where == "sub" and sub.reading is reading
        assert sub.integer("n", low=1) == 3 and top.string("s") == "v"
    lenient = Table(SOURCE, doc, reading=LENIENT).table("sub")
    assert lenient is not None
    lenient.done()  # `x` unknown: forgiven
    strict = Table(SOURCE, doc).table("sub")
    assert strict is not None and strict.integer("n", low=1) == 3
    with pytest.raises(RelayError, match=r"sub\.x: unknown field"):
        strict.done()


def test_what_a_caller_refuses_itself_fails_whatever_the_reading() -> None:
    table = Table(SOURCE, {"id": "../x"}, "sessions[0]", LENIENT)
    err = table.error("id", "not a session id")
    assert err.details == {"path": "/cfg/x.toml", "cause": "sessions[0].id: not a session id"}
    table.flaw("id", "forgiven")  # lenient: no refusal
    with pytest.raises(RelayError):
        Table(SOURCE, {}, "sessions[0]").flaw("id", "refused")
