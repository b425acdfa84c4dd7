"""Black-box: the relay tools and the session cap through a real `mcphost supervise` process.

What the issue promises: an agent with `bundle = "party"` gets the relay tools (`agentmux` in its
MCP config, an attach entry like the center's), and they speak to the relay as that agent's
principal `<agent_id>@party`, whatever the agent's process says; an agent without a bundle is
refused the relay surface (`surface_unavailable`, the pump exits 3). And an agent may hold at
most `MAX_SESSIONS_PER_AGENT` (32) sessions per surface: the next is refused
(`too_many_sessions`) until one of its sessions ends.

The relay is the fake relay of the relay tools' suite (mcphost/testing/relayharness.py), run on
the socket the relay tools resolve from the supervisor's environment
(`AGENTMUX_STATE_DIRECTORY/relay.sock`, bundles under `AGENTMUX_CONFIGURATION_DIRECTORY`).

The bundle file the supervisor writes says what each member is: the real relay tools, pointed at
it with the relay down, list a process agent as `process` (issue #33).

The principal test, the listing test and the session-cap test share one supervisor
(`relay_fleet`), each with agents of its own; the test without a relay needs another environment, so its own supervisor.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mcphost.supervisor.serving.surfaces import MAX_SESSIONS_PER_AGENT
from mcphost.testing.devcenter import DevCenter
from mcphost.testing.relayharness import CODERS, Env, FakeRelay, ok, sdk_client
from tests.supervisor.supervise_harness import Supervised, inline, standin
from tests.waiting import until

# deep (make test-slow): the relay tools through the supervisor.
pytestmark = pytest.mark.deep

PARTY = """\
format-version = 1

[[sessions]]
id = "agent-1"
directory = "{root}/work/agent-1"
coder = "default"
"""

# An agent that runs its center pump against the relay socket (it has no relay entry).
RELAY_WITHOUT_BUNDLE = """\
import json, subprocess, sys
entry = json.load(open(sys.argv[1]))["mcpServers"]["agent-center"]
args = [a.replace("center.sock", "relay.sock") for a in entry.get("args", [])]
done = subprocess.run([entry["command"], *args], input=b"", capture_output=True)
json.dump(
    {"code": done.returncode, "stdout": done.stdout.decode(), "stderr": done.stderr.decode()},
    open("relay-attempt.json", "w"),
)
"""

# An agent that attaches MAX + 1 center sessions, then ends one and attaches again on cue.
MANY_SESSIONS = """\
import json, os, signal, subprocess, sys, time
entry = json.load(open(sys.argv[1]))["mcpServers"]["agent-center"]
argv = [entry["command"], *entry.get("args", [])]
count = int(sys.argv[2])
INIT = json.dumps({
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "many", "version": "1"}},
}).encode() + b"\\n"

def attach():
    pump = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        pump.stdin.write(INIT)
        pump.stdin.flush()
    except BrokenPipeError:
        pass
    return pump, pump.stdout.readline()

def write(name, value):
    with open(name + ".tmp", "w") as out:
        json.dump(value, out)
    os.rename(name + ".tmp", name)

pumps = []
for index in range(count):
    pump, line = attach()
    if b'"result"' not in line:
        write("opened.json", {"failed_at": index, "stderr": pump.stderr.read().decode()})
        sys.exit(1)
    pumps.append(pump)
write("opened.json", {"opened": len(pumps)})
extra, line = attach()
extra.wait()
write("refused.json", {"line": line.decode(), "code": extra.returncode,
                       "stderr": extra.stderr.read().decode()})
first = pumps.pop(0)
first.stdin.close()
first.wait()
write("closed.json", {"code": first.returncode})
while not os.path.exists("again"):
    time.sleep(0.01)
pump, line = attach()
pumps.append(pump)
write("reopened.json", {"ok": b'"result"' in line})
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    signal.pause()
"""


class RelayThread:
    """The fake relay on its own event loop in a thread (the test itself is synchronous)."""

    def __init__(self, path: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.relay = self._run(FakeRelay(path).start())

    def _run(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def close(self) -> None:
        try:
            self._run(self.relay.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(60)
            self.loop.close()


@dataclass
class RelayFleet:
    sv: Supervised
    relay: RelayThread


@pytest.fixture(scope="module")
def relay_fleet(
    tmp_path_factory: pytest.TempPathFactory, center: DevCenter
) -> Iterator[RelayFleet]:
    """One supervisor, with a configuration root holding bundles/party.toml (agent-1 a member)
    and a relay state root where the fake relay listens, both named in its environment.

    Its fleet: `agent-1` (bundle party: calls `list` on its relay tools) and `agent-2` (no
    bundle: tries the relay socket with its center pump) for the principal test; `many` (no
    bundle: attaches up to the session cap and past it) for the session-cap test. A supervisor
    per test would prove nothing more: the cap is per agent, and no agent of one test touches
    the other's. At the module's end SIGTERM must stop it with exit 0.
    """
    base = tmp_path_factory.mktemp("relay-fleet")
    supervised = Supervised(base, center)
    root = Path(tempfile.mkdtemp(prefix="mcphost-rl-"))
    config, state = root / "cfg", root / "state"
    (config / "bundles").mkdir(parents=True)
    (config / "bundles" / "party.toml").write_text(PARTY.format(root=root))
    (config / "coders.toml").write_text(CODERS)
    (root / "work" / "agent-1").mkdir(parents=True)
    state.mkdir(mode=0o700)
    supervised.extra_env.update(
        AGENTMUX_CONFIGURATION_DIRECTORY=str(config), AGENTMUX_STATE_DIRECTORY=str(state)
    )
    supervised.write_fleet(
        [
            {
                "id": "agent-1",
                "bundle": "party",
                "command": standin(
                    "--relay-call", "list", "--relay-args", '{{"command": "principals"}}', "--hold"
                ),
            },
            {"id": "agent-2", "command": [*inline(RELAY_WITHOUT_BUNDLE), "{mcp_config}"]},
            {
                "id": "many",
                "command": [*inline(MANY_SESSIONS), "{mcp_config}", str(MAX_SESSIONS_PER_AGENT)],
            },
        ]
    )
    relay = RelayThread(state / "relay.sock")
    try:
        supervised.start()
        yield RelayFleet(supervised, relay)
        assert supervised.terminate() == 0, supervised.stderr()[-3000:]
    finally:
        supervised.close()
        relay.close()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(supervised.state, ignore_errors=True)


def test_the_relay_tools_speak_as_the_agents_principal(relay_fleet: RelayFleet):
    supervised, relay = relay_fleet.sv, relay_fleet.relay
    config = json.loads((supervised.state / "agents" / "agent-1" / "mcp.json").read_text())
    servers = config["mcpServers"]
    assert sorted(servers) == ["agent-center", "agentmux"]
    assert servers["agentmux"]["args"][-1] == str(supervised.state / "run" / "relay.sock")
    assert (
        "agentmux"
        not in json.loads((supervised.state / "agents" / "agent-2" / "mcp.json").read_text())[
            "mcpServers"
        ]
    )
    calls = until(lambda: len(supervised.calls("agent-1")) >= 2 and supervised.calls("agent-1"), 60)
    by_server = {c["server"]: c for c in calls}
    assert by_server["agent-center"]["ok"], by_server["agent-center"]
    relayed = by_server["agentmux"]
    assert relayed["ok"], relayed
    assert {"list", "help", "send"} <= set(relayed["tools"])
    # the relay heard the agent as agent-1@party, and answered the list it asked for
    assert [h["principal_id"] for h in relay.relay.hellos] == ["agent-1@party"]
    assert "list" in relay.relay.operations()
    # an agent without a bundle is refused the relay surface
    attempt_file = supervised.workspace("agent-2") / "relay-attempt.json"
    until(attempt_file.exists, 60, "agent-2's relay attempt")
    attempt = json.loads(attempt_file.read_text())
    assert attempt["code"] == 3, attempt
    assert "surface_unavailable" in attempt["stderr"] and attempt["stdout"] == "", attempt
    assert len(relay.relay.hellos) == 1  # nothing reached the relay for agent-2


def test_the_relay_tools_list_the_written_bundle_as_the_fleet_runs_it(relay_fleet: RelayFleet):
    """The bundle file the supervisor writes (`<state>/relay/config`, from the model its relay
    reads in memory) says what each member is: the real `mcphost relay-tools`, pointed at it
    with no relay listening, lists agent-1 (`runner = "auto"` with a command: a process agent)
    as `process`, where the file once said a tmux coder (issue #33)."""
    config = relay_fleet.sv.state / "relay" / "config"
    until((config / "bundles" / "party.toml").exists, 60, "the generated layer")
    root = Path(tempfile.mkdtemp(prefix="mcphost-rl-"))
    try:
        (root / "state").mkdir(mode=0o700)
        (root / "home").mkdir()
        env = Env(root, config, root / "state")

        async def listing() -> dict[str, Any]:
            async with sdk_client(env, env.args(bundle="party", session="agent-1")) as client:
                return await ok(client, "list", {"command": "principals"})  # type: ignore[no-any-return]

        home = asyncio.run(listing())["bundles"][0]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert (home["id"], home["state"], home["state_reason_code"]) == (
        "party",
        "down",
        "not_started",
    )
    assert [(p["id"], p["transport"]) for p in home["principals"]] == [("agent-1@party", "process")]


def test_the_help_tool_works_through_the_pump_without_a_relay(supervised: Supervised):
    root = Path(tempfile.mkdtemp(prefix="mcphost-rl-"))
    try:
        (root / "cfg" / "bundles").mkdir(parents=True)
        (root / "cfg" / "bundles" / "party.toml").write_text(PARTY.format(root=root))
        (root / "cfg" / "coders.toml").write_text(CODERS)
        supervised.extra_env.update(
            AGENTMUX_CONFIGURATION_DIRECTORY=str(root / "cfg"),
            AGENTMUX_STATE_DIRECTORY=str(root / "state"),  # no relay listens there
        )
        supervised.write_fleet([{"id": "agent-1", "bundle": "party", "command": standin()}])
        supervised.start()
        calls = until(
            lambda: len(supervised.calls("agent-1")) >= 2 and supervised.calls("agent-1"), 60
        )
        relayed = {c["server"]: c for c in calls}["agentmux"]
        assert relayed["ok"], relayed
        assert "list" in json.dumps(relayed["result"])
    finally:
        supervised.close()
        shutil.rmtree(root, ignore_errors=True)


def test_an_agent_holds_at_most_max_sessions_per_surface(relay_fleet: RelayFleet):
    supervised = relay_fleet.sv
    workspace = supervised.workspace("many")
    until((workspace / "refused.json").exists, 120, "the attach beyond the cap")
    opened = json.loads((workspace / "opened.json").read_text())
    assert opened == {"opened": MAX_SESSIONS_PER_AGENT}, opened
    refused = json.loads((workspace / "refused.json").read_text())
    assert refused["code"] == 3 and refused["line"] == "", refused
    assert "too_many_sessions" in refused["stderr"], refused
    # one session ends (its client went away): the agent may attach again
    until((workspace / "closed.json").exists, 60, "one session to end")
    until(
        lambda: supervised.status()["many"]["sessions"] == MAX_SESSIONS_PER_AGENT - 1,
        60,
        "the supervisor to forget the ended session",
    )
    (workspace / "again").write_text("again")
    until((workspace / "reopened.json").exists, 60, "the attach after one ended")
    assert json.loads((workspace / "reopened.json").read_text()) == {"ok": True}
    assert supervised.status()["many"]["sessions"] == MAX_SESSIONS_PER_AGENT
