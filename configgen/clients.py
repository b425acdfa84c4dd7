"""The client registry: how each MCP client spells a stdio server, and the bytes of a fresh config.

Owns: one `ClientFormat` per client (`CLIENTS`), each a small declaration (file syntax, the key
holding the servers, how one server entry looks, the client's tiering default, what the client
would interpolate), and `render`, which turns an `AgentConfig` into deterministic bytes: keys
sorted, two-space JSON indentation, a trailing newline; the servers in ACP's `session/new`
shape (`acp_servers`); and how each client is told to run a preapproved server's tools without
asking (Codex: the entry's `default_tools_approval_mode`; Claude Code: the `permissions.allow`
rules of its settings file, `claude_permission_rules`).

Pure: no I/O. Must never: emit a value the client would rewrite (`${...}` interpolation) or a
document its own parser rejects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import tomli_w

from configgen.model import AgentConfig, ConfigError, Server, servers

Entry = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ClientFormat:
    name: str
    title: str
    syntax: Literal["json", "toml"]
    servers_key: str
    where: str
    entry: Callable[[Server, AgentConfig], Entry]
    # False: the client gets the full catalog (AC_MCP_TIER_TOOLS=false) unless told otherwise.
    # Codex's tool search only indexes the startup catalog. Claude Code defers MCP tools itself
    # (its ToolSearch) and builds its next request from the tool list it held before a
    # `tools/list_changed` refresh lands, so a tool `search_tools` loads is not offered there.
    tier_tools_default: bool = True
    # Values this client would expand (and so corrupt); None when it expands nothing.
    interpolation: re.Pattern[str] | None = None
    interpolation_hint: str = ""


def _stdio(server: Server, _config: AgentConfig) -> Entry:
    if server.url is not None:
        raise ConfigError("http url", "this client is given stdio entries only here")
    return {"args": list(server.args), "command": server.command, "env": dict(server.env)}


def _claude(server: Server, config: AgentConfig) -> Entry:
    if server.url is not None:  # Claude Code's remote server entry
        return {"type": "http", "url": server.url}
    return _stdio(server, config)


def _typed_stdio(server: Server, config: AgentConfig) -> Entry:
    return {**_stdio(server, config), "type": "stdio"}


def _gemini(server: Server, config: AgentConfig) -> Entry:
    return {**_stdio(server, config), "timeout": config.tool_timeout_sec * 1000}


def _codex(server: Server, config: AgentConfig) -> Entry:
    # `required`: Codex waits for the server before the first turn (and fails the thread if it
    # cannot start it) instead of running that turn without the agent's own tools when the
    # server is a moment slower than the model's first request.
    # Codex's streamable HTTP entry is a `url` in place of the command
    shape = {"url": server.url} if server.url is not None else _stdio(server, config)
    entry: Entry = {
        **shape,
        "required": True,
        "startup_timeout_sec": config.startup_timeout_sec,
        "tool_timeout_sec": config.tool_timeout_sec,
    }
    if server.preapproved:
        # Codex (codex-acp 0.16.0) runs every tool of the server without asking; a server of
        # the same name given in ACP's `session/new` keeps this setting
        entry["default_tools_approval_mode"] = "approve"
    return entry


_DOLLAR_BRACE = re.compile(r"\$\{")
_DOLLAR_NAME = re.compile(r"\$[A-Za-z_{]")

CLIENTS: Mapping[str, ClientFormat] = {
    fmt.name: fmt
    for fmt in (
        ClientFormat(
            "claude",
            "Claude Code",
            "json",
            "mcpServers",
            "claude --mcp-config FILE --strict-mcp-config; or .mcp.json",
            _claude,
            tier_tools_default=False,
            interpolation=_DOLLAR_BRACE,
            interpolation_hint="${...}",
        ),
        ClientFormat(
            "desktop",
            "Claude Desktop",
            "json",
            "mcpServers",
            "~/.config/Claude/claude_desktop_config.json (macOS: ~/Library/Application Support/Claude/)",
            _stdio,
        ),
        ClientFormat(
            "cursor",
            "Cursor",
            "json",
            "mcpServers",
            "~/.cursor/mcp.json or .cursor/mcp.json",
            _stdio,
            interpolation=_DOLLAR_BRACE,
            interpolation_hint="${...}",
        ),
        ClientFormat(
            "gemini",
            "Gemini CLI",
            "json",
            "mcpServers",
            "~/.gemini/settings.json or .gemini/settings.json",
            _gemini,
            interpolation=_DOLLAR_NAME,
            interpolation_hint="$NAME / ${...}",
        ),
        ClientFormat(
            "vscode",
            "VS Code",
            "json",
            "servers",
            ".vscode/mcp.json or the user profile's mcp.json",
            _typed_stdio,
            interpolation=_DOLLAR_BRACE,
            interpolation_hint="${...}",
        ),
        ClientFormat(
            "codex",
            "Codex",
            "toml",
            "mcp_servers",
            "$CODEX_HOME/config.toml (default ~/.codex/config.toml)",
            _codex,
            tier_tools_default=False,
        ),
    )
}

CODEX_HEADER = (
    "# Generated by configgen (mcphost). Regenerate rather than edit by hand.\n"
    "# Servers carrying MCPHOST_CONFIGGEN in their env are replaced on the next --merge.\n"
)


def client(name: str) -> ClientFormat:
    try:
        return CLIENTS[name]
    except KeyError:
        raise ConfigError(
            "client", f"unknown client {name!r}: expected one of {', '.join(CLIENTS)}"
        ) from None


def entries(fmt: ClientFormat, config: AgentConfig) -> dict[str, Entry]:
    """Our server entries for `fmt`, by name (sorted), each with sorted keys."""
    out: dict[str, Entry] = {}
    for name, server in servers(config, tier_tools_default=fmt.tier_tools_default).items():
        if fmt.interpolation is not None:
            _refuse_interpolation(fmt, name, server)
        entry = fmt.entry(server, config)
        out[name] = {k: entry[k] for k in sorted(entry)}
    return out


def _refuse_interpolation(fmt: ClientFormat, name: str, server: Server) -> None:
    assert fmt.interpolation is not None
    values = [("command", server.command), ("url", server.url or "")]
    values += [(f"argument {i + 1}", arg) for i, arg in enumerate(server.args)]
    values += [(variable, text) for variable, text in server.env.items()]
    for where, text in values:
        if fmt.interpolation.search(text):
            raise ConfigError(
                where,
                f"server {name!r}: {where} is {text!r}, which {fmt.title} would expand "
                f"({fmt.interpolation_hint}); use a value without it",
            )


def dump_json(document: Any) -> bytes:
    """Two-space JSON with a trailing newline; UTF-8, falling back to ASCII escapes."""
    try:
        return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate came in through a merged document
        return (json.dumps(document, indent=2, ensure_ascii=True) + "\n").encode("ascii")


def codex_tables(fmt: ClientFormat, ours: Mapping[str, Entry]) -> str:
    """Our `[servers_key.NAME]` tables as TOML text (`tomli_w`: every control character and DEL
    escaped, keys bare where they can be, scalars before sub-tables, arrays one item a line)."""
    if not ours:
        return ""
    return tomli_w.dumps({fmt.servers_key: dict(ours)})


def render(client_name: str, config: AgentConfig) -> bytes:
    """The bytes of a fresh config for `client_name`. Deterministic; pure."""
    fmt = client(client_name)
    ours = entries(fmt, config)
    if fmt.syntax == "toml":
        return (CODEX_HEADER + "\n" + codex_tables(fmt, ours)).encode("utf-8")
    return dump_json({fmt.servers_key: ours})


def claude_permission_rules(config: AgentConfig) -> list[str]:
    """Claude Code's `permissions.allow` rules (its settings file) that pre-approve every tool
    of each `preapproved` server of `config`: `mcp__<server>`, in name order. Pure."""
    return [f"mcp__{name}" for name, server in servers(config).items() if server.preapproved]


def acp_servers(config: AgentConfig, *, tier_tools_default: bool = True) -> list[Entry]:
    """Our servers as an ACP client hands them to its agent in `session/new` / `session/load`
    (`mcpServers`: a list of stdio servers, `{name, command, args, env}` with `env` a list of
    `{name, value}`), in name order. ACP agents are editors' agents: they take their MCP
    servers from the client, never from a file, so this is a shape, not a file. Pure."""
    return [
        {"type": "http", "name": name, "url": server.url, "headers": []}
        if server.url is not None
        else {
            "name": name,
            "command": server.command,
            "args": list(server.args),
            "env": [{"name": key, "value": value} for key, value in server.env.items()],
        }
        for name, server in servers(config, tier_tools_default=tier_tools_default).items()
    ]
