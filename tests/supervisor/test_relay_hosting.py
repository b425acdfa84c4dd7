"""Black-box: the supervisor as the bundle's relay, with its agents in real tmux (issue 13).

A bundle `party` of three stand-in agents (`runner = "tmux"`: small interactive programs that
print a prompt and echo each input line) under a real `mcphost supervise`. Agent A's relay tools
are driven from inside A's tree (`mcphost ctl exec A -- python driver.py`, the official MCP SDK
client on A's own `agentmux` attach entry), so every call goes pump -> supervisor -> relay tools
-> the relay socket (socket trust, vouched for by the kernel) -> the behaviour -> tmux. Through
them A lists the bundle (all ready), sends to B and sees it in B's pane with `look`, broadcasts,
uses `raww`, is refused what its policy forbids, and mints a PSK for the operator user
`ops@GLOBAL`; the test then connects to the relay socket as ops with that PSK (a wrong PSK and a
bare socket-trust hello are refused), takes the bundle `down` (every session stops, the tmux
server ends) and `up` again (new generations), and kills a client mid-request while others keep
being served. Conditions only (`until`), no sleeps.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcphost.testing.devcenter import DevCenter
from tests.supervisor.supervise_harness import Supervised
from tests.waiting import until

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

ECHO_AGENT = """\
import sys
name = sys.argv[1]
sys.stdout.write(name + "> ")
sys.stdout.flush()
for line in sys.stdin:
    sys.stdout.write("[" + name + "] got: " + line.rstrip("\\n") + "\\n" + name + "> ")
    sys.stdout.flush()
"""

# Runs inside agent A (ctl exec): the SDK client on A's agentmux entry; each op is one tool
# call, repeated (same session) until its result's JSON holds `until`, for at most 60 s.
DRIVER = """\
import asyncio, json, sys, time
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError as McpError

async def main():
    entry = json.load(open(sys.argv[1]))["mcpServers"]["agentmux"]
    ops = json.loads(sys.argv[2])
    params = StdioServerParameters(
        command=entry["command"], args=entry.get("args", []), env=entry.get("env")
    )
    out = []
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            for op in ops:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        result = await session.call_tool(op["tool"], op.get("args", {}))
                        text = json.dumps(result.model_dump(mode="json", by_alias=True))
                    except McpError as exc:  # a relay refusal is a JSON-RPC error
                        text = json.dumps({"isError": True, "error": exc.error.model_dump()})
                    if not op.get("until") or op["until"] in text or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.05)
                out.append(json.loads(text))
    print(json.dumps(out))

asyncio.run(main())
"""

POLICIES = """\
format-version = 1
default = "default"

[[policies]]
id = "default"
[policies.controls]
list = "home"
look = "home"
send = "home"

[[policies]]
id = "lead"
[policies.controls]
list = "home"
look = "home"
send = "home"
raww = "home"
[policies.controls.new]
peer = "all"

[[policies]]
id = "operator"
[policies.controls]
list = "all"
look = "all"
send = "all"
updown = "all"
"""

USERS = """\
format-version = 1

[[sessions]]
id = "ops@GLOBAL"
policy = "operator"
"""

AGENTS = ("A", "B", "C")


@pytest.fixture(scope="module")
def center(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCenter]:
    with DevCenter.start(tmp_path_factory.mktemp("center")) as running:
        yield running


@pytest.fixture
def party(tmp_path: Path, center: DevCenter) -> Iterator[Supervised]:
    sv = Supervised(tmp_path, center)
    operator = Path(tempfile.mkdtemp(prefix="mcphost-op-"))
    (operator / "policies.toml").write_text(POLICIES)
    (operator / "users.toml").write_text(USERS)
    echo = tmp_path / "echo_agent.py"
    echo.write_text(ECHO_AGENT)
    sv.extra_env["AGENTMUX_CONFIGURATION_DIRECTORY"] = str(operator)
    agents: list[dict[str, Any]] = []
    for agent in AGENTS:
        entry: dict[str, Any] = {"id": agent, "command": [sys.executable, str(echo), agent]}
        if agent == "A":
            entry["policy"] = "lead"
        agents.append(entry)
    sv.write_fleet(agents, bundle="party", runner="tmux", restart="always")
    try:
        sv.start()
        for agent in AGENTS:
            sv.wait_running(agent)
        yield sv
    finally:
        sv.close()
        shutil.rmtree(operator, ignore_errors=True)
        shutil.rmtree(sv.state, ignore_errors=True)


def drive(sv: Supervised, tmp_path: Path, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run the ops through A's relay tools from inside A (ctl exec); their tool results."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    config = sv.state / "agents" / "A" / "mcp.json"
    done = subprocess.run(
        [sys.executable, "-m", "mcphost", "ctl", "--state", str(sv.state), "exec", "A", "--",
         sys.executable, str(driver), str(config), json.dumps(ops)],
        capture_output=True, text=True, env=sv.env(), timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-3000:])
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return results


def payload(result: dict[str, Any]) -> dict[str, Any]:
    """A tool result's structured content (or its text parsed as JSON)."""
    structured = result.get("structuredContent")
    if isinstance(structured, dict):
        return structured
    texts = [c.get("text", "") for c in result.get("content", []) if c.get("type") == "text"]
    return dict(json.loads(texts[0])) if texts else {}


class Wire:
    """A raw client of the relay socket (newline-delimited JSON)."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(60)
        self.sock.connect(str(path))
        self.buffer = b""

    def send(self, frame: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(frame).encode() + b"\n")

    def read(self) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed; buffered {self.buffer!r}")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        frame: dict[str, Any] = json.loads(line)
        return frame

    def hello(self, principal: str, token: str) -> dict[str, Any]:
        self.send(
            {
                "frame": "hello",
                "schema_version": "1",
                "principal_id": principal,
                "identity_token": token,
            }
        )
        return self.read()

    def request(self, operation: str, namespace: str | None = None, **body: Any) -> dict[str, Any]:
        request_id = uuid.uuid4().hex
        frame: dict[str, Any] = {
            "frame": "request",
            "request_id": request_id,
            "request": {"operation": operation, **body},
        }
        if namespace is not None:
            frame["namespace"] = namespace
        self.send(frame)
        while True:
            reply = self.read()
            if reply.get("frame") == "response" and reply.get("request_id") == request_id:
                return dict(reply["response"])

    def abort(self) -> None:
        """Close with a reset (SO_LINGER 0), as a killed client's kernel would at worst."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def close(self) -> None:
        self.sock.close()


def tmux_sessions(sv: Supervised) -> set[str]:
    runtime = sv.state / "relay" / "bundles" / "party"
    done = subprocess.run(
        ["tmux", "-S", "tmux.sock", "list-sessions", "-F", "#{session_name}"],
        cwd=runtime, capture_output=True, text=True, env={"PATH": os.environ["PATH"]}, timeout=60,
    )  # fmt: skip
    return set(done.stdout.split()) if done.returncode == 0 else set()


def test_the_supervisor_is_the_bundles_relay(party: Supervised, tmp_path: Path) -> None:
    sv = party
    relay_root = sv.state / "relay"
    assert os.stat(relay_root).st_mode & 0o777 == 0o700
    assert os.stat(relay_root / "relay.sock").st_mode & 0o777 == 0o600
    assert tmux_sessions(sv) == set(AGENTS)
    to_b, to_all, raw = (f"{kind}-{uuid.uuid4().hex[:8]}" for kind in ("to-b", "to-all", "raw"))
    results = drive(
        sv,
        tmp_path,
        [
            {"tool": "list", "args": {"command": "principals"}},
            {"tool": "send", "args": {"targets": ["B"], "message": to_b}},
            {"tool": "look", "args": {"target_session": "B@party"}, "until": to_b},
            {"tool": "send", "args": {"broadcast": True, "message": to_all}},
            {"tool": "look", "args": {"target_session": "B@party"}, "until": to_all},
            {"tool": "look", "args": {"target_session": "C@party"}, "until": to_all},
            {"tool": "raww", "args": {"target_session": "C@party", "text": raw}},
            {"tool": "look", "args": {"target_session": "C@party"}, "until": f"got: {raw}"},
            {"tool": "change", "args": {"command": "psk", "args": {"principal_id": "B@party"}}},
            {"tool": "new", "args": {"command": "peer", "args": {"principal_id": "ops@GLOBAL"}}},
        ],
    )
    listed, sent, look_b, broadcast, look_b2, look_c, raww, look_c2, refused, minted = results
    # list: the bundle, every member ready
    assert not listed.get("isError"), listed
    bundles = {b["id"]: b for b in payload(listed)["bundles"]}
    members = {p["id"]: p["ready"] for p in bundles["party"]["principals"]}
    assert members == {f"{agent}@party": True for agent in AGENTS}, listed
    assert bundles["party"]["state"] == "up", listed
    # send -> B's pane shows the message (envelope pasted, then submitted: echoed by B)
    assert not sent.get("isError") and "queued" in json.dumps(sent), sent
    assert to_b in json.dumps(look_b), look_b
    assert "[B] got: " in json.dumps(look_b), look_b
    # broadcast reaches B and C
    assert not broadcast.get("isError"), broadcast
    assert to_all in json.dumps(look_b2) and to_all in json.dumps(look_c), (look_b2, look_c)
    # raww: the raw text, then Enter, typed into C
    assert not raww.get("isError"), raww
    assert f"[C] got: {raw}" in json.dumps(look_c2), look_c2
    # A's policy (lead) has no change.psk: refused with the capability named
    assert refused.get("isError"), refused
    assert "authorization_forbidden" in json.dumps(refused), refused
    assert "change.psk" in json.dumps(refused), refused
    # new peer: the PSK is shown once, in this response
    assert not minted.get("isError"), minted
    psk = _find(payload(minted), "psk")
    assert isinstance(psk, str) and len(psk) >= 40, minted

    sock = relay_root / "relay.sock"
    # a wrong PSK and an unvouched socket-trust hello are refused
    wrong = Wire(sock)
    try:
        refusal = wrong.hello("ops@GLOBAL", psk[:-4] + "AAAA")
        assert "validation_unrecognized_credential" in json.dumps(refusal), refusal
    finally:
        wrong.close()
    forged = Wire(sock)
    try:
        refusal = forged.hello("B@party", "socket-trust")  # this test is outside B's tree
        assert "validation_credential_required" in json.dumps(refusal), refusal
    finally:
        forged.close()
    # the minted PSK connects as ops@GLOBAL
    ops = Wire(sock)
    try:
        ack = ops.hello("ops@GLOBAL", psk)
        assert ack.get("frame") == "hello_ack" and ack.get("principal_id") == "ops@GLOBAL", ack
        before = {agent: sv.status()[agent]["generation"] for agent in AGENTS}
        down = ops.request("down", "party")
        assert down.get("kind") == "bundle_transition", down
        assert down["bundles"][0]["outcome"] == "unhosted", down
        assert {row["state"] for row in sv.status().values()} == {"stopped"}
        assert tmux_sessions(sv) == set()  # the bundle's tmux server is gone too
        listed_down = ops.request("list", "party")
        assert listed_down["bundle"]["state"] == "down", listed_down
        up = ops.request("up", "party")
        assert up["bundles"][0]["outcome"] == "hosted", up
        for agent in AGENTS:
            row = sv.wait_running(agent)
            assert row["generation"] > before[agent], (row, before)
        assert tmux_sessions(sv) == set(AGENTS)
        # a client killed mid-request: nothing else is lost
        marker = f"kept-{uuid.uuid4().hex[:8]}"
        ops.send(
            {
                "frame": "request",
                "request_id": "doomed",
                "namespace": "party",
                "request": {"operation": "send", "targets": ["B@party"], "message": marker},
            }
        )
        ops.abort()  # killed before any answer: its claim is released, its request served
        again = until(lambda: _reconnect(sock, psk), 60, "ops to reconnect")
        assert again is not None
        ops = again
        listed_after = ops.request("list", "party")
        assert listed_after["bundle"]["state"] == "up", listed_after
        after = drive(
            sv,
            tmp_path,
            [{"tool": "look", "args": {"target_session": "B@party"}, "until": marker}],
        )
        assert marker in json.dumps(after[0]), after  # the request still reached B
    finally:
        ops.close()


def _reconnect(sock: Path, psk: str) -> Wire | None:
    """A new ops connection once the old one's claim is released (None: not yet)."""
    wire = Wire(sock)
    ack = wire.hello("ops@GLOBAL", psk)
    if ack.get("frame") == "hello_ack":
        return wire
    wire.close()
    return None


def _find(value: Any, key: str) -> Any:
    """The first `key` anywhere in a JSON value (the PSK inside a tool result)."""
    if isinstance(value, dict):
        if key in value:
            return value[key]
        for item in value.values():
            found = _find(item, key)
            if found is not None:
                return found
    if isinstance(value, list):
        for item in value:
            found = _find(item, key)
            if found is not None:
                return found
    if isinstance(value, str) and value.startswith("{"):
        try:
            return _find(json.loads(value), key)
        except ValueError:
            return None
    return None
