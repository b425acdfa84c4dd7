"""The member port: what the relay asks of one bundle member, whatever its transport.

Owns: the interface every kind of member implements, and the small values that cross it:
- `MemberKind`: one transport's kind (registered in `members.KINDS` by its transport name):
  which configured members it can host (`accepts`), its `look` defaults (`default_look_lines`,
  `supports_offset`), the per-bundle choices queue it needs, if any (`choices_queue`), and `bind`:
  a member of it over the endpoint its host hands over.
- `Member`: one bound member: `readiness()`, `deliver(take)` (one unit of envelopes, one
  outcome), `write_raw(text, no_enter)` (raww), `look(lines, offset)`.
- `Readiness`, `Batch`, `Snapshot`, `MemberContext` (what the relay lends a member it binds: the
  readiness gate's timing and the bundle's choices queue), `Choices` (that queue, as the relay's
  `choices_list` / `choices_pick` and shutdown use it), `ChoiceRecord` / `ChoicesFactory` (the
  relay's hooks a queue hands its records to; a kind's factory of its queue), and the refusals a member raises
  (`unavailable`, `session_type_not_implemented`).

How a member is reached: the relay asks its host `BundleHost.member_endpoint(bundle,
session_id)` (hosting.py) for an opaque endpoint (None while the member is not hosted), looks the
member's transport up in `members.KINDS` and `bind`s the kind to it (`members.member`). What an
endpoint is, is between a kind and the host: the tmux kind reads a `TmuxEndpoint(server,
session)`; another kind reads its own (an ACP kind: its client session). A kind returns None from
`bind` for an endpoint that is not its own.

Must never: import a member kind, the relay's operations or `mcphost.supervisor`, or do I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from mcphost.agentmux.bundlefile import Bundle, Session
from mcphost.agentmux.wire import RelayError
from mcphost.relay.outcome import Delivery
from mcphost.relay.reasons import TRANSPORT_UNAVAILABLE


@dataclass(frozen=True, slots=True)
class Readiness:
    """What a bound member says of itself for `list` (§1.3): `ready` (it takes deliveries now or
    once its current work ends: an ACP member that is busy is ready), and, when the kind has one,
    its own `state` (an ACP member: initializing | available | busy | recovering | unavailable)
    and a `reason_code` for it. The relay reports a member ready only when its host does too."""

    ready: bool
    state: str | None = None
    reason_code: str | None = None


@dataclass(frozen=True, slots=True)
class Batch:
    """One unit of delivery: the envelopes taken from the head of a target's queue, as one text
    (rendered, joined and neutralised: `envelope.join_batch`, `envelope.neutralise`), with their
    message ids and senders in queue order (the head's first)."""

    text: str = field(repr=False)
    message_ids: tuple[str, ...]
    senders: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A member's `look` answer: the response fields beyond the common ones (`snapshot_format`
    and what that format carries: tmux `snapshot_lines`; ACP `snapshot_entries`,
    `entries_total`, `returned_entries_count`, `freshness`, ...), and how many lines or entries
    it returned (the relay's `relay.look.response` record)."""

    fields: dict[str, Any]
    count: int


class Choices(Protocol):
    """A bundle's queue of pending permission choices, as the relay uses it (the ACP kind's
    `ChoicesQueue` is one): `pending()` the `choices.requested` records sorted by sequence;
    `decide(...)` the `choices.resolved` record, or a RelayError (not pending, option not
    offered); `invalidate(target, reason_code, reason)` resolves that target's pending choices
    cancelled (the relay's shutdown; a kind's respawn)."""

    def pending(self) -> list[dict[str, Any]]: ...

    def decide(
        self, choice_request_id: str, outcome: str, option_id: str | None, decided_by: str
    ) -> dict[str, Any]: ...

    def invalidate(self, target_session: str, reason_code: str, reason: str) -> object: ...


@dataclass(frozen=True, slots=True)
class MemberContext:
    """What the relay lends a member it binds: the readiness gate's quiet window and poll
    interval (a tmux member's gate), and the bundle's choices queue (None when no member kind of
    the bundle keeps one): an ACP member installs it as its session's chooser."""

    quiet_ms: int
    poll_ms: int
    choices: Choices | None = None


class Member(Protocol):
    """One bundle member bound to its endpoint (a kind's `bind`).

    - `transport`: its kind's transport name (the `raww` response's `transport`).
    - `readiness()`: cheap and synchronous (called for every member on each `list`).
    - `deliver(take)`: wait until the member takes input, then call `take()` exactly once (also
      on failure: the items taken share the outcome) and deliver that batch as one unit (one
      paste and submit; one ACP turn); the outcome (outcome.Delivery), never an exception for
      a failure of the member's own.
    - `write_raw(text, no_enter)`: raww, ungated; text over 32 KiB was refused at admission.
    - `look(lines, offset)`: the window (lines already defaulted to the kind's
      `default_look_lines`; offset 0 unless the kind `supports_offset`); raises RelayError
      (`transport_unavailable`: `unavailable`) when the member cannot be read now.
    """

    @property
    def transport(self) -> str: ...

    def readiness(self) -> Readiness: ...

    async def deliver(self, take: Callable[[], Batch]) -> Delivery: ...

    async def write_raw(self, text: str, no_enter: bool) -> Delivery: ...

    async def look(self, lines: int, offset: int) -> Snapshot: ...


ChoiceRecord = Callable[[dict[str, Any]], None]
"""What a choices queue hands each `choices.requested` / `choices.resolved` record to."""
ChoicesFactory = Callable[[int, ChoiceRecord, ChoiceRecord], Choices]
"""A kind's `choices_queue`: `(pending_max, on_requested, on_resolved) -> the queue`."""


class MemberKind(Protocol):
    """One transport's kind of member (module doc). `accepts(bundle, session)`: whether the
    configured member is one this kind hosts (its coder has this kind's section); `bind(...)` a
    member over the host's endpoint, None when the endpoint is not this kind's;
    `choices_queue`: the factory of a bundle's choices queue when members of this kind raise
    choices, else None; called with relay.toml's `[choices] pending-max` and the relay's two
    hooks, `on_requested(record)` and `on_resolved(record)` (the relay inscribes them), which
    the queue calls with each `choices.requested` record it queues and each `choices.resolved`
    record of a resolution."""

    @property
    def transport(self) -> str: ...

    @property
    def default_look_lines(self) -> int: ...

    @property
    def supports_offset(self) -> bool: ...

    def accepts(self, bundle: Bundle, session: Session) -> bool: ...

    @property
    def choices_queue(self) -> ChoicesFactory | None: ...

    def bind(
        self, bundle: Bundle, session: Session, endpoint: object, context: MemberContext
    ) -> Member | None: ...


def unavailable(target: str, reason: str) -> RelayError:
    """The refusal of an operation on a member that cannot be reached now."""
    return RelayError(
        TRANSPORT_UNAVAILABLE,
        f"target session is unavailable: {reason}",
        {"target_session": target},
    )


def session_type_not_implemented(bundle: Bundle, session: Session, hosted: str) -> RelayError:
    """The refusal of a member no registered kind hosts; `hosted` names the kinds that are."""
    return RelayError(
        "runtime_session_type_not_implemented",
        f"session transport {session.transport!r} is not implemented by this relay "
        f"({hosted} sessions only)",
        {"target_session": session.principal_id(bundle.id), "transport": session.transport},
    )
