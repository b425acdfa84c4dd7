"""A minimal TOML writer for the shapes configgen emits (tables of strings, ints, bools, lists).

Owns: correct escaping. Every control character is escaped (`\\b \\t \\n \\f \\r` short forms,
`\\u00XX` for the rest, including DEL), `"` and `\\` are escaped, other Unicode is written as
UTF-8. Keys are bare when they match `[A-Za-z0-9_-]+`, quoted otherwise. `tomllib` parses every
output (the tests check this on arbitrary input).

Pure: no I/O. Must never: emit a lone surrogate (TOML strings are Unicode scalar values; callers
validate first, and this module raises `ValueError` rather than write one).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

_BARE = re.compile(r"[A-Za-z0-9_-]+")
_SHORT = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r", '"': '\\"', "\\": "\\\\"}
_NEEDS_ESCAPE = re.compile(r'[\x00-\x1f\x7f"\\]')

TomlValue = str | int | bool | Sequence[str] | Mapping[str, "TomlValue"]


def _escape_char(match: re.Match[str]) -> str:
    char = match.group(0)
    return _SHORT.get(char) or f"\\u{ord(char):04X}"


def string(value: str) -> str:
    """A TOML basic string literal for `value`."""
    if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise ValueError("a lone surrogate cannot be written to TOML")
    return '"' + _NEEDS_ESCAPE.sub(_escape_char, value) + '"'


def key(name: str) -> str:
    """A TOML key: bare if it can be, else a quoted basic string."""
    return name if _BARE.fullmatch(name) else string(name)


def value(item: TomlValue) -> str:
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, int):
        return str(item)
    if isinstance(item, str):
        return string(item)
    if isinstance(item, Sequence):
        return "[" + ", ".join(value(element) for element in item) + "]"
    raise TypeError(f"cannot write {type(item).__name__} as an inline TOML value")


def table(path: Sequence[str], body: Mapping[str, TomlValue]) -> str:
    """`[a.b]` then its scalar keys (sorted), then each sub-table (sorted), blank-line separated."""
    header = "[" + ".".join(key(part) for part in path) + "]\n"
    lines = [
        f"{key(name)} = {value(item)}\n"
        for name, item in sorted(body.items())
        if not isinstance(item, Mapping)
    ]
    out = header + "".join(lines)
    for name, item in sorted(body.items()):
        if isinstance(item, Mapping):
            out += "\n" + table([*path, name], item)
    return out
