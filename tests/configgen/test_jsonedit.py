"""JSON merges edit text: every foreign byte survives, whatever the user's formatting."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from configgen import merge, render
from configgen.jsonedit import set_members
from tests.configgen.configgen_samples import sample_config
from tests.thorough import examples

OURS = {"command": "/bin/ours", "args": ["host"], "env": {"MCPHOST_CONFIGGEN": "1"}}


def common(a: str, b: str) -> int:
    """Length of the common prefix of two strings."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def spliced(original: str, edited: str) -> str:
    """What `edited` inserted into or swapped out of `original` (prefix and suffix kept)."""
    prefix = common(original, edited)
    suffix = common(original[prefix:][::-1], edited[prefix:][::-1])
    return edited[prefix : len(edited) - suffix]


HAND_WRITTEN = [
    # four spaces, CRLF, escapes written the user's way
    '{\r\n    "theme": "d\\u00e9",\r\n    "mcpServers": {\r\n        "zeta": {"command": "z",'
    ' "args": [ 1,2 ]}\r\n    }\r\n}\r\n',
    # tabs, trailing spaces, no final newline
    '{\n\t"mcpServers": {\n\t\t"zeta": {\n\t\t\t"command": "z"\n\t\t}   \n\t},\n\t"x": [1]\n}',
    # one line
    '{"mcpServers": {"zeta": {"command": "z"}}, "other": {"a": null}}\n',
    # empty servers object, odd spacing
    '{ "mcpServers" : { } , "k": true }\n',
    # no servers key at all
    '{\n  "theme": "dark"\n}\n',
    # empty document object
    "{}\n",
]


@pytest.mark.parametrize("original", HAND_WRITTEN)
def test_adding_our_server_changes_nothing_else(original: str) -> None:
    edited = set_members(original, "mcpServers", {"agent-center": OURS})
    expected = json.loads(original)
    expected.setdefault("mcpServers", {})["agent-center"] = OURS
    assert json.loads(edited) == expected
    inserted = spliced(original, edited)
    assert '"agent-center"' in inserted and '"zeta"' not in inserted and "theme" not in inserted


def test_replacing_our_server_in_the_middle_keeps_its_neighbours_bytes() -> None:
    original = (
        '{\n    "mcpServers": {\n        "a":   {"command": "a"},\n'
        '        "agent-center": {"command": "old", "env": {"MCPHOST_CONFIGGEN": "1"}},\n'
        '        "z": { "command" : "z" }\n    }\n}\n'
    )
    edited = set_members(original, "mcpServers", {"agent-center": OURS})
    assert '"old"' not in edited
    assert '"a":   {"command": "a"},' in edited and '"z": { "command" : "z" }' in edited
    assert list(json.loads(edited)["mcpServers"]) == ["a", "agent-center", "z"]
    assert json.loads(edited)["mcpServers"]["agent-center"] == OURS


def test_the_merge_api_keeps_a_hand_formatted_file_byte_for_byte() -> None:
    original = '{\n\t"mcpServers": {\n\t\t"mine": {"command": "m"}\n\t},\n\t"keep": "é"\n}\n'
    config = sample_config()
    first = merge("claude", original.encode(), config).decode()
    inserted = spliced(original, first)
    assert '"mine"' not in inserted and '"keep"' not in inserted
    assert first.startswith('{\n\t"mcpServers": {\n\t\t"mine": {"command": "m"},\n\t\t"')
    assert merge("claude", first.encode(), config).decode() == first, "idempotent"
    ours = json.loads(render("claude", config))["mcpServers"]
    assert json.loads(first)["mcpServers"] == {"mine": {"command": "m"}, **ours}


json_leaf = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
json_value = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)
servers = st.dictionaries(
    st.text(min_size=1, max_size=6).filter(lambda n: n != "agent-center"), json_value, max_size=4
)
styles = st.sampled_from(
    [
        {"indent": None},
        {"indent": 2},
        {"indent": 4},
        {"indent": "\t"},
        {"indent": None, "separators": (",", ":")},
        {"indent": 1, "ensure_ascii": True},
    ]
)


@examples(full=200, quick=50)
@given(servers, st.dictionaries(st.text(max_size=5), json_value, max_size=3), styles, st.booleans())
def test_foreign_bytes_survive_any_formatting(
    foreign: dict[str, Any], others: dict[str, Any], style: dict[str, Any], replace: bool
) -> None:
    document: dict[str, Any] = {**others, "mcpServers": dict(foreign)}
    if replace:
        document["mcpServers"]["agent-center"] = {"command": "old"}
    original = json.dumps(document, **style) + "\n"
    edited = set_members(original, "mcpServers", {"agent-center": OURS})
    expected = json.loads(original)
    expected["mcpServers"]["agent-center"] = OURS
    assert json.loads(edited) == expected
    changed = spliced(original, edited)
    assert len(original) - len(edited) + len(changed) <= len('{"command": "old"}') + 2
