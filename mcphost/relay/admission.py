"""Bounds on the relay's delivery queue: what may wait for a target, per target, per sender, in all.

Owns: the count and the bytes of what is queued (an envelope or a raww text, counted from its
admission until its outcome is recorded), by target, by sender and relay-wide, and the refusal
of what would go over a bound. Pure bookkeeping: no clock, no I/O, no asyncio.

`send` answers `queued` at once and keeps each envelope until its target's readiness gate opens
(up to `readiness-timeout-ms`, 15 minutes by default), so without bounds a sender could make the
relay (the supervisor) hold any amount of memory for a target whose screen never settles. The
bounds are explicit constants (docs/relay.md, Delivery queue bounds):

- per sender at one target (its share of that target's queue: half of it, so one sender can
  never keep a peer's queue full for everyone else):
  `MAX_QUEUED_PER_SENDER_PER_TARGET` items and `MAX_QUEUED_BYTES_PER_SENDER_PER_TARGET` bytes;
- per target: `MAX_QUEUED_PER_TARGET` items and `MAX_QUEUED_BYTES_PER_TARGET` bytes;
- per sender (everything it has queued, to every target: a broadcast counts once per member):
  `MAX_QUEUED_PER_SENDER` items and `MAX_QUEUED_BYTES_PER_SENDER` bytes;
- relay-wide: `MAX_QUEUED_TOTAL` items and `MAX_QUEUED_BYTES_TOTAL` bytes.

An item's size is the UTF-8 length of the text the pane will get (the rendered envelope, or the
raww text). `check` takes every item of one request together and refuses the whole request when
any would go over (nothing of it is queued): code `runtime_delivery_queue_full` (agentmux's
code for an exhausted delivery admission quota), details `{target_session, sender_session,
scope: "share" | "target" | "sender" | "relay", component: "envelopes" | "bytes", limit, queued,
size}`.
Scopes are checked in that order, envelopes before bytes, so a refusal names one cause.

Must never: let the counters drift from what is queued (the caller releases exactly what it
admitted, once), or refuse an item that fits every bound.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from mcphost.agentmux.wire import RelayError

MAX_QUEUED_PER_TARGET = 64
MAX_QUEUED_BYTES_PER_TARGET = 4 << 20
MAX_QUEUED_PER_SENDER_PER_TARGET = MAX_QUEUED_PER_TARGET // 2
MAX_QUEUED_BYTES_PER_SENDER_PER_TARGET = MAX_QUEUED_BYTES_PER_TARGET // 2
MAX_QUEUED_PER_SENDER = 256
MAX_QUEUED_BYTES_PER_SENDER = 8 << 20
MAX_QUEUED_TOTAL = 1024
MAX_QUEUED_BYTES_TOTAL = 32 << 20

QUEUE_FULL = "runtime_delivery_queue_full"


@dataclass(frozen=True, slots=True)
class Limits:
    per_target: int = MAX_QUEUED_PER_TARGET
    bytes_per_target: int = MAX_QUEUED_BYTES_PER_TARGET
    per_sender: int = MAX_QUEUED_PER_SENDER
    bytes_per_sender: int = MAX_QUEUED_BYTES_PER_SENDER
    total: int = MAX_QUEUED_TOTAL
    bytes_total: int = MAX_QUEUED_BYTES_TOTAL
    share: int = MAX_QUEUED_PER_SENDER_PER_TARGET
    bytes_share: int = MAX_QUEUED_BYTES_PER_SENDER_PER_TARGET


def _share(sender: str, target: str) -> tuple[str, str]:
    """The ledger's key of what `sender` has queued for `target`."""
    return ("share", f"{sender}\0{target}")


class Ledger:
    """What is queued, by target and by sender; `check` before `admit`, `release` at the outcome."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._count: Counter[tuple[str, str]] = Counter()  # ("target" | "sender", id) -> items
        self._bytes: Counter[tuple[str, str]] = Counter()
        self.count = 0
        self.bytes = 0

    def queued(self, scope: str, principal_id: str, target: str | None = None) -> tuple[int, int]:
        """(items, bytes) queued for a target or by a sender (with `target`: by that sender
        for that target, its share)."""
        key = _share(principal_id, target) if target is not None else (scope, principal_id)
        return self._count[key], self._bytes[key]

    def check(self, sender: str, items: Sequence[tuple[str, int]]) -> None:
        """Raise `runtime_delivery_queue_full` unless every (target, size) of one request fits,
        counted together with what is queued and with the request's earlier items."""
        limits = self.limits
        count: Counter[tuple[str, str]] = Counter()
        size: Counter[tuple[str, str]] = Counter()
        for target, nbytes in items:
            share = _share(sender, target)
            for key in (share, ("target", target), ("sender", sender), ("relay", "")):
                count[key] += 1
                size[key] += nbytes
            bounds = (
                (share, limits.share, limits.bytes_share),
                (("target", target), limits.per_target, limits.bytes_per_target),
                (("sender", sender), limits.per_sender, limits.bytes_per_sender),
                (("relay", ""), limits.total, limits.bytes_total),
            )
            for key, max_count, max_bytes in bounds:
                queued = self._scope(key)
                for component, used, limit in (
                    ("envelopes", queued[0] + count[key], max_count),
                    ("bytes", queued[1] + size[key], max_bytes),
                ):
                    if used > limit:
                        raise _full(target, sender, key[0], component, limit, queued, nbytes)

    def admit(self, sender: str, target: str, nbytes: int) -> None:
        for key in (_share(sender, target), ("target", target), ("sender", sender)):
            self._count[key] += 1
            self._bytes[key] += nbytes
        self.count += 1
        self.bytes += nbytes

    def release(self, sender: str, target: str, nbytes: int) -> None:
        for key in (_share(sender, target), ("target", target), ("sender", sender)):
            self._count[key] -= 1
            self._bytes[key] -= nbytes
            if self._count[key] <= 0:
                del self._count[key]
                self._bytes.pop(key, None)
        self.count -= 1
        self.bytes -= nbytes

    def _scope(self, key: tuple[str, str]) -> tuple[int, int]:
        if key[0] == "relay":
            return self.count, self.bytes
        return self._count[key], self._bytes[key]


def _full(
    target: str,
    sender: str,
    scope: str,
    component: str,
    limit: int,
    queued: tuple[int, int],
    nbytes: int,
) -> RelayError:
    whose = {
        "share": "from this sender for this target (its share: half of the target's queue)",
        "target": "for this target",
        "sender": "from this sender",
        "relay": "in the relay",
    }[scope]
    return RelayError(
        QUEUE_FULL,
        f"the delivery queue {whose} is full ({component}: at most {limit}); nothing of this "
        "request was queued: wait until earlier messages are delivered, or send less, and try "
        "again",
        {
            "target_session": target,
            "sender_session": sender,
            "scope": scope,
            "component": component,
            "limit": limit,
            "queued": queued[0] if component == "envelopes" else queued[1],
            "size": nbytes,
        },
    )
