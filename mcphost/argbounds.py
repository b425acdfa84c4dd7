"""Bounds on a tool call's arguments, checked before any validation, for both tool surfaces.

Owns: the limits below (named constants), `oversize()` (the first limit an arguments document
breaks, or None), and `report_names()` (at most `MAX_REPORTED_FIELDS` names, each cut to
`MAX_NAME_CHARS`, plus how many were left out) which the center-tools host
(`mcphost/host/server.py`, `results.py`) and the relay tools (`mcphost/relaytools/validation.py`)
both use to keep a refusal small. Pure, standard library only.

Why: a validator reports every unknown key, so an arguments object with a million keys made the
host build (and write, twice) a million error entries: 1.7 GB and a loop frozen for many seconds
for one 14 MB request line. Here the work is bounded by the limits, never by the document: a too
wide object is refused from its length alone, and the walk stops after `MAX_VALUES` values.
The limits are far above what any tool takes (the widest input has 7 fields, the longest list 64
items, nothing legitimately nests), so a refusal here is always a malformed or hostile call.

Must never: look at more than `MAX_VALUES` values, or let a caller's key of any length into a
reply uncut.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

MAX_KEYS_PER_OBJECT = 256
"""An object (the arguments or any value inside them) with more keys is refused unread."""
MAX_DEPTH = 32
"""Objects and arrays nest at most this deep; the arguments object itself is depth 1."""
MAX_VALUES = 10_000
"""At most this many values in all (every key's value and every array item, at any depth)."""
MAX_REPORTED_FIELDS = 10
"""A refusal names at most this many fields and counts the rest."""
MAX_NAME_CHARS = 80
"""A field name in a refusal is cut to this many characters (a key can be megabytes long)."""

LIMITS = {
    "max_keys_per_object": MAX_KEYS_PER_OBJECT,
    "max_depth": MAX_DEPTH,
    "max_values": MAX_VALUES,
}
REASON = "arguments_too_large"

Limit = Literal["keys", "depth", "values"]


@dataclass(frozen=True, slots=True)
class Oversize:
    """Which limit an arguments document broke, where, and by how much."""

    limit: Limit
    at: str  # where: "(arguments)" or a dotted path such as "args.x" / "targets[3]"
    found: int  # keys: exact; depth and values: a lower bound (the walk stopped there)

    @property
    def message(self) -> str:
        if self.limit == "keys":
            return (
                f"the object at {self.at} has {self.found} keys, more than the "
                f"{MAX_KEYS_PER_OBJECT} accepted"
            )
        if self.limit == "depth":
            return f"values nest deeper than {MAX_DEPTH} levels (at {self.at})"
        return f"the arguments hold more than {MAX_VALUES} values in all (counted up to {self.at})"

    def details(self) -> dict[str, Any]:
        found = "found" if self.limit == "keys" else "found_at_least"
        return {"reason": REASON, "limit": self.limit, "at": self.at, found: self.found, **LIMITS}


def short_name(name: str) -> str:
    """`name` cut to `MAX_NAME_CHARS` characters, with a note of how many were dropped."""
    if len(name) <= MAX_NAME_CHARS:
        return name
    return f"{name[:MAX_NAME_CHARS]}…[{len(name) - MAX_NAME_CHARS} more characters]"


def _path(parts: tuple[str | int, ...]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + short_name(part)
    return out or "(arguments)"


def oversize(arguments: Any) -> Oversize | None:
    """The first limit `arguments` breaks, or None; never more than `MAX_VALUES` steps of work.

    A container's size is checked (an O(1) `len`) before any of its members is looked at, so a
    million-key object costs as much as a two-key one.
    """
    values = 0
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(arguments, 1, ())]
    while stack:
        value, depth, parts = stack.pop()
        if isinstance(value, dict):
            if len(value) > MAX_KEYS_PER_OBJECT:
                return Oversize("keys", _path(parts), len(value))
        elif not isinstance(value, list):
            continue
        if depth > MAX_DEPTH:
            return Oversize("depth", _path(parts), depth)
        values += len(value)
        if values > MAX_VALUES:
            return Oversize("values", _path(parts), values)
        members: Iterable[tuple[str | int, Any]] = (
            value.items() if isinstance(value, dict) else enumerate(value)
        )
        for key, member in members:
            if isinstance(member, (dict, list)):
                stack.append((member, depth + 1, (*parts, key)))
    return None


def report_names(names: Iterable[str], total: int) -> tuple[list[str], int]:
    """At most `MAX_REPORTED_FIELDS` of `names` (each cut short) and how many of `total` are left."""
    shown: list[str] = []
    for name in names:
        if len(shown) == MAX_REPORTED_FIELDS:
            break
        shown.append(short_name(name))
    return shown, max(total - len(shown), 0)
