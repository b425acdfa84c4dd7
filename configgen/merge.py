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
- **Codex TOML**: edited as text, so foreign bytes stay byte-for-byte: our `[mcp_servers.NAME]`
  tables (and their sub-tables) are cut out and fresh ones appended. The result is re-parsed
  and checked: every foreign value must be unchanged, and ours must be exactly what we meant.

Pure: bytes in, bytes out. Must never: lose or alter a foreign server or key.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from typing import Any

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
        raise ConfigError("merge", f"the existing config is not TOML ({exc})") from None
    present = before.get(fmt.servers_key, {})
    if not isinstance(present, dict):
        raise ConfigError("merge", f"the existing config's {fmt.servers_key!r} is not a table")
    _check_conflicts(fmt, present, ours, force)

    kept = _cut_tables(text, fmt.servers_key, set(ours))
    if not kept or kept.endswith("\n\n"):
        glue = ""
    elif kept.endswith("\n"):
        glue = "\n"
    else:
        glue = "\n\n"
    result = kept + glue + codex_tables(fmt, ours)

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
        names = ", ".join(sorted(name for name in ours if name in present))
        raise ConfigError(
            "merge",
            f"cannot replace server(s) {names or '?'} safely: configgen rewrites only servers "
            f"written as [{fmt.servers_key}.NAME] tables; edit the existing entry by hand",
        )
    return result.encode("utf-8")


def _cut_tables(text: str, root: str, names: set[str]) -> str:
    """`text` without the tables whose key path starts with `root.NAME` for NAME in `names`.

    A trailing run of comment lines at the end of a cut table is kept: it annotates the table
    that follows, not ours (configgen writes no comments inside its tables).
    """
    headers = _headers(text)
    if not headers:
        return text
    out = [text[: headers[0][0]]]
    for index, (start, path) in enumerate(headers):
        end = headers[index + 1][0] if index + 1 < len(headers) else len(text)
        section = text[start:end]
        if len(path) >= 2 and path[0] == root and path[1] in names:
            out.append(_trailing_comments(section))
        else:
            out.append(section)
    return "".join(out)


def _trailing_comments(section: str) -> str:
    lines = section.splitlines(keepends=True)
    keep: list[str] = []
    for line in reversed(lines[1:]):
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and keep):
            keep.insert(0, line)
        elif stripped:
            break
        # blank lines after the last comment belong to the cut table
    while keep and not keep[0].strip():
        keep.pop(0)
    return "".join(keep)


def _headers(text: str) -> list[tuple[int, tuple[str, ...]]]:
    """(offset of the line, key path) of every table header in valid TOML `text`."""
    headers: list[tuple[int, tuple[str, ...]]] = []
    i, n, depth, line_start = 0, len(text), 0, True
    while i < n:
        if line_start:
            line_start = False
            j = i
            while j < n and text[j] in " \t":
                j += 1
            if depth == 0 and j < n and text[j] == "[":
                end = _header_end(text, j)
                headers.append((i, _header_path(text[j:end])))
                i = end
                continue
            i = j
            continue
        char = text[i]
        if char == "\n":
            line_start = True
            i += 1
        elif char == "#":
            newline = text.find("\n", i)
            i = n if newline < 0 else newline
        elif text.startswith('"""', i) or text.startswith("'''", i):
            i = _skip_multiline(text, i)
        elif char in "\"'":
            i = _skip_string(text, i)
        else:
            if char in "[{":
                depth += 1
            elif char in "]}":
                depth -= 1
            i += 1
    return headers


def _skip_string(text: str, i: int) -> int:
    quote = text[i]
    i += 1
    while text[i] != quote:
        i += 2 if quote == '"' and text[i] == "\\" else 1
    return i + 1


def _skip_multiline(text: str, i: int) -> int:
    delimiter = text[i : i + 3]
    i += 3
    while not text.startswith(delimiter, i):
        i += 2 if delimiter == '"""' and text[i] == "\\" else 1
    i += 3
    extra = 0
    while extra < 2 and i < len(text) and text[i] == delimiter[0]:
        i += 1
        extra += 1
    return i


def _header_end(text: str, i: int) -> int:
    """Index just past the `]` / `]]` closing the header that opens at `i`."""
    array = text.startswith("[[", i)
    i += 2 if array else 1
    while text[i] != "]":
        i = _skip_string(text, i) if text[i] in "\"'" else i + 1
    return i + (2 if array else 1)


def _header_path(header: str) -> tuple[str, ...]:
    inner = header[2:-2] if header.startswith("[[") else header[1:-1]
    node: Any = tomllib.loads(inner + " = 0")
    path: list[str] = []
    while isinstance(node, dict):
        ((name, node),) = node.items()
        path.append(name)
    return tuple(path)
