"""The name grammars both sides check: agentmux's bundle ids and session ids, and the
supervisor's agent ids.

Owns: the grammars, shared by the relay tools (`mcphost.relaytools.layout`, `validation`), which
refuse a name outside them before building any path, configgen, which refuses to write a config
the relay tools would refuse at start, and the supervisor's fleet file, whose agent ids name
directories (`<state>/agents/<id>/`) and are each agent's `AC_MCP_AGENT_ID`.

- bundle id: `[A-Za-z0-9._-]+`, but not `.` or `..` (it is a path segment).
- session id: an ASCII letter, then letters, digits, `-` or `_`, at most 31 characters.
- agent id (supervised): an ASCII letter or digit, then letters, digits, `.`, `_` or `-`, at
  most 128 characters. A safe directory name (never `.`, `..`, hidden or option-like) and a
  valid `AC_MCP_AGENT_ID` (which only forbids whitespace and control characters).

Pure: stdlib `re` only. Must never: import anything of the relay tools or configgen (both import
this module, so it sits below them).
"""

from __future__ import annotations

import re

BUNDLE_NAME = re.compile(r"[A-Za-z0-9._-]+")
SESSION_ID = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,30}")
SESSION_ID_EXPECTED = "an ASCII letter, then letters, digits, '-' or '_', at most 31 characters"
AGENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
AGENT_ID_EXPECTED = (
    "an ASCII letter or digit, then letters, digits, '.', '_' or '-', at most 128 characters"
)


def is_bundle_name(name: str) -> bool:
    """agentmux's bundle-id grammar (bundle file stems, `--bundle`, namespaces)."""
    return bool(BUNDLE_NAME.fullmatch(name)) and name not in (".", "..")


def is_session_id(name: str) -> bool:
    """agentmux's session-id grammar (bundle member ids and `--session-name`)."""
    return bool(SESSION_ID.fullmatch(name))


def is_agent_id(name: str) -> bool:
    """The supervisor's agent-id grammar: a directory name and an `AC_MCP_AGENT_ID`."""
    return bool(AGENT_ID.fullmatch(name))
