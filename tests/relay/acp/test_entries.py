"""EntryBuffer and freshness (mcphost/relay/acp/entries.py): every rule of acp.md §5, pure."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcphost.relay.acp.entries import ENTRIES_MAX, EntryBuffer, freshness, text_lines
from tests.thorough import examples


def chunk(kind: str, text: str) -> dict[str, Any]:
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}}


def call(call_id: str, **fields: Any) -> dict[str, Any]:
    return {"sessionUpdate": "tool_call", "toolCallId": call_id, "title": "t", **fields}


def done(call_id: str, status: str = "completed") -> dict[str, Any]:
    return {"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": status}


def entries(buffer: EntryBuffer) -> list[dict[str, Any]]:
    return buffer.window(buffer.total or 1)[0]


def test_chunks_map_to_kinds_and_their_text_to_lines() -> None:
    buffer = EntryBuffer()
    buffer.ingest(chunk("user_message_chunk", "hi"))
    buffer.ingest(chunk("agent_message_chunk", "a\r\n\nb\n"))
    buffer.ingest(chunk("agent_thought_chunk", "hmm"))
    assert entries(buffer) == [
        {"kind": "user", "lines": ["hi"], "origin": "agent"},
        {"kind": "agent", "lines": ["a", "b"]},
        {"kind": "cognition", "lines": ["hmm"]},
    ]


def test_lines_take_every_text_field_at_any_depth() -> None:
    nested = {"a": {"text": "one\r"}, "b": [{"text": "two\nthree"}, {"text": 5}], "text": ""}
    assert text_lines(nested) == ["one", "two", "three"]
    assert text_lines({"texts": "no", "content": [{"type": "image"}]}) == []


def test_a_chunk_without_text_adds_nothing() -> None:
    buffer = EntryBuffer()
    buffer.ingest({"sessionUpdate": "agent_message_chunk", "content": {"type": "image"}})
    buffer.ingest(chunk("agent_thought_chunk", "\n\r\n"))
    assert buffer.total == 0


def test_adjacent_same_kind_entries_coalesce() -> None:
    buffer = EntryBuffer()
    for kind, text in [
        ("agent_message_chunk", "a1"),
        ("agent_message_chunk", "a2"),
        ("agent_thought_chunk", "c1"),
        ("agent_thought_chunk", "c2"),
        ("agent_message_chunk", "a3"),
        ("user_message_chunk", "u1"),
        ("user_message_chunk", "u2"),
    ]:
        buffer.ingest(chunk(kind, text))
    assert entries(buffer) == [
        {"kind": "agent", "lines": ["a1", "a2"]},
        {"kind": "cognition", "lines": ["c1", "c2"]},
        {"kind": "agent", "lines": ["a3"]},
        {"kind": "user", "lines": ["u1", "u2"], "origin": "agent"},
    ]


def test_updates_coalesce_only_with_the_same_update_kind_and_are_never_dropped() -> None:
    buffer = EntryBuffer()
    buffer.ingest({"sessionUpdate": "plan", "entries": [{"content": "x"}]})
    buffer.ingest({"sessionUpdate": "plan", "entries": [], "note": {"text": "p"}})
    buffer.ingest({"sessionUpdate": "available_commands_update", "availableCommands": []})
    buffer.ingest({"sessionUpdate": "some_future_kind", "text": "f"})
    assert entries(buffer) == [
        {"kind": "update", "update_kind": "plan", "lines": ["p"]},
        {"kind": "update", "update_kind": "available_commands_update", "lines": []},
        {"kind": "update", "update_kind": "some_future_kind", "lines": ["f"]},
    ]


def test_the_relays_prompt_is_a_user_entry_never_merged() -> None:
    buffer = EntryBuffer()
    buffer.ingest(chunk("user_message_chunk", "from the agent"))
    buffer.add_prompt("first\r\nprompt")
    buffer.add_prompt("second")
    buffer.ingest(chunk("user_message_chunk", "replayed"))
    assert entries(buffer) == [
        {"kind": "user", "lines": ["from the agent"], "origin": "agent"},
        {"kind": "user", "lines": ["first", "prompt"], "origin": "relay"},
        {"kind": "user", "lines": ["second"], "origin": "relay"},
        {"kind": "user", "lines": ["replayed"], "origin": "agent"},
    ]


def test_an_update_may_be_an_array_and_items_without_session_update_are_dropped() -> None:
    buffer = EntryBuffer()
    buffer.ingest([chunk("agent_message_chunk", "a"), {"content": {"text": "x"}}, "junk", None])
    buffer.ingest({"sessionUpdate": 3, "text": "y"})
    buffer.ingest(None)
    assert entries(buffer) == [{"kind": "agent", "lines": ["a"]}]


def test_updates_merge_into_the_invocation_by_call_id_until_a_terminal_status() -> None:
    buffer = EntryBuffer()
    buffer.ingest(call("c1"))
    buffer.ingest(chunk("agent_message_chunk", "working"))
    assert entries(buffer)[0] == {
        "kind": "invocation",
        "call_id": "c1",
        "status": "Pending",
        "invocation": call("c1"),
        "result": None,
    }
    buffer.ingest(done("c1", status="in_progress"))  # not terminal: still pending, merged
    first, agent = entries(buffer)
    assert first["status"] == "Pending" and first["result"] == done("c1", "in_progress")
    buffer.ingest({**done("c1", "completed"), "rawOutput": "ok"})
    first, agent = entries(buffer)
    assert first["status"] == "Completed"
    assert first["result"] == {**done("c1", "completed"), "rawOutput": "ok"}
    assert agent == {"kind": "agent", "lines": ["working"]}


def test_claude_codes_repeated_frames_make_one_completed_invocation() -> None:
    """Claude Code's ACP adapter (0.16.2): the tool call twice (the second with its input),
    an update with only `_meta`, then the one that completes it."""
    buffer = EntryBuffer()
    start = {"sessionUpdate": "tool_call", "toolCallId": "t", "rawInput": {}, "title": "Bash"}
    buffer.ingest(start)
    buffer.ingest({**start, "rawInput": {"command": "touch x"}, "title": "touch x"})
    buffer.ingest({"sessionUpdate": "tool_call_update", "toolCallId": "t", "_meta": {"k": 1}})
    buffer.ingest(done("t", "completed"))
    [entry] = entries(buffer)
    assert entry["status"] == "Completed"
    assert entry["invocation"]["rawInput"] == {"command": "touch x"}
    assert entry["result"]["status"] == "completed" and entry["result"]["_meta"] == {"k": 1}


def test_a_tool_call_update_of_an_unknown_call_appends_an_orphan() -> None:
    buffer = EntryBuffer()
    buffer.ingest(call("c1"))
    buffer.ingest(done("c1"))
    buffer.ingest(done("c1", "failed"))  # a later update for c1 merges into it
    buffer.ingest(done("never-started"))
    buffer.ingest({"sessionUpdate": "tool_call_update", "status": "completed"})  # no id
    first, *orphans = entries(buffer)
    assert first["status"] == "Completed" and first["result"] == done("c1", "failed")
    assert [(o["call_id"], o["status"], o["invocation"]) for o in orphans] == [
        ("never-started", "Completed", {}),
        (None, "Completed", {}),
    ]


def test_invocations_never_merge_and_a_tool_call_without_an_id_is_dropped() -> None:
    buffer = EntryBuffer()
    buffer.ingest(call("c1"))
    buffer.ingest(call("c2"))
    buffer.ingest({"sessionUpdate": "tool_call", "title": "no id"})
    assert [e["call_id"] for e in entries(buffer)] == ["c1", "c2"]


def test_the_cap_counts_after_coalescing_and_evicts_the_oldest() -> None:
    assert EntryBuffer().cap == ENTRIES_MAX == 1000
    buffer = EntryBuffer(cap=3)
    for n in range(10):
        buffer.ingest(chunk("agent_message_chunk", f"a{n}"))  # one entry, coalesced
    assert buffer.total == 1
    buffer.ingest(chunk("agent_thought_chunk", "c"))
    buffer.add_prompt("p1")
    buffer.add_prompt("p2")
    assert buffer.total == 3
    assert [e["kind"] for e in entries(buffer)] == ["cognition", "user", "user"]
    with pytest.raises(ValueError):
        EntryBuffer(cap=0)


def test_eviction_shifts_a_pending_invocation_which_still_completes_in_place() -> None:
    buffer = EntryBuffer(cap=3)
    buffer.add_prompt("old")
    buffer.ingest(call("c1"))
    buffer.add_prompt("p1")
    buffer.add_prompt("p2")  # evicts "old": c1 moves from position 1 to 0
    buffer.ingest(done("c1"))
    window, total = buffer.window(3)
    assert total == 3
    assert window[0]["call_id"] == "c1" and window[0]["status"] == "Completed"
    assert [e["kind"] for e in window] == ["invocation", "user", "user"]


def test_an_evicted_pending_invocation_turns_its_update_into_an_orphan() -> None:
    buffer = EntryBuffer(cap=2)
    buffer.ingest(call("c1"))
    buffer.add_prompt("p1")
    buffer.add_prompt("p2")  # evicts c1 while pending
    buffer.ingest(done("c1"))
    window, _ = buffer.window(2)
    assert window[0] == {"kind": "user", "lines": ["p2"], "origin": "relay"}
    assert window[1]["invocation"] == {} and window[1]["result"] == done("c1")


def test_window_takes_the_newest_lines_before_offset() -> None:
    buffer = EntryBuffer()
    for n in range(5):
        buffer.add_prompt(str(n))

    def texts(lines: int, offset: int) -> tuple[list[str], int]:
        window, total = buffer.window(lines, offset)
        return [e["lines"][0] for e in window], total

    assert texts(2, 0) == (["3", "4"], 5)
    assert texts(2, 1) == (["2", "3"], 5)
    assert texts(10, 3) == (["0", "1"], 5)
    assert texts(3, 5) == ([], 5)
    assert texts(3, 50) == ([], 5)
    assert EntryBuffer().window(50) == ([], 0)


def test_window_returns_copies() -> None:
    buffer = EntryBuffer()
    buffer.ingest(call("c1", rawInput={"cmd": "ls"}))
    window, _ = buffer.window(1)
    window[0]["invocation"]["rawInput"]["cmd"] = "rm"
    window[0]["status"] = "x"
    again, _ = buffer.window(1)
    assert again[0]["invocation"]["rawInput"] == {"cmd": "ls"} and again[0]["status"] == "Pending"


@pytest.mark.parametrize(
    ("state", "total", "expired", "expected"),
    [
        (None, 3, False, ("stale", "acp_worker_unavailable", "live_buffer")),
        ("unavailable", 0, True, ("stale", "acp_worker_unavailable", "none")),
        ("recovering", 2, False, ("stale", "acp_worker_recovering", "live_buffer")),
        ("available", 0, False, ("stale", "acp_worker_initializing", "none")),
        ("busy", 0, True, ("stale", "acp_snapshot_prime_timeout", "none")),
        ("initializing", 0, True, ("stale", "acp_snapshot_prime_timeout", "none")),
        ("initializing", 4, False, ("stale", "acp_worker_initializing", "live_buffer")),
        ("available", 1, True, ("fresh", None, "live_buffer")),
        ("busy", 7, False, ("fresh", None, "live_buffer")),
    ],
)
def test_freshness(state: str | None, total: int, expired: bool, expected: tuple[Any, ...]) -> None:
    assert freshness(state, total, expired) == expected


KINDS = ["user_message_chunk", "agent_message_chunk", "agent_thought_chunk", "plan"]
steps = st.one_of(
    st.tuples(st.sampled_from(KINDS), st.sampled_from(["", "x", "y\nz"])),
    st.tuples(st.sampled_from(["tool_call", "tool_call_update"]), st.sampled_from(["c1", "c2"])),
    st.tuples(st.just("prompt"), st.just("p")),
)


@examples(full=2000, quick=200)
@given(
    st.lists(steps, max_size=60),
    st.integers(1, 8),
    st.integers(1, 10),
    st.integers(0, 12),
)
def test_buffer_properties(steps: list[tuple[str, str]], cap: int, lines: int, offset: int) -> None:
    """Bounded by the cap; no two adjacent entries that should have merged; every window is the
    matching slice of the whole buffer."""
    buffer = EntryBuffer(cap=cap)
    for kind, arg in steps:
        if kind == "prompt":
            buffer.add_prompt(arg)
        elif kind.startswith("tool_call"):
            buffer.ingest({"sessionUpdate": kind, "toolCallId": arg})
        else:
            buffer.ingest(chunk(kind, arg))
    whole, total = buffer.window(cap)
    assert total == len(whole) <= cap
    for earlier, later in pairwise(whole):
        mergeable = ("agent", "cognition", "update")
        if earlier["kind"] == later["kind"] and earlier["kind"] in mergeable:
            assert earlier.get("update_kind") != later.get("update_kind")  # would have merged
    end = max(0, total - offset)
    assert buffer.window(lines, offset) == (whole[max(0, end - lines) : end], total)


# -- the byte bound: what a hostile agent sends cannot grow the buffer past it ----------------


def _chunk(text: str, kind: str = "agent_message_chunk") -> dict[str, object]:
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}}


def test_coalesced_chunks_stay_within_the_byte_bound() -> None:
    buffer = EntryBuffer(max_bytes=64 << 10)
    for _ in range(2000):  # one ever-growing agent entry, merged chunk after chunk
        buffer.ingest(_chunk("x" * 1000 + "\n"))
    assert buffer.bytes <= 64 << 10
    entries, total = buffer.window(10)
    assert total == 1 and entries[0]["kind"] == "agent"
    assert sum(len(line) for line in entries[0]["lines"]) == buffer.bytes


def test_many_entries_are_evicted_oldest_first_by_bytes() -> None:
    buffer = EntryBuffer(max_bytes=10_000)
    for index in range(100):  # alternate kinds, so nothing merges
        kind = "agent_message_chunk" if index % 2 else "agent_thought_chunk"
        buffer.ingest(_chunk(f"{index:03d}" + "y" * 997, kind))
    entries, total = buffer.window(1000)
    assert buffer.bytes <= 10_000 and total == len(entries) < 100
    assert entries[-1]["lines"][0].startswith("099")  # the newest stays


def test_a_huge_line_and_a_huge_raw_update_are_cut() -> None:
    from mcphost.relay.acp.entries import LINE_MAX, RAW_MAX, TRUNCATED

    buffer = EntryBuffer()
    buffer.ingest(_chunk("z" * (LINE_MAX + 10)))
    [entry], _ = buffer.window(1)
    assert entry["lines"] == ["z" * LINE_MAX + TRUNCATED]
    huge = {"sessionUpdate": "tool_call", "toolCallId": "c1", "rawInput": "w" * RAW_MAX}
    buffer.ingest(huge)
    buffer.ingest({"sessionUpdate": "tool_call_update", "toolCallId": "c1", "status": "completed"})
    entry = buffer.window(1)[0][0]
    assert entry["invocation"]["truncated"] is True and entry["invocation"]["bytes"] > RAW_MAX
    assert entry["status"] == "Completed" and entry["result"]["status"] == "completed"


def test_a_turn_that_did_not_simply_end_is_an_update_entry_of_its_own() -> None:
    buffer = EntryBuffer()
    buffer.ingest(chunk("agent_message_chunk", "asking"))
    buffer.add_turn_end("stopReason: cancelled")
    assert entries(buffer)[-1] == {
        "kind": "update",
        "update_kind": "turn_end",
        "lines": ["stopReason: cancelled"],
    }
