"""agentmux's TOML tables read key by key: every flaw names the file and the key.

Owns: how a configuration file's table is read (reference `agentmux-relay.md` §3.1): kebab-case
keys, `deny_unknown_fields` (an unknown key, a snake_case spelling of a kebab key included, is a
flaw), `format-version = 1` when present, types and ranges checked, `environment = [{name,
value}]`; each flaw a `RelayError` whose message names the file and the key
(`sessions[1].coder`) and whose details are `{"path", "cause"}`; `first_file` / `open_table`:
the first layer's file (agentmux's one reader, `layers.first_file`) with its errors as
`RelayError`s; and the two ways of reading (`Reading`):

- `STRICT`: every flaw is refused (the relay's reading of every file it reads);
- `LENIENT`: a flaw (`Table.flaw`) is forgiven and the key reads as absent: the accessor returns
  its default (None, `()`, the boolean's default), an array keeps only its tables, an
  environment only its well-formed entries, unknown keys and `format-version` are ignored. What a
  caller refuses itself (`Table.error`, raised) still fails. Which files are read leniently, and
  why, is the reader's to say (`bundlefile`, for the relay tools' membership).

Must never: write anything, or import `mcphost.relay` or `mcphost.relaytools`.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from mcphost.agentmux import layers
from mcphost.agentmux.wire import RelayError

INVALID = "validation_invalid_arguments"
FORMAT_VERSION = 1
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Reading(enum.Enum):
    """How a file is read: `STRICT` refuses every flaw, `LENIENT` forgives it (module doc)."""

    STRICT = "strict"
    LENIENT = "lenient"


STRICT = Reading.STRICT
LENIENT = Reading.LENIENT


@dataclass(frozen=True, slots=True)
class Source:
    """One configuration file being read: where errors point."""

    path: Path
    label: str  # "bundle configuration", "coders configuration", ...

    def error(self, key: str, cause: str, code: str = INVALID) -> RelayError:
        text = f"{key}: {cause}" if key else cause
        return RelayError(
            code,
            f"{self.label} is invalid: {self.path}: {text}",
            {"path": str(self.path), "cause": text},
        )


class Table:
    """A TOML table read with `deny_unknown_fields`: each key taken once, `done()` refuses the rest.

    `where` is the table's key path (`sessions[0]`, `coders[1].tmux`) so errors name the key;
    `reading` says whether a flaw is refused or forgiven (module doc); tables read from this one
    are read the same way.
    """

    def __init__(
        self,
        source: Source,
        data: Mapping[str, Any],
        where: str = "",
        reading: Reading = STRICT,
    ) -> None:
        self.source = source
        self.data = data
        self.where = where
        self.reading = reading
        self._seen: set[str] = set()

    @property
    def strict(self) -> bool:
        return self.reading is STRICT

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def error(self, name: str, cause: str, code: str = INVALID) -> RelayError:
        """The refusal of `name` (raised by the caller whatever the reading)."""
        return self.source.error(self.key(name), cause, code)

    def flaw(self, name: str, cause: str, code: str = INVALID) -> None:
        """A flaw in `name`: refused when strict; when lenient, forgiven (the caller then reads
        the key as absent)."""
        if self.strict:
            raise self.error(name, cause, code)

    def has(self, name: str) -> bool:
        return name in self.data

    def raw(self, name: str) -> Any:
        self._seen.add(name)
        return self.data.get(name)

    def string(self, name: str, *, required: bool = False, empty: bool = False) -> str | None:
        value = self.raw(name)
        if value is None:
            if required:
                self.flaw(name, "missing required field")
            return None
        if not isinstance(value, str):
            self.flaw(name, f"expected a string, got {_kind(value)}")
            return None
        if not empty and not value.strip():
            self.flaw(name, "must be non-empty")
            return None
        if "\x00" in value:
            self.flaw(name, "must not contain NUL")
            return None
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self.raw(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.flaw(name, f"expected a boolean, got {_kind(value)}")
            return default
        return value

    def integer(self, name: str, *, low: int, high: int | None = None) -> int | None:
        value = self.raw(name)
        if value is None:
            return None
        if type(value) is not int:
            self.flaw(name, f"expected an integer, got {_kind(value)}")
            return None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            self.flaw(name, f"must be {bound}, got {value}")
            return None
        return value

    def strings(self, name: str) -> tuple[str, ...]:
        value = self.raw(name)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.flaw(name, "expected an array of strings")
            return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()
        return tuple(value)

    def table(self, name: str) -> Table | None:
        value = self.raw(name)
        if value is None:
            return None
        if not isinstance(value, dict):
            self.flaw(name, f"expected a table, got {_kind(value)}")
            return None
        return Table(self.source, value, self.key(name), self.reading)

    def tables(self, name: str) -> list[Table]:
        value = self.raw(name)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            self.flaw(name, "expected an array of tables")
            if not isinstance(value, list):
                return []
        return [
            Table(self.source, v, f"{self.key(name)}[{i}]", self.reading)
            for i, v in enumerate(value)
            if isinstance(v, dict)
        ]

    def environment(self, name: str = "environment") -> tuple[tuple[str, str], ...]:
        """`environment = [{name, value}]`: names unique, POSIX-shaped; values without NUL."""
        out: dict[str, str] = {}
        for entry in self.tables(name):
            var = entry.string("name", required=True)
            value = entry.string("value", required=True, empty=True)
            entry.done()
            if var is None or value is None:
                continue  # forgiven (lenient): the entry is left out
            if not ENV_NAME.fullmatch(var):
                entry.flaw("name", f"{var!r} is not an environment variable name")
            elif var in out:
                entry.flaw("name", f"{var!r} is set twice")
            else:
                out[var] = value
        return tuple(out.items())

    def format_version(self) -> None:
        value = self.raw("format-version")
        if value is not None and (type(value) is not int or value != FORMAT_VERSION):
            self.flaw("format-version", f"unsupported format version {value!r} (expected 1)")

    def done(self) -> None:
        for name in sorted(set(self.data) - self._seen):
            hint = ""
            if "_" in name and name.replace("_", "-") in self._seen:
                hint = f" (keys are kebab-case: {name.replace('_', '-')!r})"
            self.flaw(name, f"unknown field{hint}")


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def first_file(roots: Sequence[Path], relative: str) -> tuple[Path, dict[str, Any]] | None:
    """The first layer's `relative` file, parsed, with its path; None when no layer has it; a
    file that cannot be read or parsed is a `RelayError` naming it (whatever the reading)."""
    try:
        return layers.first_file(roots, relative)
    except layers.ConfigError as exc:
        _refuse(exc)


def _refuse(exc: layers.ConfigError) -> NoReturn:
    cause = str(exc.__cause__) if exc.__cause__ is not None else exc.message
    raise RelayError(exc.code, exc.message, {"path": str(exc.path), "cause": cause}) from None


def open_table(
    roots: Sequence[Path], relative: str, label: str, reading: Reading = STRICT
) -> Table | None:
    """The first layer's `relative` file as its top table (`format-version` checked), None when
    no layer has it."""
    found = first_file(roots, relative)
    if found is None:
        return None
    path, doc = found
    top = Table(Source(path, label), doc, reading=reading)
    top.format_version()
    return top
