"""The stdio framing without a process (mcphost/mcpserve/stdio.py, on the shared core of
connection.py): lines fed in chunks, the line cap, the id of an over-cap line, and what never
becomes a message. The SDK server behind it is test_adapter.py's."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mcphost.mcpserve import stdio


def test_lines_split_across_chunks_and_overlong_lines_are_discarded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stdio, "MAX_LINE_BYTES", 16)
    lines: list[bytes] = []
    overlong: list[bytes] = []
    reader = stdio._LineReader(lines.append, overlong.append)
    reader.feed(b'{"a":')
    reader.feed(b"1}\n\n  \n{")
    reader.feed(b"x" * 40)  # over the cap: dropped up to the next newline
    reader.feed(b"yyy\n[2]\n")
    reader.feed(b"[3]")
    reader.eof_received()
    assert lines == [b'{"a":1}', b"[2]", b"[3]"]
    assert overlong == [b"{" + b"x" * 40]  # the line's start, for the id; the rest is skipped


def test_a_full_line_over_the_cap_in_one_chunk_is_refused_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stdio, "MAX_LINE_BYTES", 16)
    lines: list[bytes] = []
    overlong: list[bytes] = []
    reader = stdio._LineReader(lines.append, overlong.append)
    reader.feed(b'{"id":1,"pad":"' + b"x" * 20 + b'"}\n[1]\n')
    assert lines == [b"[1]"]
    assert overlong == [b'{"id":1,"pad":"' + b"x" * 20 + b'"}']


def test_the_reader_stops_splitting_while_saturated_and_resumes_where_it_stopped() -> None:
    lines: list[bytes] = []
    full = [False]
    reader = stdio._LineReader(lines.append, lambda prefix: None, lambda: full[0])

    def take(line: bytes) -> None:
        lines.append(line)
        full[0] = len(lines) == 2  # saturated right after the second line

    reader._on_line = take
    reader.feed(b"[1]\n[2]\n[3]\n[4")
    assert lines == [b"[1]", b"[2]"] and reader.paused and not reader.room.is_set()
    reader.eof_received()  # EOF seen while paused waits for the held lines
    assert not reader.eof.is_set()
    full[0] = False
    reader.resume()
    assert lines == [b"[1]", b"[2]", b"[3]", b"[4"]
    assert reader.eof.is_set() and not reader.paused


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        (b'{"jsonrpc":"2.0","id":7,"method":"ping","params":{"pad":"xxx', 7),
        (
            b'\xef\xbb\xbf {"method":"x","params":{"id":5,"a":[{"id":3}]},"id" : "r-\\u00e9","p',
            "r-\u00e9",
        ),
        (b'{"a":true,"b":null,"c":[1,"]"],"id":-12,"d":"', -12),
        (b'{"params":{"id":5,"pad":"xxxx', None),  # only a nested id so far
        (b'{"id":12', None),  # cut off: the number may go on
        (b'{"id":12.5,', None),
        (b'{"id":null,', None),
        (b'{"id":true,', None),
        (b'{"id":[1],', None),
        (b'{"id":"cut', None),
        (b'{"id":1,"id":2,', None),  # ambiguous
        (b'{"result":{},"id":1,', None),  # a response
        (b'[{"id":1},', None),
        (b'{"a":"\xff","id":1,', None),  # not UTF-8
        (b'{"id":' + b"9" * 5000 + b",", None),  # beyond Python's int-parsing limit
        (b'{"id":1,"x":' + b"[" * 100_000, 1),  # deep nesting: no recursion
    ],
)
def test_recovering_the_id_of_an_over_cap_line(prefix: bytes, expected: Any) -> None:
    assert stdio.recover_request_id(prefix) == expected


def test_recovering_the_id_reads_only_the_scan_window() -> None:
    late = b'{"pad":"' + b"x" * stdio.ID_SCAN_BYTES + b'","id":9,'
    assert stdio.recover_request_id(late) is None


class Recorder:
    """A wire that keeps what would have been written."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.closed = False

    async def send(self, message: Any) -> None:
        data = message() if callable(message) else stdio._dumps(message)
        self.sent.append(json.loads(data))


@pytest.mark.anyio
async def test_the_framing_answers_what_never_becomes_a_message() -> None:
    wire = Recorder()
    transport = stdio.StdioTransport(wire)  # type: ignore[arg-type]
    for raw in (
        b"{not json",
        b'{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}',
        b'{"jsonrpc":"2.0","id":"p","method":"ping","params":[1]}',
        b'{"id":"v","method":"ping"}',
        b'{"jsonrpc":"2.0","method":"notifications/whatever","params":7}',
    ):
        assert await transport._parse(raw) is None
    assert [(m.get("id"), m["error"]["code"]) for m in wire.sent] == [
        (None, -32700),
        (None, -32600),
        ("p", -32602),
        ("v", -32600),
    ]
    assert all("id" not in m for m in wire.sent[:2]), "MCP: omit, never null"
    assert await transport._parse(b'{"jsonrpc":"2.0","id":1,"method":"ping"}') is not None
    assert await transport._parse(b'{"jsonrpc":"2.0","id":"1","method":"ping"}') is None
    assert wire.sent[-1] == {
        "jsonrpc": "2.0",
        "id": "1",
        "error": {"code": -32600, "message": "duplicate request id"},
    }


def test_lone_surrogates_are_escaped_not_dropped() -> None:
    import mcp_types

    encoded = stdio._dumps({"jsonrpc": "2.0", "id": 1, "error": {"message": "\ud800"}})
    assert json.loads(encoded)["error"]["message"] == "\ud800"
    error = mcp_types.JSONRPCError(
        jsonrpc="2.0", id=None, error=mcp_types.ErrorData(code=-32600, message="\ud800")
    )
    line = json.loads(stdio._encode(error))
    assert "id" not in line and line["error"]["message"] == "\ud800"
