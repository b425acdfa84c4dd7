"""Black-box: sessions without a process, MCP's streamable HTTP on the supervisor's loopback.

One real `mcphost supervise`, run as root (every agent a uid of its own, fenced), serves two
agents whose fleet entries say `mcp_transport = "http"`. From inside each agent (`ctl exec`:
the agent's uid, in its fence) the MCP SDK's own streamable-HTTP client is served as that agent:
the center hears its calls with its agent_id and its generation. A connection from a uid that is
no agent's (the test, root) is reset before the HTTP layer reads a byte; a session id another
agent opened is refused (the kernel's word on the connection names the agent, never the session
id); after `ctl restart` the old generation's session is gone and a new one is served at the new
generation; a hostile agent's flood of connections and an oversized body meet their bounds. A
fleet of pumps reloaded to HTTP gets the listener then, and its restarted agent is served there.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcphost.supervisor.confine import probe as machine
from mcphost.supervisor.serving import streamable
from mcphost.testing.devcenter import DevCenter
from tests.supervisor.supervise_harness import REPO, Supervised, center_heard
from tests.waiting import until

# deep (make test-slow): a root supervisor's fenced agents driving real HTTP clients.
pytestmark = [
    pytest.mark.deep,
    pytest.mark.skipif(
        os.geteuid() != 0, reason="HTTP sessions need agents of their own uids (root)"
    ),
    pytest.mark.skipif(
        machine.probe().missing() is not None, reason=f"no fence here: {machine.probe().missing()}"
    ),
]

HOLD = [sys.executable, "-c", "import signal; signal.pause()"]

# The SDK's streamable-HTTP client on the agent's own `agent-center` entry (argv[1]: its MCP
# config): initialize, list the tools, call one; prints what it saw as one JSON line.
SDK_CLIENT = """\
import asyncio, json, sys
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

async def main():
    entry = json.load(open(sys.argv[1]))["mcpServers"]["agent-center"]
    async with streamable_http_client(entry["url"]) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            result = await session.call_tool(sys.argv[2], {})
            print(json.dumps({"tools": len(tools.tools), "is_error": result.is_error}))

asyncio.run(main())
"""

# Raw HTTP (stdlib), for what the SDK client never sends: argv[1] the config, argv[2] a session
# id to use ("" opens one with `initialize`), argv[3] a Content-Length to claim ("" the real one).
RAW = """\
import http.client, json, sys
from urllib.parse import urlsplit
url = urlsplit(json.load(open(sys.argv[1]))["mcpServers"]["agent-center"]["url"])
sid, claimed = sys.argv[2], sys.argv[3]
if sid:
    message = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
else:
    message = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}}
body = json.dumps(message).encode()
conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
conn.putrequest("POST", url.path)
conn.putheader("Content-Type", "application/json")
conn.putheader("Accept", "application/json, text/event-stream")
conn.putheader("MCP-Protocol-Version", "2025-06-18")
conn.putheader("Content-Length", claimed or str(len(body)))
if sid:
    conn.putheader("Mcp-Session-Id", sid)
conn.endheaders()
conn.send(body)
reply = conn.getresponse()
text = reply.read().decode(errors="replace")
print(json.dumps({"status": reply.status, "sid": reply.getheader("mcp-session-id"), "body": text}))
"""

# A flood from inside an agent: argv[2] connections opened at once and held, each then sent a
# request without a session (answered 400, the connection kept alive: it stays counted); prints
# how many were answered and how many were reset or closed unanswered.
FLOOD = """\
import json, socket, sys
from urllib.parse import urlsplit
url = urlsplit(json.load(open(sys.argv[1]))["mcpServers"]["agent-center"]["url"])
conns = [socket.create_connection((url.hostname, url.port)) for _ in range(int(sys.argv[2]))]
answered = refused = 0
for conn in conns:
    conn.settimeout(30)
    try:
        conn.sendall(b"GET /mcp/center HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
        data = conn.recv(100)
    except OSError:
        data = b""
    if data.startswith(b"HTTP/1.1"):
        answered += 1
    else:
        refused += 1
print(json.dumps({"answered": answered, "refused": refused}))
"""


@pytest.fixture(scope="module")
def sv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervised]:
    base = tmp_path_factory.mktemp("http")
    with DevCenter.start(base / "center") as center:
        running = Supervised(base, center, state_parent=REPO)
        running.write_fleet(
            [{"id": "agent-1", "command": HOLD}, {"id": "agent-2", "command": HOLD}],
            mcp_transport="http",
        )
        try:
            running.start()
            for agent in ("agent-1", "agent-2"):
                running.wait_running(agent)
            yield running
        finally:
            running.close()


def config_of(sv: Supervised, agent: str) -> str:
    return str(sv.state / "agents" / agent / "mcp.json")


def ctl_exec(sv: Supervised, agent: str, *argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mcphost", "ctl", "--state", str(sv.state), "exec", agent]
    return subprocess.run(
        [*command, "--", *argv],
        capture_output=True,
        text=True,
        env=sv.env(),
        timeout=120,
        check=False,
    )


def run_in(sv: Supervised, agent: str, script: str, *args: str) -> dict[str, Any]:
    done = ctl_exec(sv, agent, sys.executable, "-c", script, config_of(sv, agent), *args)
    assert done.returncode == 0, done.stderr[-1500:] + sv.stderr()[-4000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def generations_heard_in(requests: list[dict[str, Any]]) -> set[str]:
    return {
        {k.lower(): v for k, v in r["headers"].items()}.get("x-ac-mcp-generation", "")
        for r in requests
    }


def generations_heard(center: DevCenter, agent: str, tool: str) -> set[str]:
    return generations_heard_in(center_heard(center, agent, tool))


def test_the_config_holds_http_entries_and_no_pump(sv: Supervised) -> None:
    servers = json.loads(Path(config_of(sv, "agent-1")).read_text())["mcpServers"]
    entry = servers["agent-center"]
    assert entry["type"] == "http" and "command" not in entry
    assert entry["url"].startswith("http://127.0.0.1:") and entry["url"].endswith("/mcp/center")


def test_the_sdk_client_is_served_as_its_own_agent_at_its_generation(sv: Supervised) -> None:
    seen = run_in(sv, "agent-1", SDK_CLIENT, "get_my_work")
    assert seen["tools"] > 0 and seen["is_error"] is False
    generation = sv.status()["agent-1"]["generation"]
    assert generations_heard(sv.center, "agent-1", "get_my_work") == {str(generation)}
    assert center_heard(sv.center, "agent-2", "get_my_work") == []


def test_a_connection_from_a_uid_of_no_agent_is_reset_before_http(sv: Supervised) -> None:
    url = json.loads(Path(config_of(sv, "agent-1")).read_text())["mcpServers"]["agent-center"]
    port = int(url["url"].split(":")[2].split("/")[0])
    with socket.create_connection(("127.0.0.1", port)) as conn:  # this test runs as root
        conn.settimeout(30)
        try:
            conn.sendall(b"POST /mcp/center HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            data = conn.recv(100)
        except ConnectionResetError:
            data = b""
    assert data == b""  # no HTTP answer at all: reset at accept
    until(
        lambda: any(
            e.get("event") == "supervisor.http.refused" and e.get("reason") == "not_an_agent"
            for e in sv.events()
        ),
        30,
        "the refusal in the log",
    )


def test_a_session_id_another_agent_opened_is_refused(sv: Supervised) -> None:
    sessions = sv.status()["agent-1"]["sessions"]
    opened = run_in(sv, "agent-1", RAW, "", "")
    assert opened["status"] == 200 and opened["sid"], opened
    assert sv.status()["agent-1"]["sessions"] == sessions + 1  # `ctl status` counts it
    used = run_in(sv, "agent-1", RAW, opened["sid"], "")
    assert used["status"] == 200, used  # its owner may use it
    stolen = run_in(sv, "agent-2", RAW, opened["sid"], "")
    assert stolen["status"] == 404 and json.loads(stolen["body"])["error"]["code"] == (
        "session_closed"
    )


def test_an_oversized_body_is_refused_unread(sv: Supervised) -> None:
    huge = run_in(sv, "agent-2", RAW, "", str(streamable.BODY_MAX + 1))
    assert huge["status"] == 413
    assert json.loads(huge["body"])["error"]["code"] == "request_too_large"


def test_a_flood_of_connections_meets_the_per_uid_bound(sv: Supervised) -> None:
    flood = run_in(sv, "agent-2", FLOOD, str(streamable.CONNECTIONS_PER_PEER + 8))
    assert flood == {"answered": streamable.CONNECTIONS_PER_PEER, "refused": 8}
    # and the agent is served again once its connections are closed
    assert run_in(sv, "agent-2", SDK_CLIENT, "get_my_work")["is_error"] is False


def test_a_restart_ends_the_old_session_and_the_new_one_has_the_new_generation(
    sv: Supervised,
) -> None:
    before = sv.status()["agent-1"]["generation"]
    opened = run_in(sv, "agent-1", RAW, "", "")
    assert opened["status"] == 200
    sv.ctl("restart", "agent-1")
    sv.wait_running("agent-1", generation=before + 1)
    old = run_in(sv, "agent-1", RAW, opened["sid"], "")
    assert old["status"] == 404, old
    heard = len(center_heard(sv.center, "agent-1", "get_my_work"))
    seen = run_in(sv, "agent-1", SDK_CLIENT, "get_my_work")
    assert seen["is_error"] is False
    new = center_heard(sv.center, "agent-1", "get_my_work")[heard:]
    assert generations_heard_in(new) == {str(before + 1)}


def test_a_reload_to_http_restarts_the_agent_with_http_entries(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A fleet of pumps gets its HTTP listener at the reload that first asks for it."""
    base = tmp_path_factory.mktemp("http-reload")
    with DevCenter.start(base / "center") as center:
        other = Supervised(base, center, state_parent=REPO)
        other.write_fleet([{"id": "agent-1", "command": HOLD}])
        try:
            other.start()
            first = other.wait_running("agent-1")
            config = json.loads(Path(config_of(other, "agent-1")).read_text())
            assert "command" in config["mcpServers"]["agent-center"]  # the pump
            other.write_fleet([{"id": "agent-1", "command": HOLD}], mcp_transport="http")
            other.ctl("reload")
            other.wait_running("agent-1", generation=first["generation"] + 1)
            config = json.loads(Path(config_of(other, "agent-1")).read_text())
            assert config["mcpServers"]["agent-center"]["type"] == "http", config
            assert run_in(other, "agent-1", SDK_CLIENT, "get_my_work")["is_error"] is False
            heard = center_heard(center, "agent-1", "get_my_work")
            assert generations_heard_in(heard) == {str(first["generation"] + 1)}
        finally:
            other.close()
