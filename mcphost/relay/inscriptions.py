"""The relay's inscriptions (reference `agentmux-relay.md` §5): `relay.*` records in `relay.log`.

Owns: `RelayInscriptions`, the relay's sink for its requests and outcomes. Each record goes to
the supervisor's event log (`mcphost.events`, as before) and to `<root>/relay.log`, where `root`
is the relay's inscriptions root, `<relay state root>/inscriptions` by default: the root the
relay tools write their `mcp.log` files under, so the relay's records sit beside the MCP ones.
The file is written by agentmux's inscriptions writer (`mcphost.agentmux.inscriptions.Inscriptions`, the relay tools' too:
the record `{"timestamp", "pid", "event", "details"}`, one O_APPEND write per record,
directories 0700, the file 0600, opened lazily, never raising).

Must never: raise (a logging failure must not fail a request), or receive a PSK, a message body
or raww text: callers pass ids, lengths, counts and outcomes only.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcphost import events
from mcphost.agentmux.inscriptions import Inscriptions

RELAY_LOG = "relay.log"
INSCRIPTIONS_DIR = "inscriptions"

Inscribe = Callable[..., None]
"""`inscribe(event, level="info", **details)`: what the relay's modules call."""


def inscriptions_root(state_root: Path | str) -> Path:
    """The relay's default inscriptions root: `<state root>/inscriptions`."""
    return Path(state_root) / INSCRIPTIONS_DIR


def relay_log_path(root: Path | str) -> Path:
    return Path(root) / RELAY_LOG


class RelayInscriptions:
    """`relay.log` under `root` (None: the event log only), plus the event log."""

    def __init__(self, root: Path | str | None) -> None:
        self.path = relay_log_path(root) if root is not None else None
        self._file = Inscriptions(self.path)

    def __call__(self, event: str, level: str = "info", **details: Any) -> None:
        events.emit(event, level=level, **details)
        self._file.write(event, **details)

    def close(self) -> None:
        """Close the file; a later record opens it again."""
        self._file.close()
