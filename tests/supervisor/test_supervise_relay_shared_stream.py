"""Black-box: two relay tools sessions of one agent share its relay connection (issue #18, 13).

The relay allows one live connection per principal. Before the fix each relay tools session the
supervisor served opened its own connection as `<agent>@<bundle>`, so while agent A's own client
held a session, `mcphost ctl exec A -- <relay client>` got `runtime_identity_claim_conflict` for a
second, reported as `relay_timeout`; and a quick close-and-reopen raced the old connection's
claim. Now the supervisor keeps one connection per agent generation, shared by all its sessions.

A real `mcphost supervise` hosting the relay, real tmux: agent A (in its pane) is a small MCP
client on its own `agentmux` attach entry; B is an echo agent to send to. A test client, run
inside A's tree with `ctl exec A`, does open-call-close cycles (`list`, `send`; a fresh pump
each) - first alone, then while A's own session is held open and called between the cycles.
Every call of both must succeed: zero refusals. Then A is killed: its next generation's own
session and the exec'd cycles work again (the old generation's connection is gone). Conditions
only (`until`), no sleeps.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcphost.testing.devcenter import DevCenter
from tests.supervisor.agents.test_relayhost import POLICIES, echo_agent
from tests.supervisor.supervise_harness import Supervised, inline
from tests.waiting import until

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

CYCLES = 20

# One MCP client on the agentmux entry of the config in argv[1], by hand (stdlib only); then
# either `hold` (agent A in its pane: on cue file `open`, open one session and call list+send,
# then once per cue `round-N`; each outcome to `held-N.json`) or `cycles N cue` (in A's tree by
# ctl exec: N fresh sessions, each list+send then closed; with `cue`, after each cycle it cues
# A's held session and waits for its answer). Outcomes: {"ok": bool, "errors": [...]}.
CLIENT = """\
import json, os, signal, subprocess, sys, time

entry = json.load(open(sys.argv[1]))["mcpServers"]["agentmux"]

class Session:
    def __init__(self):
        self.proc = subprocess.Popen(
            [entry["command"], *entry.get("args", [])], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env={**os.environ, **entry.get("env", {})},
        )
        self.next_id = 0
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "shared", "version": "1"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, message):
        self.proc.stdin.write(json.dumps(message).encode() + b"\\n")
        self.proc.stdin.flush()

    def request(self, method, params):
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            line = self.proc.stdout.readline()
            if not line:
                return {"error": {"message": "the pump closed its stdout"}}
            message = json.loads(line)
            if message.get("id") == self.next_id:
                return message

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()

def round_trip(session, tag):
    errors = []
    for tool, args in (("list", {"command": "principals"}),
                       ("send", {"targets": ["B"], "message": tag})):
        reply = session.request("tools/call", {"name": tool, "arguments": args})
        # B's queue holds one sender's share (half of it: relay/admission.py); a send over it
        # is answered by the relay through the shared connection all the same
        full = "runtime_delivery_queue_full" in json.dumps(reply)
        if ("result" not in reply or reply["result"].get("isError")) and not full:
            errors.append({"tool": tool, "reply": reply})
    return {"ok": not errors, "errors": errors}

def write(name, value):
    with open(name + ".tmp", "w") as out:
        json.dump(value, out)
    os.rename(name + ".tmp", name)

def wait_for(name):
    deadline = time.monotonic() + 120
    while not os.path.exists(name):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True

if sys.argv[2] == "hold":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    wait_for("open")
    session = Session()
    round = 0
    while True:
        write(f"held-{round}.json", round_trip(session, f"held-{round}"))
        round += 1
        while not wait_for(f"round-{round}"):
            pass
else:
    count, cue = int(sys.argv[3]), sys.argv[4] == "cue"
    start = 1 if cue else 0
    out = []
    for index in range(count):
        session = Session()
        outcome = round_trip(session, f"cycle-{cue}-{index}")
        session.close()
        if cue:
            round = start + index
            write(f"round-{round}", {})
            outcome["held"] = (
                json.load(open(f"held-{round}.json")) if wait_for(f"held-{round}.json")
                else {"ok": False, "errors": ["no answer from the held session"]}
            )
        out.append(outcome)
    print(json.dumps(out))
"""


@contextlib.contextmanager
def holding_party(
    tmp_path: Path, center: DevCenter, *, a_policy: str | None = None, **defaults: Any
) -> Iterator[Supervised]:
    """A supervisor running bundle `party`: A, a relay tools client that holds its session, and
    B, an echo agent, both tmux agents, with the operator's `policies.toml`."""
    sv = Supervised(tmp_path, center)
    operator = Path(tempfile.mkdtemp(prefix="mcphost-op-"))
    (operator / "policies.toml").write_text(POLICIES)
    sv.extra_env["AGENTMUX_CONFIGURATION_DIRECTORY"] = str(operator)
    a: dict[str, Any] = {"id": "A", "command": [*inline(CLIENT), "{mcp_config}", "hold"]}
    if a_policy is not None:
        a["policy"] = a_policy
    sv.write_fleet(
        [a, {"id": "B", "command": echo_agent("B")}],
        bundle="party",
        runner="tmux",
        restart="always",
        **defaults,
    )
    try:
        sv.start()
        sv.wait_running("A")
        sv.wait_running("B")
        yield sv
    finally:
        sv.close()
        shutil.rmtree(operator, ignore_errors=True)
        shutil.rmtree(sv.state, ignore_errors=True)


@pytest.fixture
def shared(tmp_path: Path, center: DevCenter) -> Iterator[Supervised]:
    with holding_party(tmp_path, center) as sv:
        yield sv


def cycles(sv: Supervised, cue: bool) -> list[dict[str, Any]]:
    """`CYCLES` open-call-close cycles run inside A's tree (ctl exec), their outcomes."""
    config = sv.state / "agents" / "A" / "mcp.json"
    done = subprocess.run(
        [sys.executable, "-m", "mcphost", "ctl", "--state", str(sv.state), "exec", "A", "--",
         sys.executable, "-c", CLIENT, str(config), "cycles", str(CYCLES),
         "cue" if cue else "alone"],
        capture_output=True, text=True, env=sv.env(), timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-3000:])
    outcomes: list[dict[str, Any]] = json.loads(done.stdout)
    return outcomes


def test_two_sessions_of_one_agent_share_its_relay_connection(
    shared: Supervised, tmp_path: Path
) -> None:
    sv = shared
    workspace = sv.workspace("A")
    # quick reconnects with no other session of A open
    alone = cycles(sv, cue=False)
    assert [o for o in alone if not o["ok"]] == [], alone
    # A's own session opens and stays open; the ctl exec sessions come and go beside it
    (workspace / "open").write_text("")
    until((workspace / "held-0.json").exists, 120, "A's own session to answer")
    assert json.loads((workspace / "held-0.json").read_text())["ok"], (
        workspace / "held-0.json"
    ).read_text()
    beside = cycles(sv, cue=True)
    refused = [o for o in beside if not o["ok"] or not o["held"]["ok"]]
    assert refused == [], refused
    assert len(beside) == CYCLES
    # a new generation of A: the old generation's connection is gone, the new one's works
    row = sv.status()["A"]
    (workspace / "held-0.json").unlink()
    os.kill(row["pid"], signal.SIGKILL)
    sv.wait_running("A", row["generation"] + 1)
    until((workspace / "held-0.json").exists, 120, "the new generation's session to answer")
    assert json.loads((workspace / "held-0.json").read_text())["ok"], (
        workspace / "held-0.json"
    ).read_text()
    again = cycles(sv, cue=False)
    assert [o for o in again if not o["ok"]] == [], again
