"""What `look` shows of an ACP member: the structured_entries_v1 buffer and its freshness (acp.md §5).

Owns: `EntryBuffer` (ingest of `session/update` payloads, the relay's own prompts, coalescing,
the merge of `tool_call`/`tool_call_update` by call id, orphans, the cap and its eviction, the
look window) and `freshness` (look's fresh/stale verdict, its stale reason code and its
`snapshot_source`), with look's ACP constants.

Entries, tagged by `kind`: `user {lines, origin}`, `agent {lines}`, `cognition {lines}`,
`update {update_kind, lines}` and `invocation {call_id, status, invocation, result}`, `status`
written `"Pending"`/`"Completed"` as agentmux writes it on the wire. A `tool_call` whose
`toolCallId` is missing is dropped (agentmux needs the id); every other kind of update is kept.

A `user` entry carries `origin` (our addition to agentmux's shape, a field added, none changed):
`"relay"` for the prompt the relay delivered, `"agent"` for a `user_message_chunk` the agent
sent. Without it an agent could forge, in `look`, a message "from alice@party" that no one sent
(SECURITY.md X11). What the entries' strings may hold (escape sequences) is made visible by look
(`relay/ops/look.py`), not here.

One rule differs from agentmux's on purpose: agentmux completes an invocation with the *first*
`tool_call_update` of its id, whatever it says, and turns the next ones into orphans. The real
adapters send more than one frame per call (Claude Code's ACP adapter: the `tool_call` twice, the
second with the input, then an update carrying only `_meta` before the one that says
`completed`), so that rule would show the call with the wrong result and an orphan beside it.
Here every `tool_call` and `tool_call_update` of a call id the buffer holds merges into that one
entry (later fields over earlier ones), and the call is `Completed` once an update's `status` is
`completed` or `failed`.

Must never: do IO, read a clock, or import the SDK: it is pure, fed synchronously in frame order
by `session.AcpSession` (the SDK runs each incoming message in its own task, so ingest happens
where the frame is read, never in a handler task).
"""

from __future__ import annotations

import copy
import json
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Literal

from mcphost.relay import reasons as R
from mcphost.relay.acp import states as S

ENTRIES_MAX = 1000
"""The buffer's cap, counted after coalescing; the oldest entries are evicted first."""
BYTES_MAX = 8 << 20
"""The buffer's bound in bytes (UTF-8 of its lines, JSON of its invocations and results): the
oldest entries are evicted first, and the oldest lines of an entry that alone exceeds it. What an
agent sends cannot grow the relay beyond this per member, however it coalesces."""
LINE_MAX = 64 << 10
"""One line at most (longer: cut, with `TRUNCATED` appended)."""
RAW_MAX = 256 << 10
"""An invocation's `invocation` or `result` at most, as JSON; larger: `{"truncated": true,
"bytes": N}` in its place."""
TRUNCATED = " [...]"
LOOK_DEFAULT_LINES = 50
"""`look`'s default `lines` for an ACP member (120 for tmux)."""
PRIME_WAIT_SECONDS = 0.75
"""How long `look` waits, polling every `PRIME_POLL_SECONDS`, while the member is initializing."""
PRIME_POLL_SECONDS = 0.025

ORIGIN_RELAY = "relay"
"""A `user` entry's `origin`: the relay's own prompt, written by the relay after a delivery."""
ORIGIN_AGENT = "agent"
"""A `user` entry's `origin`: a `user_message_chunk` the agent sent (live or replayed by
`session/load`): what the agent claims a user said, never proof that anyone did."""

PENDING = "Pending"
COMPLETED = "Completed"
TERMINAL = ("completed", "failed")  # the ACP tool call statuses that end a call
TURN_END = "turn_end"  # the relay's own update kind: how a turn ended, when not `end_turn`

_KIND_OF_CHUNK = {
    "user_message_chunk": "user",
    "agent_message_chunk": "agent",
    "agent_thought_chunk": "cognition",
}

Freshness = Literal["fresh", "stale"]
SnapshotSource = Literal["live_buffer", "none"]


@dataclass(eq=False)
class _Entry:
    kind: str
    lines: list[str] = field(default_factory=list)
    update_kind: str | None = None  # kind "update"
    from_relay: bool = False  # kind "user": the relay's own prompt, never merged
    call_id: str | None = None  # kind "invocation"
    status: str = PENDING
    invocation: Any = None
    result: Any = None
    size: int = 0  # bytes this entry counts against the buffer's BYTES_MAX

    def measure(self) -> int:
        self.size = sum(len(line.encode("utf-8", "surrogatepass")) for line in self.lines)
        self.size += _json_size(self.invocation) + _json_size(self.result)
        return self.size

    def joins(self, later: _Entry) -> bool:
        """Whether `later`, arriving right after this entry, merges its lines into it."""
        if later.kind != self.kind or later.kind == "invocation":
            return False
        if later.kind == "user":
            return not (self.from_relay or later.from_relay)
        return later.update_kind == self.update_kind

    def wire(self) -> dict[str, Any]:
        if self.kind == "invocation":
            return {
                "kind": "invocation",
                "call_id": self.call_id,
                "status": self.status,
                "invocation": copy.deepcopy(self.invocation),
                "result": copy.deepcopy(self.result),
            }
        out: dict[str, Any] = {"kind": self.kind}
        if self.kind == "update":
            out["update_kind"] = self.update_kind
        out["lines"] = list(self.lines)
        if self.kind == "user":
            out["origin"] = ORIGIN_RELAY if self.from_relay else ORIGIN_AGENT
        return out


def text_lines(value: Any) -> list[str]:
    """Every string field named `text` at any depth, split on `\\n`, a trailing `\\r` stripped,
    empty lines dropped (acp.md §5 "Lines")."""
    return [line for text in _texts(value) for line in _split(text)]


def _split(text: str) -> Iterator[str]:
    for line in text.split("\n"):
        line = line.removesuffix("\r")
        if len(line) > LINE_MAX:
            line = line[:LINE_MAX] + TRUNCATED
        if line:
            yield line


def _json_size(value: Any) -> int:
    if value is None:
        return 0
    return len(json.dumps(value, ensure_ascii=False, default=str).encode("utf-8", "replace"))


def _bounded(value: Any) -> Any:
    """`value` (an agent's raw update), or a marker in its place when its JSON exceeds RAW_MAX."""
    size = _json_size(value)
    return copy.deepcopy(value) if size <= RAW_MAX else {"truncated": True, "bytes": size}


def _texts(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "text" and isinstance(item, str):
                yield item
            else:
                yield from _texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)


class EntryBuffer:
    """One ACP member's look buffer: newest last, at most `cap` entries after coalescing."""

    def __init__(self, cap: int = ENTRIES_MAX, max_bytes: int = BYTES_MAX) -> None:
        if cap < 1 or max_bytes < 1:
            raise ValueError("cap and max_bytes must be at least 1")
        self.cap = cap
        self.max_bytes = max_bytes
        self.bytes = 0  # what the entries count against max_bytes
        self._entries: deque[_Entry] = deque()
        self._calls: dict[str, _Entry] = {}  # call id -> its invocation, while the buffer holds it

    @property
    def total(self) -> int:
        return len(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def ingest(self, update: Any) -> None:
        """One `session/update`'s `params.update`: an object or an array of them. An item
        without a string `sessionUpdate` is dropped."""
        for item in update if isinstance(update, list) else [update]:
            if isinstance(item, dict) and isinstance(item.get("sessionUpdate"), str):
                self._ingest_one(item)

    def add_prompt(self, text: str) -> None:
        """The relay's own prompt, after its write succeeded: a `user` entry never merged."""
        self._append(_Entry("user", list(_split(text)), from_relay=True))

    def add_turn_end(self, line: str) -> None:
        """How a turn ended when it did not simply end (`stopReason` other than `end_turn`, or
        an error): an `update` entry of kind `turn_end`, the relay's own, so a refusal that
        ends a turn without a message of the agent's (Codex's `cancelled`) shows in `look`."""
        self._append(_Entry("update", list(_split(line)), update_kind=TURN_END))

    def window(self, lines: int, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Entries `[start, end)`, oldest first, with `end = max(0, total - offset)` and
        `start = max(0, end - lines)`, and the whole buffer's `total`. Copies: the caller may
        keep or change them. `lines` and `offset` are the caller's to validate (look's)."""
        total = len(self._entries)
        end = max(0, total - offset)
        start = max(0, end - lines)
        return [entry.wire() for entry in islice(self._entries, start, end)], total

    def _ingest_one(self, update: dict[str, Any]) -> None:
        kind = update["sessionUpdate"]
        if kind in _KIND_OF_CHUNK:
            lines = text_lines(update)
            if lines:  # a chunk with no text adds nothing
                self._append(_Entry(_KIND_OF_CHUNK[kind], lines))
        elif kind == "tool_call":
            call_id = update.get("toolCallId")
            if isinstance(call_id, str):
                known = self._calls.get(call_id)
                if known is not None:  # the call again, with more of it (Claude Code sends two)
                    self._merge(known, "invocation", update)
                    return
                entry = _Entry("invocation", call_id=call_id, invocation=_bounded(update))
                self._append(entry)  # never merged, never the one evicted (the cap is >= 1)
                self._calls[call_id] = entry
        elif kind == "tool_call_update":
            self._complete(update)
        else:
            self._append(_Entry("update", text_lines(update), update_kind=kind))

    def _complete(self, update: dict[str, Any]) -> None:
        """A `tool_call_update`: merged into its call's `result` by call id; the call is
        `Completed` once an update says `completed` or `failed` (ACP's terminal statuses). An
        update of a call the buffer does not hold (never started, or evicted) is an orphan."""
        call_id = update.get("toolCallId")
        call_id = call_id if isinstance(call_id, str) else None
        known = self._calls.get(call_id) if call_id is not None else None
        if known is not None:
            self._merge(known, "result", update)
            if update.get("status") in TERMINAL:
                known.status = COMPLETED
            return
        orphan = _Entry("invocation", call_id=call_id, status=COMPLETED, invocation={})
        orphan.result = _bounded(update)
        self._append(orphan)

    def _merge(self, entry: _Entry, field_name: str, update: dict[str, Any]) -> None:
        """`update`'s fields over the entry's `invocation` or `result` (later frames add to and
        replace what earlier ones said), its size counted again."""
        current = getattr(entry, field_name)
        merged = {**current, **update} if isinstance(current, dict) else update
        setattr(entry, field_name, _bounded(merged))
        before = entry.size
        self.bytes += entry.measure() - before
        self._trim()

    def _append(self, entry: _Entry) -> None:
        entry.measure()
        if self._entries and self._entries[-1].joins(entry):
            last = self._entries[-1]
            last.lines.extend(entry.lines)
            last.size += entry.size
            self.bytes += entry.size
        else:
            self._entries.append(entry)
            self.bytes += entry.size
        self._trim()

    def _trim(self) -> None:
        """Evict the oldest entries over the cap or the byte bound; an entry that alone is over
        the bound loses its oldest lines (its invocation data is bounded already: RAW_MAX)."""
        while len(self._entries) > self.cap or (
            self.bytes > self.max_bytes and len(self._entries) > 1
        ):
            self._evict()
        if self.bytes > self.max_bytes and self._entries:
            only = self._entries[0]
            while only.lines and self.bytes > self.max_bytes:
                dropped = len(only.lines.pop(0).encode("utf-8", "surrogatepass"))
                only.size -= dropped
                self.bytes -= dropped

    def _evict(self) -> None:
        if self._entries:
            evicted = self._entries.popleft()
            self.bytes -= evicted.size
            if evicted.call_id is not None and self._calls.get(evicted.call_id) is evicted:
                del self._calls[evicted.call_id]  # its later update becomes an orphan


def freshness(
    state: str | None, total: int, prime_expired: bool
) -> tuple[Freshness, str | None, SnapshotSource]:
    """look's verdict on an ACP member (acp.md §5 "Freshness"): `(freshness, stale_reason_code
    or None when fresh, snapshot_source)`. `state` is the session's state (None: no session);
    `prime_expired` says look's prime wait (`PRIME_WAIT_SECONDS` while initializing) ran out."""
    source: SnapshotSource = "live_buffer" if total > 0 else "none"
    if state is None or state == S.UNAVAILABLE:
        return "stale", R.STALE_UNAVAILABLE, source
    if state == S.RECOVERING:
        return "stale", R.STALE_RECOVERING, source
    if total == 0:
        reason = R.STALE_PRIME_TIMEOUT if prime_expired else R.STALE_INITIALIZING
        return "stale", reason, source
    if S.ready(state):
        return "fresh", None, source
    return "stale", R.STALE_INITIALIZING, source
