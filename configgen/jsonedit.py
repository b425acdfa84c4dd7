"""Edit a JSON document as text: set members of one nested object, leaving every other byte alone.

Owns: `set_members(text, key, updates)`, which returns `text` with `document[key][name] = value`
for each update, where replaced values keep their position and new members are appended in the
style of their neighbours (one per line with the same indentation, or inline for a one-line
object). Every byte outside the replaced values and the inserted members is unchanged, so a
user's formatting, key order, escapes and foreign servers survive a merge byte for byte.

The scanner assumes valid JSON (callers parse it first) and raises `ValueError` on anything it
does not expect; callers verify the result by parsing it. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_SPACE = " \t\r\n"


@dataclass(frozen=True, slots=True)
class _Member:
    key: str
    key_start: int
    value_start: int
    value_end: int


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in _SPACE:
        i += 1
    return i


def _skip_string(text: str, i: int) -> int:
    if text[i] != '"':
        raise ValueError(f"expected a string at offset {i}")
    i += 1
    while True:
        char = text[i]
        if char == "\\":
            i += 2
        elif char == '"':
            return i + 1
        else:
            i += 1


def _skip_value(text: str, i: int) -> int:
    char = text[i]
    if char == '"':
        return _skip_string(text, i)
    if char in "{[":
        depth = 0
        while True:
            char = text[i]
            if char == '"':
                i = _skip_string(text, i)
                continue
            if char in "{[":
                depth += 1
            elif char in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
    while i < len(text) and text[i] not in ",}]" + _SPACE:
        i += 1
    return i


def _members(text: str, brace: int) -> tuple[list[_Member], int]:
    """The members of the object opening at `brace`, and the offset of its closing brace."""
    if text[brace] != "{":
        raise ValueError(f"expected an object at offset {brace}")
    i = _skip_space(text, brace + 1)
    found: list[_Member] = []
    if text[i] == "}":
        return found, i
    while True:
        key_start = i
        i = _skip_string(text, i)
        key = json.loads(text[key_start:i])
        i = _skip_space(text, i)
        if text[i] != ":":
            raise ValueError(f"expected ':' at offset {i}")
        value_start = _skip_space(text, i + 1)
        value_end = _skip_value(text, value_start)
        found.append(_Member(key, key_start, value_start, value_end))
        i = _skip_space(text, value_end)
        if text[i] == ",":
            i = _skip_space(text, i + 1)
        elif text[i] == "}":
            return found, i
        else:
            raise ValueError(f"expected ',' or '}}' at offset {i}")


def _indent_at(text: str, offset: int) -> str:
    line_start = text.rfind("\n", 0, offset) + 1
    end = line_start
    while end < len(text) and text[end] in " \t":
        end += 1
    return text[line_start:end]


def _step(text: str, brace: int, members: list[_Member]) -> str:
    """The indentation step the document uses (from its first nested member), default 2."""
    if members:
        inner = _indent_at(text, members[0].key_start)
        outer = _indent_at(text, brace)
        if inner.startswith(outer) and len(inner) > len(outer):
            return inner[len(outer) :]
    return "  "


def _dump(value: Any, indent: str, step: str) -> str:
    try:
        dumped = json.dumps(value, indent=step, ensure_ascii=False)
    except UnicodeEncodeError:  # pragma: no cover - only lone surrogates
        dumped = json.dumps(value, indent=step, ensure_ascii=True)
    return dumped.replace("\n", "\n" + indent)


def _inline(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _appended(
    text: str, brace: int, members: list[_Member], close: int, new: Mapping[str, Any]
) -> tuple[int, int, str]:
    """(start, end, replacement) adding `new` members to the object at `brace`."""
    step = _step(text, brace, members)
    if members:
        last = members[-1]
        multiline = "\n" in text[brace : members[0].key_start]
        if multiline:
            indent = _indent_at(text, last.key_start)
            pieces = [f",\n{indent}{_inline(k)}: {_dump(v, indent, step)}" for k, v in new.items()]
        else:
            pieces = [f", {_inline(k)}: {_inline(v)}" for k, v in new.items()]
        return last.value_end, last.value_end, "".join(pieces)
    outer = _indent_at(text, brace)
    inner = outer + step
    body = ",\n".join(f"{inner}{_inline(k)}: {_dump(v, inner, step)}" for k, v in new.items())
    return brace + 1, close, f"\n{body}\n{outer}"


def set_members(text: str, key: str, updates: Mapping[str, Any]) -> str:
    """`text` with `document[key][name] = value` for every update (see the module docstring)."""
    root = _skip_space(text, 0)
    top, top_close = _members(text, root)
    holder = next((m for m in reversed(top) if m.key == key), None)
    if holder is None:
        start, end, piece = _appended(text, root, top, top_close, {key: dict(updates)})
        return text[:start] + piece + text[end:]
    inner, inner_close = _members(text, holder.value_start)
    step = _step(text, holder.value_start, inner)
    by_key = {m.key: m for m in inner}  # the last duplicate wins, as in json.loads
    edits: list[tuple[int, int, str]] = []
    new: dict[str, Any] = {}
    for name, value in updates.items():
        member = by_key.get(name)
        if member is None:
            new[name] = value
            continue
        indent = _indent_at(text, member.key_start)
        multiline = "\n" in text[holder.value_start : inner_close]
        rendered = _dump(value, indent, step) if multiline else _inline(value)
        edits.append((member.value_start, member.value_end, rendered))
    if new:
        edits.append(_appended(text, holder.value_start, inner, inner_close, new))
    for start, end, piece in sorted(edits, reverse=True):
        text = text[:start] + piece + text[end:]
    return text
