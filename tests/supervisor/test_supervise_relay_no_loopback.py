"""Black-box: the supervisor's relay tools reach the relay it serves in process (issue #20, 2).

Before, a relay call of a supervised agent went tool -> JSON line -> the supervisor's own
`relay.sock` -> JSON parse -> behaviour, with a socket-trust hello the relay accepted because
the peer was the supervisor itself. Now the request goes to the relay's behaviour in process,
under the principal the kernel established when the agent's session attached: the supervisor
never connects to its own relay socket.

A real `mcphost supervise` hosting the relay, real tmux: agent A (in its pane) holds one MCP
session on its own `agentmux` attach entry open (`list` + `send` to the echo agent B); a second
session of A, run inside A's tree with `ctl exec A`, does `list`, `send` and `look` (B's pane
shows the message). While A's session is held, the supervisor holds no connection on its relay
socket (the kernel's `/proc/net/unix`), and at no point does the relay see a hello (its debug
events); the relay did serve A (its inscriptions). A raw socket-trust hello from A's tree while
A's session is held is refused as a claim conflict: the in-process session holds A's identity as
a connection would. Conditions only (`until`), no sleeps.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcphost.testing.devcenter import DevCenter
from tests.supervisor.agents.test_relayhost import HELLOS, drive
from tests.supervisor.supervise_harness import UNFENCED, Supervised
from tests.supervisor.test_supervise_relay_shared_stream import holding_party
from tests.waiting import until

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


@pytest.fixture
def held(tmp_path: Path, center: DevCenter) -> Iterator[Supervised]:
    # unfenced: the fence hides relay.sock from an agent's tree, and this test has a socket
    # client from A's own tree claim A beside its in-process session (confine/test_fence.py proves the
    # socket hidden)
    with holding_party(tmp_path, center, a_policy="lead", **UNFENCED) as sv:
        yield sv


def relay_connections(sv: Supervised) -> list[str]:
    """The supervisor's connected sockets on its relay socket (an accepted connection carries
    the listening socket's path in /proc/net/unix; the kernel's view, not the relay's)."""
    assert sv.proc is not None
    pid = sv.proc.pid
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    relay_sock = str(sv.state / "relay" / "relay.sock")
    hits = []
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        # Num RefCount Protocol Flags Type St Inode Path; St 03 = connected
        connected = len(fields) >= 8 and fields[5] == "03" and fields[6] in inodes
        if connected and fields[7] == relay_sock:  # not run/relay.sock, the attach hub's
            hits.append(line)
    return hits


def hellos(sv: Supervised) -> list[dict[str, object]]:
    return [e for e in sv.events() if str(e.get("event", "")).startswith("relay.connection.hello")]


def test_the_supervisor_never_connects_to_its_own_relay_socket(
    held: Supervised, tmp_path: Path
) -> None:
    sv = held
    workspace = sv.workspace("A")
    relay_root = sv.state / "relay"
    # the relay socket is served (for external clients) all along
    probe = socket.socket(socket.AF_UNIX)
    probe.connect(str(relay_root / "relay.sock"))
    probe.close()
    # A's own session opens, calls list + send, and stays open
    (workspace / "open").write_text("")
    until((workspace / "held-0.json").exists, 120, "A's own session to answer")
    assert json.loads((workspace / "held-0.json").read_text())["ok"], (
        workspace / "held-0.json"
    ).read_text()
    # a second session of A beside it: list, send, look
    marker = f"no-loopback-{uuid.uuid4().hex[:8]}"
    listed, sent, looked = drive(
        sv,
        [
            {"tool": "list", "args": {"command": "principals"}},
            {"tool": "send", "args": {"targets": ["B"], "message": marker}},
            {"tool": "look", "args": {"target_session": "B@party"}, "until": f"got: {marker}"},
        ],
    )
    assert not listed.get("isError") and not sent.get("isError"), (listed, sent)
    assert f"[B] got: {marker}" in json.dumps(looked), looked
    # A's session still held: its relay session is open, and no socket carries it
    assert relay_connections(sv) == []
    assert hellos(sv) == []
    # the relay served A: its inscriptions name A as the sender
    log = (relay_root / "inscriptions" / "relay.log").read_text()
    sends = [
        json.loads(line)
        for line in log.splitlines()
        if json.loads(line).get("event") == "relay.send.request"
    ]
    assert {s["details"]["requester_session"] for s in sends} == {"A@party"}, sends
    assert len(sends) >= 2, sends
    # A's identity is held by its in-process session: a socket client from A's own tree that
    # claims it meanwhile is refused as agentmux says (one live holder per principal)
    (tmp_path / "hellos.py").write_text(HELLOS)
    done = sv.ctl(
        "exec", "A", "--", sys.executable, str(tmp_path / "hellos.py"),
        str(relay_root / "relay.sock"), "A@party",
    )  # fmt: skip
    answer = json.loads(done.stdout)["A@party"]
    assert "runtime_identity_claim_conflict" in json.dumps(answer), answer
    # and A's own session still works afterwards
    (workspace / "round-1").write_text("")
    until((workspace / "held-1.json").exists, 120, "A's own session to answer again")
    assert json.loads((workspace / "held-1.json").read_text())["ok"], (
        workspace / "held-1.json"
    ).read_text()
    assert relay_connections(sv) == []
