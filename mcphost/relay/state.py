"""The relay's shared state: the one object every operation is handed (relay/ops).

Owns: `RelayState`: the configuration (the roots of the file layers, read afresh for every
request; the host's in-memory bundle layer `bundles`; `environ` for relay.toml's precedence),
the host (`BundleHost`) and its socket-trust hook, the principal store
(`<state>/identity/principals.json`) and the lock serializing its changes (`admin`), the
inscriptions, the live connections (shared with the server), the readiness gate's timing
(`quiet_ms`, `poll_ms`), the per-target delivery workers, the queue bounds' ledger, the recent
outcomes, the bundles' choices queues, and whether the relay is closed; what a worker queues
(`Item`: an envelope or a raww, with what the queue bounds count) and the worker (`Worker`).

What is done with it is elsewhere: resolution in `requester.py`, delivery in `delivery.py`, each
operation in its `ops/` module; each is a function of this state, so the state is declared once.

Must never: act (no I/O of its own), or import the operations.
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcphost.relay import admission
from mcphost.relay.connections import Connections
from mcphost.relay.hosting import BundleHost, Bundles, SocketTrust
from mcphost.relay.inscriptions import RelayInscriptions
from mcphost.relay.members.port import Choices
from mcphost.relay.principals import PrincipalStore

DEFAULT_QUIET_MS = 750
DEFAULT_POLL_MS = 50


@dataclass(slots=True)
class Item:
    message_id: str
    kind: str  # "envelope" | "raww"
    text: str = field(repr=False)
    sender: str
    target: str
    no_enter: bool = False
    size: int = 0  # UTF-8 bytes of `text`, what the queue bounds count (admission.py)
    admitted: bool = False  # counted in the ledger until its outcome is recorded
    receipt: bool = False  # a terminal-outcome receipt: its own outcome gets none


@dataclass(slots=True)
class Worker:
    bundle_id: str
    session_id: str
    queue: deque[Item] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None


@dataclass(eq=False)
class RelayState:
    """The relay's state (module doc); built by `RelayBehaviour`, handed to every operation."""

    roots: tuple[Path, ...]
    state_root: Path
    host: BundleHost
    store: PrincipalStore
    inscribe: RelayInscriptions
    connections: Connections
    socket_trust: SocketTrust | None = None
    bundles: Bundles | None = None
    environ: dict[str, str] | None = None
    quiet_ms: int = DEFAULT_QUIET_MS
    poll_ms: int = DEFAULT_POLL_MS
    admin: asyncio.Lock = field(default_factory=asyncio.Lock)
    workers: dict[tuple[str, str], Worker] = field(default_factory=dict)
    queue_bounds: admission.Ledger = field(default_factory=admission.Ledger)
    outcomes: OrderedDict[str, dict[str, Any]] = field(default_factory=OrderedDict)
    outcome_counts: Counter[str] = field(default_factory=Counter)  # outcome -> deliveries ever
    choices: dict[str, Choices] = field(default_factory=dict)  # bundle id -> its queue
    closed: bool = False
