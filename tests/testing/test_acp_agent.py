"""Black-box: the stand-in ACP agent (mcphost/testing/acp_agent.py) on its raw wire.

What the session tests (tests/relay/acp/test_session.py) do not see: its stdout carries JSON-RPC
only, its capabilities follow the flags, errors for what it does not serve, session/cancel.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest


class Wire:
    def __init__(self, *flags: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mcphost.testing.acp_agent", *flags],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.seen: list[dict[str, Any]] = []
        self.ids = iter(range(1, 1000))

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())
        self.proc.stdin.flush()

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request_id = next(self.ids)
        self.send({"id": request_id, "method": method, "params": params})
        return self.reply(request_id)

    def reply(self, request_id: int) -> dict[str, Any]:
        """Read frames (each must be a JSON-RPC 2.0 object) until the reply to `request_id`."""
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            assert line, "the agent closed its stdout"
            frame = json.loads(line)
            assert isinstance(frame, dict) and frame.get("jsonrpc") == "2.0", line
            self.seen.append(frame)
            if frame.get("id") == request_id and "method" not in frame:
                return frame

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0


@pytest.fixture
def wire() -> Iterator[Wire]:
    agent = Wire()
    yield agent
    agent.close()


def capabilities(*flags: str) -> dict[str, Any]:
    agent = Wire(*flags)
    try:
        reply = agent.call("initialize", {"protocolVersion": 1})
        assert reply["result"]["protocolVersion"] == 1
        return dict(reply["result"]["agentCapabilities"])
    finally:
        agent.close()


def test_capabilities_follow_the_flags() -> None:
    assert capabilities() == {
        "loadSession": True,
        "promptCapabilities": {"image": False, "audio": False},
    }
    assert capabilities("--no-load", "--no-prompt") == {"loadSession": False}


def test_what_it_does_not_serve_is_an_error(wire: Wire) -> None:
    assert wire.call("fs/read_text_file", {})["error"]["code"] == -32601
    unknown = wire.call("session/prompt", {"sessionId": "nope", "prompt": []})
    assert unknown["error"]["message"] == "unknown session"
    assert wire.call("session/load", {"sessionId": "nope", "cwd": "/", "mcpServers": []})["error"]


def test_session_cancel_ends_a_slow_turn_cancelled(wire: Wire) -> None:
    session = wire.call("session/new", {"cwd": "/", "mcpServers": []})["result"]["sessionId"]
    request_id = next(wire.ids)
    text = {"type": "text", "text": "ACP-SLOW\nnever echoed"}
    prompt = {"sessionId": session, "prompt": [text]}
    wire.send({"id": request_id, "method": "session/prompt", "params": prompt})
    wire.send({"method": "session/cancel", "params": {"sessionId": session}})
    assert wire.reply(request_id)["result"] == {"stopReason": "cancelled"}
    assert all(frame.get("method") != "session/update" for frame in wire.seen)  # no echo


def test_quit_ends_the_turn_cancelled_with_its_permission_request_unanswered(wire: Wire) -> None:
    session = wire.call("session/new", {"cwd": "/", "mcpServers": []})["result"]["sessionId"]
    request_id = next(wire.ids)
    text = {"type": "text", "text": "ACP-QUIT: rm -rf /tmp/x\nnever echoed"}
    prompt = {"sessionId": session, "prompt": [text]}
    wire.send({"id": request_id, "method": "session/prompt", "params": prompt})
    assert wire.reply(request_id)["result"] == {"stopReason": "cancelled"}
    (asked,) = [f for f in wire.seen if f.get("method") == "session/request_permission"]
    assert asked["params"]["toolCall"]["title"] == "rm -rf /tmp/x"
    # the late answer is ignored, and the agent takes the next turn
    wire.send({"id": asked["id"], "result": {"outcome": {"outcome": "cancelled"}}})
    next_turn = {"sessionId": session, "prompt": [{"type": "text", "text": "next"}]}
    assert wire.call("session/prompt", next_turn)["result"] == {"stopReason": "end_turn"}
