"""Add or replace our servers inside an existing client config, keeping everything else.

Owns: the merge semantics (docs/configgen.md, "Merge"):

- **Ours** is a server whose `env` holds `MCPHOST_CONFIGGEN` (every server configgen writes
  carries it). A server of the same name without the marker is the user's: replacing it is
  refused unless `force=True`. Servers we wrote under other names are left alone.
- **JSON** clients: edited as text (`configgen.jsonedit`), so foreign bytes stay byte for byte:
  our entries replace same-named values in place or are appended in their neighbours' style.
  The result is re-parsed and must equal the intended document; a shape the text editor cannot
  handle falls back to rewriting the document with two-space indentation (content and order
  kept). Comments (JSONC) are refused rather than silently dropped.
- **Codex TOML**: edited with `tomlkit` (style-preserving), so foreign bytes stay byte for
  byte: each of our `[mcp_servers.NAME]` tables (and its sub-tables) is replaced where it stands
  by a fresh one written by `tomli_w` (the trailing comment and blank lines, which annotate what
  follows, are kept); new servers are appended at the end as `render` writes them. The input
  must parse with `tomllib` (else a `ConfigError` naming line and column; nothing is written).
  The result is re-parsed and checked: every foreign value must be unchanged, and ours must be
  exactly what we meant; a form we do not rewrite (inline table, dotted keys) is refused.

Pure: bytes in, bytes out. Must never: lose or alter a foreign server or key.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from typing import Any

import tomlkit
import tomlkit.exceptions
from tomlkit.items import Comment, Table, Whitespace

from configgen.clients import (
    ClientFormat,
    Entry,
    client,
    codex_tables,
    dump_json,
    entries,
    render,
)
from configgen.jsonedit import set_members
from configgen.model import MARKER, AgentConfig, ConfigError


def is_ours(entry: object) -> bool:
    """True for a server entry configgen wrote (its env carries the marker)."""
    if not isinstance(entry, Mapping):
        return False
    env = entry.get("env")
    return isinstance(env, Mapping) and MARKER in env


def merge(client_name: str, existing: bytes, config: AgentConfig, *, force: bool = False) -> bytes:
    """`existing` with our servers added or replaced. Empty input gives `render(...)`."""
    fmt = client(client_name)
    ours = entries(fmt, config)
    try:
        text = existing.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError("merge", f"the existing config is not UTF-8 ({exc.reason})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text.strip():
        return render(client_name, config)
    if fmt.syntax == "json":
        return _merge_json(fmt, text, ours, force)
    return _merge_toml(fmt, text, ours, force)


def _check_conflicts(
    fmt: ClientFormat, present: Mapping[str, Any], ours: Mapping[str, Entry], force: bool
) -> None:
    for name in ours:
        if name in present and not is_ours(present[name]) and not force:
            raise ConfigError(
                "merge",
                f"the existing config already has a {fmt.servers_key} entry {name!r} that "
                "configgen did not write; choose another server name or pass --force to replace it",
            )


def _merge_json(fmt: ClientFormat, text: str, ours: Mapping[str, Entry], force: bool) -> bytes:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            "merge",
            f"the existing config is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            "comments and trailing commas are not supported: remove them or merge by hand",
        ) from None
    if not isinstance(document, dict):
        raise ConfigError("merge", "the existing config is not a JSON object")
    present = document.get(fmt.servers_key, {})
    if not isinstance(present, dict):
        raise ConfigError("merge", f"the existing config's {fmt.servers_key!r} is not an object")
    _check_conflicts(fmt, present, ours, force)
    merged = {name: ours.get(name, entry) for name, entry in present.items()}
    merged.update({name: entry for name, entry in ours.items() if name not in merged})
    document[fmt.servers_key] = merged
    try:
        edited = set_members(text, fmt.servers_key, ours)
        if json.loads(edited) == document:
            return edited.encode("utf-8")
    except (ValueError, IndexError, UnicodeEncodeError):
        pass  # a shape the text editor does not handle: rewrite the whole document instead
    return dump_json(document)


def _merge_toml(fmt: ClientFormat, text: str, ours: Mapping[str, Entry], force: bool) -> bytes:
    try:
        before = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            "merge", f"the existing config is not TOML ({exc}); fix it or merge by hand"
        ) from None
    present = before.get(fmt.servers_key, {})
    if not isinstance(present, dict):
        raise ConfigError("merge", f"the existing config's {fmt.servers_key!r} is not a table")
    _check_conflicts(fmt, present, ours, force)
    unsafe = ConfigError(
        "merge",
        f"cannot replace server(s) {', '.join(sorted(n for n in ours if n in present)) or '?'} "
        f"safely: configgen rewrites only servers written as [{fmt.servers_key}.NAME] tables; "
        "edit the existing entry by hand",
    )

    try:
        document = tomlkit.parse(text)
    except tomlkit.exceptions.TOMLKitError as exc:  # tomllib took it: a tomlkit limitation
        raise ConfigError(
            "merge", f"the existing config cannot be edited in place ({exc}); merge by hand"
        ) from None
    parts = [  # the `[servers_key.…]` tables, in as many runs as the file splits them into
        item
        for key, item in document.body
        if key is not None and key.key == fmt.servers_key and not key.is_dotted()
    ]
    for name, entry in ours.items():
        if name in present:
            _replace_table(parts, name, _fresh_table(fmt, name, entry), unsafe)
    result = tomlkit.dumps(document)
    appended = {name: entry for name, entry in ours.items() if name not in present}
    if appended:
        if not result or result.endswith("\n\n"):
            glue = ""
        elif result.endswith("\n"):
            glue = "\n"
        else:
            glue = "\n\n"
        result += glue + codex_tables(fmt, appended)

    try:
        after = tomllib.loads(result)
    except tomllib.TOMLDecodeError:
        after = None
    expected = dict(before)
    expected[fmt.servers_key] = {
        **{name: entry for name, entry in present.items() if name not in ours},
        **ours,
    }
    if after != expected:
        raise unsafe
    return result.encode("utf-8")


def _fresh_table(fmt: ClientFormat, name: str, entry: Entry) -> Table:
    """Our table for `name`, parsed by tomlkit from exactly the text `render` writes."""
    fragment = tomlkit.parse(codex_tables(fmt, {name: entry}))
    table = fragment[fmt.servers_key][name]
    assert isinstance(table, Table)
    return table


def _replace_table(parts: list[Any], name: str, fresh: Table, unsafe: ConfigError) -> None:
    """Put `fresh` where the `[servers.NAME]` table stands, keeping the trivia that ends it.

    Comment and blank lines at the end of a table annotate what follows it (configgen writes no
    comments), so they move to the end of the fresh table. Only a table written with its own
    header(s), in one run, is replaced: an inline table, dotted keys, or our table split around
    others raise `unsafe` (the re-parse guard would refuse the result anyway).
    """
    for part in parts:
        if not isinstance(part, Table) or name not in part:
            continue
        old = part.get(name)
        dotted = any(k is not None and k.key == name and k.is_dotted() for k, _ in part.value.body)
        if isinstance(old, Table) and not dotted:
            break
        raise unsafe
    else:
        raise unsafe
    trailing = _pop_trailing_trivia(old)
    part[name] = fresh
    _pop_trailing_trivia(fresh)  # tomlkit may append a cosmetic blank line: the old one rules
    last = fresh
    while last.value.body and isinstance(last.value.body[-1][1], Table):
        last = last.value.body[-1][1]
    for item in trailing:
        last.add(item)


def _pop_trailing_trivia(table: Table) -> list[Whitespace | Comment]:
    """Remove and return the comment and blank lines that end `table` (rendered last: after its
    last sub-table's keys)."""
    body = table.value.body
    trailing: list[Whitespace | Comment] = []
    while body and body[-1][0] is None:
        item = body[-1][1]
        if not isinstance(item, Whitespace | Comment):
            break
        trailing.insert(0, item)
        body.pop()
    if body and isinstance(body[-1][1], Table):
        trailing = _pop_trailing_trivia(body[-1][1]) + trailing
    return trailing
