"""The agentmux name grammars both sides check: bundle ids and session ids.

Owns: the two grammars (agentmux's), shared by the relay tools (`mcphost.relaytools.layout`,
`validation`), which refuse a name outside them before building any path, and configgen, which
refuses to write a config the relay tools would refuse at start.

- bundle id: `[A-Za-z0-9._-]+`, but not `.` or `..` (it is a path segment).
- session id: an ASCII letter, then letters, digits, `-` or `_`, at most 31 characters.

Pure: stdlib `re` only. Must never: import anything of the relay tools or configgen (both import
this module, so it sits below them).
"""

from __future__ import annotations

import re

BUNDLE_NAME = re.compile(r"[A-Za-z0-9._-]+")
SESSION_ID = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,30}")
SESSION_ID_EXPECTED = "an ASCII letter, then letters, digits, '-' or '_', at most 31 characters"


def is_bundle_name(name: str) -> bool:
    """agentmux's bundle-id grammar (bundle file stems, `--bundle`, namespaces)."""
    return bool(BUNDLE_NAME.fullmatch(name)) and name not in (".", "..")


def is_session_id(name: str) -> bool:
    """agentmux's session-id grammar (bundle member ids and `--session-name`)."""
    return bool(SESSION_ID.fullmatch(name))
