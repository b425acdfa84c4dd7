"""The member port (mcphost/relay/members): a kind registered with one line reaches every seam.

A `notebook` kind stands in for a kind that is not tmux (an ACP member's shape: its own readiness
state, a structured look with offsets and its own default window, one unit per delivered batch,
and a choices queue). It is registered for the `acp` transport of the `mixed` bundle of the real
configuration tree (mcphost/testing/realrelay.py) with `monkeypatch.setitem(KINDS, ...)`, exactly
the one registration line a new kind needs; the relay under test is the real `RelayBehaviour`.
The tmux kind's own behaviour is test_behaviour.py's.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mcphost.agentmux.bundlefile import Bundle, Session
from mcphost.agentmux.wire import RelayError, Request, parse_principal
from mcphost.relay import members
from mcphost.relay.behaviour import MemberHealth, RelayBehaviour
from mcphost.relay.members.port import (
    Batch,
    ChoiceRecord,
    ChoicesFactory,
    MemberContext,
    Readiness,
    Snapshot,
)
from mcphost.relay.members.tmux import TmuxEndpoint
from mcphost.relay.outcome import Delivery
from mcphost.testing.realrelay import config_tree

pytestmark = pytest.mark.anyio


@dataclass
class Notebook:
    """The endpoint a host hands over for a notebook member: what it was given, in order."""

    state: str = "available"
    entries: list[dict[str, Any]] = field(default_factory=list)
    turns: list[tuple[str, ...]] = field(default_factory=list)


class Queue:
    """A per-bundle choices queue with the port's three methods."""

    def __init__(
        self, pending_max: int, on_requested: ChoiceRecord, on_resolved: ChoiceRecord
    ) -> None:
        self.pending_max = pending_max
        self.items: dict[str, dict[str, Any]] = {}

    def pending(self) -> list[dict[str, Any]]:
        return list(self.items.values())

    def decide(
        self, choice_request_id: str, outcome: str, option_id: str | None, decided_by: str
    ) -> dict[str, Any]:
        if self.items.pop(choice_request_id, None) is None:
            raise RelayError("runtime_choices_request_already_resolved", "not pending")
        return {"choice_request_id": choice_request_id, "outcome": outcome,
                "decided_by": decided_by, "reason_code": None}  # fmt: skip

    def invalidate(self, target_session: str, reason_code: str, reason: str) -> None:
        self.items = {k: v for k, v in self.items.items() if v["target_session"] != target_session}


@dataclass
class NotebookMember:
    book: Notebook
    context: MemberContext
    transport: str = "acp"

    def readiness(self) -> Readiness:
        ready = self.book.state in ("available", "busy")
        return Readiness(
            ready, self.book.state, None if ready else "runtime_acp_worker_unavailable"
        )

    async def deliver(self, take: Callable[[], Batch]) -> Delivery:
        batch = take()
        self.book.turns.append(batch.message_ids)
        self.book.entries.append({"kind": "user", "lines": [batch.text]})
        return Delivery("delivered")

    async def write_raw(self, text: str, no_enter: bool) -> Delivery:
        self.book.entries.append({"kind": "user", "lines": [text]})
        return Delivery("delivered")

    async def look(self, lines: int, offset: int) -> Snapshot:
        total = len(self.book.entries)
        end = max(0, total - offset)
        window = self.book.entries[max(0, end - lines) : end]
        fields = {"snapshot_format": "structured_entries_v1", "snapshot_entries": window,
                  "entries_total": total, "returned_entries_count": len(window)}  # fmt: skip
        return Snapshot(fields, len(window))


class NotebookKind:
    transport = "acp"
    default_look_lines = 2
    supports_offset = True
    choices_queue: ChoicesFactory | None = Queue

    def accepts(self, bundle: Bundle, session: Session) -> bool:
        return session.transport == self.transport

    def bind(
        self, bundle: Bundle, session: Session, endpoint: object, context: MemberContext
    ) -> NotebookMember | None:
        return NotebookMember(endpoint, context) if isinstance(endpoint, Notebook) else None


@dataclass
class Host:
    """A BundleHost of the `mixed` bundle: its notebook member only (the tmux lead is down)."""

    book: Notebook = field(default_factory=Notebook)

    def hosted(self, bundle: Bundle) -> bool:
        return True

    async def up(self, bundle: Bundle) -> None: ...

    async def down(self, bundle: Bundle) -> None: ...

    def member_endpoint(self, bundle: Bundle, session_id: str) -> Notebook | TmuxEndpoint | None:
        return self.book if session_id == "agent" else None

    def member_state(self, bundle: Bundle, session_id: str) -> tuple[bool, MemberHealth]:
        return session_id == "agent", MemberHealth()


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rbm-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class World:
    relay: RelayBehaviour
    host: Host

    async def call(self, operation: str, **body: Any) -> dict[str, Any]:
        request = Request("r1", None, operation, {"operation": operation, **body})
        return await self.relay.handle(parse_principal("lead@mixed"), request)


@pytest.fixture
async def world(root: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    monkeypatch.setitem(members.KINDS, "acp", NotebookKind())
    config, state = config_tree(root)
    host = Host()
    relay = RelayBehaviour([config], state, host, environ={})
    try:
        yield World(relay, host)
    finally:
        await relay.aclose()


async def test_list_reports_the_kinds_readiness_and_state(world: World) -> None:
    listed = (await world.call("list"))["bundle"]
    assert listed["principals"] == [
        {"id": "lead@mixed", "transport": "tmux", "ready": False},
        {"id": "agent@mixed", "transport": "acp", "ready": True, "state": "available"},
        {"id": "panel@mixed", "transport": "ui", "ready": False},
        {"id": "term@mixed", "transport": "pty", "ready": False},
    ]
    world.host.book.state = "unavailable"
    listed = (await world.call("list"))["bundle"]
    assert listed["principals"][1] == {
        "id": "agent@mixed", "transport": "acp", "ready": False, "state": "unavailable",
        "state_reason_code": "runtime_acp_worker_unavailable",
    }  # fmt: skip


async def test_send_raww_and_look_go_through_the_kind(world: World) -> None:
    sent = await world.call("send", message="one", targets=["agent@mixed"])
    assert sent["results"][0]["outcome"] == "queued"
    raww = await world.call("raww", target_session="agent@mixed", text="verbatim")
    assert raww["transport"] == "acp"
    await world.relay.drain()
    book = world.host.book
    assert book.turns == [(sent["results"][0]["message_id"],)]
    assert "one" in book.entries[0]["lines"][0]
    assert book.entries[1] == {"kind": "user", "lines": ["verbatim"]}
    assert world.relay.outcomes[raww["message_id"]]["outcome"] == "delivered"

    look = await world.call("look", target_session="agent@mixed")  # the kind's default: 2
    assert look["snapshot_format"] == "structured_entries_v1"
    assert look["snapshot_entries"] == book.entries[-2:]
    assert look["entries_total"] == 2
    older = await world.call("look", target_session="agent@mixed", lines=1, offset=1)
    assert older["snapshot_entries"] == book.entries[:1]
    # a tmux target still refuses an offset, before anything is read
    with pytest.raises(RelayError) as caught:
        await world.call("look", target_session="lead@mixed", offset=1)
    assert caught.value.code == "validation_offset_unsupported"


async def test_look_neutralises_every_string_of_any_kinds_snapshot(world: World) -> None:
    """look.py makes whatever a kind returns visible, keys and nested raw data included, with
    the one `neutralise` of send (SECURITY.md X11): a kind cannot forget it."""
    book = world.host.book
    book.entries.append(
        {"kind": "invocation", "raw": {"k\x1b": ["v\x1b[2J", 1, None]}, "lines": ["\x9b\x07"]}
    )
    book.entries.append({"kind": "user", "lines": ["a\x1b[201~b\tc"]})
    look = await world.call("look", target_session="agent@mixed")
    assert look["snapshot_entries"] == [
        {"kind": "invocation", "raw": {"k^[": ["v^[[2J", 1, None]}, "lines": ["<U+009B>^G"]},
        {"kind": "user", "lines": ["a^[[201~b\tc"]},
    ]
    assert book.entries[-1]["lines"] == ["a\x1b[201~b\tc"]  # the member's own copy unchanged


async def test_choices_run_against_the_bundles_queue(world: World) -> None:
    assert (await world.call("choices_list"))["pending_requests"] == []
    queue = world.relay.choices["mixed"]
    assert isinstance(queue, Queue)
    queue.items["c-1"] = {"choice_request_id": "c-1", "target_session": "agent@mixed"}
    listed = await world.call("choices_list")
    assert listed["pending_requests"] == [queue.items["c-1"]]
    picked = await world.call(
        "choices_pick", choice_request_id="c-1", outcome="selected", option_id="allow"
    )
    assert picked == {
        "kind": "choices_pick", "schema_version": "1", "status": "resolved",
        "choice_request_id": "c-1", "outcome": "selected", "decided_by": "lead@mixed",
    }  # fmt: skip
    with pytest.raises(RelayError) as caught:
        await world.call("choices_pick", choice_request_id="c-1", outcome="cancelled")
    assert caught.value.code == "runtime_choices_request_already_resolved"
