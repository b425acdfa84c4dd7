"""Black-box: the supervisor as the bundle's relay, with its agents in real tmux (issue 13).

A bundle `party` of three stand-in agents (`runner = "tmux"`: small interactive programs that
print a prompt and echo each input line) under a real `mcphost supervise`. Agent A's relay tools
are driven from inside A's tree (`mcphost ctl exec A -- python driver.py`, the official MCP SDK
client on A's own `agentmux` attach entry), so every call goes pump -> supervisor -> relay tools
-> the relay socket (socket trust, vouched for by the kernel) -> the behaviour -> tmux. Through
them A lists the bundle (all ready), sends to B and sees it in B's pane with `look`, broadcasts,
uses `raww`, is refused what its policy forbids, and mints a PSK for the operator user
`ops@GLOBAL`; a raw socket-trust hello from inside A's tree finds no relay socket (the fence
hides it: A reaches its peers only through its attach entry, so the policies are a boundary;
which principal the kernel vouches for is test_socket_trust_only_where_the_kernel_vouches);
a killed pane restarts with a new generation; the test then connects to the relay socket as ops with that PSK (a wrong PSK and a
bare socket-trust hello are refused), takes the bundle `down` (every session stops, the tmux
server ends) and `up` again (new generations), and kills a client mid-request while others keep
being served. Conditions only (`until`), no sleeps.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from mcphost.testing.devcenter import DevCenter
from tests.supervisor.confine.test_kernel import isolated, until_async
from tests.supervisor.supervise_harness import Supervised, inline, payload
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

# Runs inside agent A (ctl exec): raw socket-trust hellos on the relay socket, one per principal
# (or the errno name that refused the connection).
HELLOS = """\
import errno, json, socket, sys
out = {}
for principal in sys.argv[2:]:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(sys.argv[1])
    except OSError as exc:
        out[principal] = {"error": errno.errorcode[exc.errno]}
        continue
    hello = {"frame": "hello", "schema_version": "1", "principal_id": principal,
             "identity_token": "socket-trust"}
    s.sendall(json.dumps(hello).encode() + b"\\n")
    out[principal] = json.loads(s.makefile("rb").readline())
    s.close()
print(json.dumps(out))
"""


def echo_agent(name: str) -> list[str]:
    """The echo agent's command (inline: see `inline`)."""
    return inline(ECHO_AGENT, name)


def write_party_fleet(sv: Supervised) -> None:
    """The bundle `party` of echo agents A (policy lead), B and C, in tmux, always restarted."""
    agents: list[dict[str, Any]] = []
    for agent in AGENTS:
        entry: dict[str, Any] = {"id": agent, "command": echo_agent(agent)}
        if agent == "A":
            entry["policy"] = "lead"
        agents.append(entry)
    sv.write_fleet(agents, bundle="party", runner="tmux", restart="always")


@contextmanager
def running_party(base: Path, center: DevCenter) -> Iterator[Supervised]:
    """A supervisor running the party (operator policies and users in its configuration root),
    every agent running; closed, its state removed, at the end."""
    sv = Supervised(base, center)
    operator = Path(tempfile.mkdtemp(prefix="mcphost-op-"))
    (operator / "policies.toml").write_text(POLICIES)
    (operator / "users.toml").write_text(USERS)
    sv.extra_env["AGENTMUX_CONFIGURATION_DIRECTORY"] = str(operator)
    write_party_fleet(sv)
    try:
        sv.start()
        for agent in AGENTS:
            sv.wait_running(agent)
        yield sv
    finally:
        sv.close()
        shutil.rmtree(operator, ignore_errors=True)
        shutil.rmtree(sv.state, ignore_errors=True)


@pytest.fixture
def party(tmp_path: Path, center: DevCenter) -> Iterator[Supervised]:
    """A party of its own, for the test that ends it (down, up, a graceful stop)."""
    with running_party(tmp_path, center) as sv:
        yield sv


@pytest.fixture(scope="module")
def shared_party(
    tmp_path_factory: pytest.TempPathFactory, center: DevCenter
) -> Iterator[Supervised]:
    """One party for the tests that crash-restart it or reload it, each leaving it as a fresh
    one: the same fleet, every agent running (a supervisor per test would prove nothing more;
    the restart after a crash is the crash test's own). SIGTERM must stop it with exit 0."""
    with running_party(tmp_path_factory.mktemp("shared-party"), center) as sv:
        yield sv
        assert sv.terminate() == 0, sv.stderr()[-3000:]


def drive(sv: Supervised, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run the ops through A's relay tools from inside A (ctl exec); their tool results. The
    driver runs inline: A is fenced, its /tmp is its own."""
    config = sv.state / "agents" / "A" / "mcp.json"
    done = subprocess.run(
        [sys.executable, "-m", "mcphost", "ctl", "--state", str(sv.state), "exec", "A", "--",
         sys.executable, "-c", DRIVER, str(config), json.dumps(ops)],
        capture_output=True, text=True, env=sv.env(), timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-3000:])
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return results


class Wire:
    """A raw client of the relay socket (newline-delimited JSON)."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(60)
        self.sock.connect(str(path))
        self.buffer = b""
        self.acked = True

    def __bool__(self) -> bool:
        return self.acked

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
        [
            {"tool": "list", "args": {"command": "principals"}},
            {"tool": "send", "args": {"targets": ["B"], "message": to_b}},
            {"tool": "look", "args": {"target_session": "B@party"}, "until": f"got: {to_b}"},
            {"tool": "send", "args": {"broadcast": True, "message": to_all}},
            {"tool": "look", "args": {"target_session": "B@party"}, "until": f"got: {to_all}"},
            {"tool": "look", "args": {"target_session": "C@party"}, "until": f"got: {to_all}"},
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
    assert f"[B] got: {to_b}" in json.dumps(look_b), look_b  # pasted, submitted, read by B
    live = sv.ctl("logs", "B").stdout  # ctl logs of a running tmux agent: its screen, now
    assert "tmux pane of B, generation 1, now" in live and f"[B] got: {to_b}" in live, live
    # broadcast reaches B and C
    assert not broadcast.get("isError"), broadcast
    assert f"[B] got: {to_all}" in json.dumps(look_b2), look_b2
    assert f"[C] got: {to_all}" in json.dumps(look_c), look_c
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

    # the relay's own socket straight from A's tree: hidden by A's fence, as any principal
    done = sv.ctl(
        "exec", "A", "--", sys.executable, "-c", HELLOS, str(relay_root / "relay.sock"),
        "A@party", "B@party",
    )  # fmt: skip
    answers = json.loads(done.stdout)
    assert answers == {p: {"error": "ENOENT"} for p in ("A@party", "B@party")}, answers

    # B's pane process killed: restarted like a plain process, a new generation, same session
    row = sv.status()["B"]
    os.kill(row["pid"], signal.SIGKILL)
    again = sv.wait_running("B", row["generation"] + 1)
    assert again["pid"] != row["pid"] and tmux_sessions(sv) == set(AGENTS), again

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
        logs = sv.ctl("logs", "B", "--lines", "200").stdout  # the pane's screen at each exit
        assert "[B] got: " in logs and "tmux pane of B" in logs, logs
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
        ops = until(lambda: _reconnect(sock, psk), 60, "ops to reconnect")
        listed_after = ops.request("list", "party")
        assert listed_after["bundle"]["state"] == "up", listed_after
        after = drive(
            sv,
            [{"tool": "look", "args": {"target_session": "B@party"}, "until": marker}],
        )
        assert marker in json.dumps(after[0]), after  # the request still reached B
    finally:
        ops.close()
    # a graceful stop leaves no tmux server and no pane behind
    pids = [row["pid"] for row in sv.status().values()]
    assert sv.terminate() == 0
    assert not (relay_root / "bundles" / "party" / "tmux.sock").exists()
    assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")], pids
    # the relay's inscriptions (§5), beside the relay tools' own: ids, sizes, outcomes only
    relay_log = relay_root / "inscriptions" / "relay.log"
    assert os.stat(relay_log).st_mode & 0o777 == 0o600
    inscribed = relay_log.read_text()
    kinds = {json.loads(line)["event"] for line in inscribed.splitlines()}
    for event in (
        "relay.list.response",
        "relay.send.request",
        "relay.send.envelope.metadata",
        "relay.delivery.outcome",
        "relay.look.response",
        "relay.raww.request",
        "relay.identity.principal_registered",
        "relay.bundle.down",
        "relay.bundle.up",
    ):
        assert event in kinds, (event, sorted(kinds))
    assert (
        relay_root / "inscriptions" / "bundles" / "party" / "sessions" / "A" / "mcp.log"
    ).exists()
    for secret in (psk, to_b, to_all, raw, marker):
        assert secret not in inscribed


def _reconnect(sock: Path, psk: str) -> Wire:
    """A new ops connection once the old one's claim is released (a falsy Wire: not yet)."""
    wire = Wire(sock)
    ack = wire.hello("ops@GLOBAL", psk)
    wire.acked = ack.get("frame") == "hello_ack"
    if not wire.acked:
        wire.close()
    return wire


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


# -- the parts on their own: TmuxRunner, socket trust, the generated layer ----------------------


def _blocked_on(pid: int, fifo: str) -> bool:
    """The process holds `fifo` open and sleeps: blocked reading it (the gate closes the FIFO
    as soon as its line has arrived, and a read with the line waiting does not sleep)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        fds = os.listdir(f"/proc/{pid}/fd")
        holds = any(_readlink(f"/proc/{pid}/fd/{fd}") == fifo for fd in fds)
    except FileNotFoundError:  # the pane is gone (or exec'd and exited)
        return False
    return holds and state == "S"


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except FileNotFoundError:
        return ""


def _ran(workspace: str, generation: int) -> bool:
    """Run N (generation N + 1 writes `run-N`) has started the agent's program."""
    return len(os.listdir(workspace)) >= generation


async def _tmux_runner_scenario(directory: str) -> dict[str, Any]:
    """A TmuxRunner on a real tmux server: restart per policy, a new generation per run, the
    pane's last screen in the log, stop ends the session and the server."""
    from mcphost.relay.tmux import TmuxServer
    from mcphost.supervisor.agents import runner
    from mcphost.supervisor.agents.runner import Collaborators
    from mcphost.supervisor.agents.tmux import TmuxRunner
    from mcphost.supervisor.confine.kernel import Reaper, set_child_subreaper
    from mcphost.supervisor.state import StateStore
    from tests.supervisor.agents.test_runner import StubHome, StubPlan
    from tests.supervisor.confine.test_kernel import until_async

    set_child_subreaper()
    runner.emit = lambda *a, **k: None
    store = StateStore(os.path.join(directory, "state.sqlite3"))
    reaper = Reaper()
    reaper.install()
    workspace = os.path.join(directory, "workspace")
    os.makedirs(workspace)
    home = StubHome(workspace, os.path.join(directory, "logs"))
    server = TmuxServer(os.path.join(directory, "bundle"), watch=reaper.watch)
    spawns: list[tuple[int, int, int]] = []
    exits: list[int] = []
    ran_before_registered: list[bool] = []

    def on_spawn(runner: Any, pid: int, start: int, gen: int) -> None:
        # The gate holds the pane until on_spawn returns: wait until the pane is seen blocked
        # reading its gate, or the agent has run (it writes run-N); only the first may happen.
        gate = os.path.realpath(os.path.join(directory, "bundle", "agent-1.gate"))
        until(lambda: _blocked_on(pid, gate) or _ran(workspace, gen), 30, "gate or run")
        ran_before_registered.append(_ran(workspace, gen))
        spawns.append((pid, start, gen))

    script = (
        "import os, sys, time; n = len(os.listdir('.')); open(f'run-{n}', 'w').close(); "
        "print(f'hello from run {n}', flush=True); sys.exit(3) if n < 3 else time.sleep(1000)"
    )
    given = Collaborators(
        store=store,
        reaper=reaper,
        on_spawn=on_spawn,
        on_exit=lambda r, gen: exits.append(gen),
        argv=[sys.executable, "-c", script],
        env={"PATH": os.environ["PATH"], "BAD%NAME": "dropped"},
    )
    runner = TmuxRunner(StubPlan(agent_id="agent-1", stop_grace=0.5), home, given, server=server)
    await runner.start()
    await until_async(lambda: len(spawns) >= 4 and runner.status().state == "running", "run 4")
    pane_pid = spawns[-1][0]
    parents = Path(f"/proc/{pane_pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
    running = runner.status()
    await until_async(lambda: os.path.exists(os.path.join(workspace, "run-3")), "run 3 files")
    sessions_running = await server.sessions()
    await runner.stop()
    stopped = runner.status()
    server_after = await server.server_pid()
    await runner.aclose()
    log = Path(directory, "logs", "agent.log").read_text()
    reaper.uninstall()
    store.close()
    return {
        "generations": [gen for _, _, gen in spawns][:4],
        "exits": exits[:3],
        "starttimes": all(start > 0 for _, start, _ in spawns),
        "running": (str(running.state), running.pid == pane_pid, running.last_exit),
        "pane_parent_is_tmux": int(parents) != os.getpid(),
        "sessions_running": sessions_running,
        "stopped": (str(stopped.state), stopped.pid),
        "server_after_stop": server_after,
        "log_has_runs": all(f"hello from run {n}" in log for n in range(3)),
        "ran_before_registered": any(ran_before_registered),
        "gate_left": os.path.exists(os.path.join(directory, "bundle", "agent-1.gate")),
    }


def test_a_tmux_runner_restarts_like_a_process_and_stop_ends_its_server(tmp_path: Path) -> None:
    from tests.supervisor.confine.test_kernel import isolated

    directory = tempfile.mkdtemp(prefix="mcphost-tr-")  # short: the tmux socket lives here
    try:
        out = isolated(_tmux_runner_scenario, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    assert out == {
        "generations": [1, 2, 3, 4],
        "exits": [1, 2, 3],
        "starttimes": True,
        "running": ("running", True, "exit 3"),
        "pane_parent_is_tmux": True,
        "sessions_running": {"agent-1": True},
        "stopped": ("stopped", None),
        "server_after_stop": None,
        "log_has_runs": True,
        "ran_before_registered": False,
        "gate_left": False,
    }


class _Slot:
    def __init__(self, agent_id: str, bundle: str | None, uid: int) -> None:
        from mcphost.supervisor.plan import AgentDefaults, apply_defaults

        self.plan = apply_defaults(AgentDefaults(bundle=bundle, runner="tmux"), agent_id)
        self.runner: Any = None
        self.uid = uid


class _Agents:
    def __init__(self) -> None:
        from mcphost.supervisor.identity import Identities

        self.slots: dict[str, Any] = {}
        self.identities = Identities()


class _LockedAgents(_Agents):
    """`_Agents` with the supervisor's per-agent lock (`agent_held`), counting who waits on it."""

    def __init__(self) -> None:
        super().__init__()
        self.locks: dict[str, Any] = {}
        self.waiting = 0

    @asynccontextmanager
    async def agent_held(self, agent_id: str) -> AsyncIterator[None]:
        import asyncio

        lock = self.locks.setdefault(agent_id, asyncio.Lock())
        self.waiting += 1
        async with lock:
            self.waiting -= 1
            yield


async def _up_racing_a_replacement(directory: str) -> dict[str, Any]:
    """The relay's `up` while a reconciliation replaces the member: it holds the agent's lock,
    swaps the slot's runner and closes the old one; `up` must start the new one, never the old."""
    import asyncio
    from types import SimpleNamespace

    from mcphost.supervisor.agents.relayhost import RelayHost
    from mcphost.supervisor.agents.runner import AgentRunner
    from tests.supervisor.agents.test_runner import Rig, StubPlan

    rig = Rig(directory, StubPlan(agent_id="A"), ["/usr/bin/sleep", "1000"])
    new_spawns: list[int] = []
    given = rig.given(on_spawn=lambda r, pid, start, gen: new_spawns.append(pid))
    new = AgentRunner(rig.plan, rig.home, given)
    agents = _LockedAgents()
    agents.slots["A"] = _Slot("A", "party", os.getuid())
    agents.slots["A"].runner = rig.runner
    host = RelayHost(os.path.join(directory, "state"), {}, agents)
    bundle: Any = SimpleNamespace(id="party")
    async with agents.agent_held("A"):  # the reconciliation replacing A
        up = asyncio.ensure_future(host.up(bundle))
        await until_async(lambda: agents.waiting or up.done(), "up to wait for A or be done")
        replacement = _Slot("A", "party", os.getuid())
        replacement.runner = new
        agents.slots["A"] = replacement
        await rig.runner.aclose()
        await new.start()
    await up  # then found the new A running
    out = {
        "old_spawns": len(rig.spawns),
        "new_spawns": len(new_spawns),
        "new_state": new.status().state,
    }
    await host.down(bundle)
    out["after_down"] = new.status().state
    await new.aclose()
    await rig.close()
    return out


def test_relay_up_waits_for_the_agents_lock_and_never_starts_a_discarded_runner(
    tmp_path: Path,
) -> None:
    assert isolated(_up_racing_a_replacement, str(tmp_path)) == {
        "old_spawns": 0,
        "new_spawns": 1,
        "new_state": "running",
        "after_down": "stopped",
    }


class _Member:
    """A runner as the relay host asks it, whatever its kind: its state, endpoint, readiness."""

    def __init__(self, state: str, endpoint: object, ready: bool) -> None:
        from mcphost.supervisor.agents.states import AgentState

        self.state, self._endpoint, self._ready = AgentState(state), endpoint, ready

    def status(self) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(state=self.state)

    def endpoint(self) -> object:
        return self._endpoint

    def ready(self) -> bool:
        return self._ready


def test_the_host_asks_a_members_runner_for_its_endpoint_and_readiness(tmp_path: Path) -> None:
    """No kind of runner is known to the relay host: a member's endpoint and readiness are its
    runner's answers; only `runner = "tmux"` or `"acp"` agents of the bundle are members."""
    from types import SimpleNamespace

    from mcphost.relay.hosting import MemberHealth
    from mcphost.supervisor.agents.relayhost import RelayHost

    agents = _Agents()
    agents.slots = {a: _Slot(a, "party", os.getuid()) for a in ("A", "B", "P")}
    agents.slots["A"].runner = _Member("running", "A's endpoint", True)
    agents.slots["B"].runner = _Member("failed", None, False)
    agents.slots["P"].runner = _Member("running", "never asked", True)
    agents.slots["P"].plan = dataclasses_replace(agents.slots["P"].plan, runner="process")
    host = RelayHost(str(tmp_path), {}, agents)
    party: Any = SimpleNamespace(id="party")
    assert host.member_endpoint(party, "A") == "A's endpoint"
    assert host.member_state(party, "A") == (True, MemberHealth())
    assert host.member_endpoint(party, "B") is None
    assert host.member_state(party, "B") == (False, MemberHealth(1, stopped=True))
    assert host.member_endpoint(party, "P") is None  # a process agent: no member kind's
    assert host.member_state(party, "P") == (False, MemberHealth())
    assert host.member_endpoint(SimpleNamespace(id="other"), "A") is None  # not its bundle
    assert host.hosted(party) and host._members("party") == ["A", "B"]


def test_socket_trust_only_where_the_kernel_vouches(tmp_path: Path) -> None:
    from mcphost.peer import PeerCred
    from mcphost.supervisor.agents.relayhost import RelayHost
    from mcphost.supervisor.confine.kernel import proc_starttime

    agents = _Agents()
    agents.slots = {
        "A": _Slot("A", "party", os.getuid()),
        "B": _Slot("B", "party", os.getuid()),
        "solo": _Slot("solo", None, os.getuid()),
    }
    host = RelayHost(str(tmp_path), {}, agents)
    me = PeerCred(os.getpid(), os.getuid(), os.getgid(), None)
    # our own pid is no agent: the supervisor's relay tools reach the relay in process (issue
    # #20), so nothing of the supervisor ever says hello on its own relay socket
    assert not host.socket_trust("A@party", me)
    assert not host.socket_trust("A@other", me)
    assert not host.socket_trust("solo@party", me)
    assert not host.socket_trust("ops@GLOBAL", me)
    assert not host.socket_trust("A@party", None)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        cred = PeerCred(child.pid, os.getuid(), os.getgid(), None)
        assert not host.socket_trust("A@party", cred)  # not under any root
        start = proc_starttime(child.pid)
        assert start is not None
        agents.identities.spawned("A", (child.pid, start), 1)
        assert host.socket_trust("A@party", cred)
        assert not host.socket_trust("B@party", cred)  # A's tree cannot speak as B
        other_uid = PeerCred(child.pid, os.getuid() + 1, os.getgid(), None)
        assert not host.socket_trust("A@party", other_uid)
        agents.identities.spawned("A", (child.pid, start + 1), 1)
        assert not host.socket_trust("A@party", cred)  # a reused pid never matches
    finally:
        child.kill()
        child.wait()


def test_the_generated_layer_reads_strictly_and_names_the_fleet(tmp_path: Path) -> None:
    import asyncio

    from mcphost.agentmux.bundlefile import load_bundle
    from mcphost.relay.policy import load_policies, member_policy
    from mcphost.supervisor.agents.relayhost import RelayHost
    from mcphost.supervisor.plan import AgentDefaults, Fleet, apply_defaults

    state = tmp_path / "state"
    base = AgentDefaults(bundle="party", runner="tmux", client="command", command=("echo", "hi"))
    plans = (
        apply_defaults(base, "A"),
        dataclasses_replace(apply_defaults(base, "B"), policy="operator"),
        apply_defaults(AgentDefaults(client="command", command=("x",)), "solo"),
    )
    fleet = Fleet(path="f.toml", center=None, agents=plans)  # type: ignore[arg-type]
    host = RelayHost(str(state), {"AGENTMUX_STATE_DIRECTORY": "/elsewhere"}, _Agents())
    asyncio.run(host.configure(fleet))
    assert not host.serving  # an operator's AGENTMUX_STATE_DIRECTORY: an external relay
    assert os.stat(state / "relay").st_mode & 0o777 == 0o700
    bundle = load_bundle(host.configuration_roots, "party")
    assert bundle is not None
    assert [(s.id, s.transport, s.policy) for s in bundle.sessions] == [
        ("A", "tmux", None),
        ("B", "tmux", "operator"),
    ]
    assert bundle.sessions[0].directory == str(state / "agents" / "A" / "workspace")
    policies = load_policies(host.configuration_roots)
    assert member_policy(policies, bundle.sessions[1]).id == "operator"
    # the relay's in-memory layer (issue #20) is what the files say, coders included
    in_memory = host.bundles()["party"]
    assert in_memory == bundle
    assert [in_memory.coder_for(s) for s in in_memory.sessions] == [
        bundle.coder_for(s) for s in bundle.sessions
    ]
    # a bundle gone from the fleet is gone from the layer
    asyncio.run(host.configure(dataclasses_replace(fleet, agents=plans[2:])))
    assert load_bundle(host.configuration_roots, "party") is None
    assert "party" not in host.bundles()


def test_every_member_kind_reads_back_as_itself_in_memory_on_disk_and_in_the_tools_listing(
    tmp_path: Path,
) -> None:
    """Issue #33: one model of the fleet's bundle, held in memory for the relay and written for
    file readers: read back by the relay (strict) and by the relay tools (lenient), every runner
    the fleet has gives the same member kind, and the relay tools' listing of the bundle while
    its relay is down names it too (a process agent was a tmux coder on disk, so the tools
    called it tmux). The runners are every kind the relay hosts (`relay.members.KINDS`) and
    `process`, which none hosts: a new kind is a new runner here. (Any string a command may hold
    round-trips through the writer: tests/agentmux/test_bundlefile.py.)"""
    from mcphost.agentmux.bundlefile import LENIENT, load_bundle
    from mcphost.relay import members
    from mcphost.relaytools.handlers import synthesized_home
    from mcphost.relaytools.layout import resolve

    host, runners = _every_member_kind(tmp_path)
    kinds = [(f"{r}-1", r) for r in runners]

    memory = host.bundles()["party"]
    strict = load_bundle([host.config], "party")
    lenient = load_bundle([host.config], "party", reading=LENIENT)
    assert strict is not None and lenient is not None
    for bundle in (memory, strict, lenient):
        assert [(s.id, s.transport) for s in bundle.sessions] == kinds
        assert [bundle.coder_for(s).transport for s in bundle.sessions] == runners  # type: ignore[union-attr]
    assert strict == memory and dict(strict.coders) == dict(memory.coders)
    hosted = [members.kind_of(memory, s) for s in memory.sessions]
    assert [k is not None for k in hosted] == [r in members.KINDS for r in runners]

    layout = resolve(
        bundle_flag="party",
        session_flag="tmux-1",
        configuration_flags=[str(host.config)],
        state_flag=str(tmp_path / "no-relay"),
        env={},
    )
    assert layout.associated, layout
    listed = synthesized_home(layout, "party", socket_present=False)["principals"]
    assert [(p["id"], p["transport"], p["ready"]) for p in listed] == [
        (f"{agent}@party", kind, False) for agent, kind in kinds
    ]


def _every_member_kind(tmp_path: Path) -> tuple[Any, list[str]]:
    """A configured `RelayHost` (an external relay: not serving) whose bundle `party` has one
    agent of every runner (`<runner>-1`, in the order `Runner` names them), and the runners:
    every kind the relay hosts (`relay.members.KINDS`) and `process`, which none hosts."""
    import asyncio
    import typing

    from mcphost.relay import members
    from mcphost.supervisor.agents.relayhost import RelayHost
    from mcphost.supervisor.plan import AgentDefaults, Fleet, Runner, apply_defaults

    runners = [r for r in typing.get_args(Runner) if r != "auto"]
    assert set(runners) == {*members.KINDS, "process"}
    base = AgentDefaults(bundle="party", client="command", command=("echo", "hi"))
    plans = tuple(apply_defaults(dataclasses_replace(base, runner=r), f"{r}-1") for r in runners)
    fleet = Fleet(path="f.toml", center=None, agents=plans)  # type: ignore[arg-type]
    host = RelayHost(str(tmp_path / "state"), {"AGENTMUX_STATE_DIRECTORY": "/x"}, _Agents())
    asyncio.run(host.configure(fleet))
    return host, runners


def test_the_written_agentmux_files_are_agentmux_s_own_for_every_member_kind(
    tmp_path: Path,
) -> None:
    """`coders.toml` and `bundles/<b>.toml` are agentmux's (an agentmux CLI pointed at the
    directory reads them): checked here by agentmux's own rules, from the reference
    (agentmux-relay.md §3.1, acp.md §1), not by our reader. They hold the tmux and ACP members;
    the process member (agentmux has no such coder) is in the side file `mcphost/members.toml`,
    which agentmux never reads (not under `bundles/`, whose files are bundle ids)."""
    import tomllib

    host, runners = _every_member_kind(tmp_path)
    config = host.config
    assert sorted(os.listdir(config / "bundles")) == ["party.toml"]
    coders = _agentmux_coders(tomllib.loads((config / "coders.toml").read_text()))
    bundle = tomllib.loads((config / "bundles" / "party.toml").read_text())
    listed = _agentmux_members(bundle, coders)
    assert listed == [(f"{r}-1", r) for r in runners if r != "process"]
    side = tomllib.loads((config / "mcphost" / "members.toml").read_text())
    assert [(m["bundle"], m["id"]) for m in side["sessions"]] == [("party", "process-1")]
    assert [set(c) - {"id"} for c in side["coders"]] == [{"process"}]


AGENTMUX_TMUX_KEYS = {
    "initial-command",
    "resume-command",
    "prompt-regex",
    "prompt-inspect-lines",
    "prompt-idle-column",
    "prime-timeout-ms",
    "readiness-timeout-ms",
    "wedge-detection",
}
AGENTMUX_CODER_SHAPES = {
    "tmux": AGENTMUX_TMUX_KEYS,
    "acp": {"channel", "command", "url", "headers"},
    "pty": AGENTMUX_TMUX_KEYS | {"cols", "rows", "term-protocol"},
}


def _agentmux_coders(doc: dict[str, Any]) -> dict[str, str]:
    """coder id -> shape, by agentmux's rules for `coders.toml` (asserted): known keys only
    (`deny_unknown_fields`), `format-version = 1`, each coder an `id` and exactly one of
    `[coders.tmux]`, `[coders.acp]` or `[coders.pty]`; an ACP stdio coder a non-empty
    `command` and no `url`."""
    assert set(doc) <= {"format-version", "coders"} and doc.get("format-version", 1) == 1
    out: dict[str, str] = {}
    for coder in doc.get("coders", []):
        assert set(coder) <= {"id", "environment", *AGENTMUX_CODER_SHAPES}, coder
        assert isinstance(coder["id"], str) and coder["id"] not in out
        shapes = [shape for shape in AGENTMUX_CODER_SHAPES if shape in coder]
        assert len(shapes) == 1, coder
        body = coder[shapes[0]]
        assert set(body) <= AGENTMUX_CODER_SHAPES[shapes[0]], coder
        if shapes[0] == "acp":
            assert body["channel"] == "stdio" and body["command"].strip() and "url" not in body
        else:
            assert body["initial-command"].strip()
        out[coder["id"]] = shapes[0]
    return out


def _agentmux_members(doc: dict[str, Any], coders: dict[str, str]) -> list[tuple[str, str]]:
    """(member id, its coder's shape) by agentmux's rules for `bundles/<b>.toml` (asserted):
    known keys only, each member an `id`, a `directory` and exactly one shape, its coder
    defined in `coders.toml`."""
    assert set(doc) <= {"format-version", "autostart", "groups", "environment", "sessions"}
    assert doc.get("format-version", 1) == 1
    session_keys = {"id", "name", "directory", "policy", "coder", "coder-session-id"}
    out: list[tuple[str, str]] = []
    for member in doc.get("sessions", []):
        assert set(member) <= session_keys | {"ui", "pubsub", "environment", "groups"}, member
        assert member["id"] not in {m for m, _ in out} and member["directory"].startswith("/")
        assert [shape for shape in ("coder", "ui", "pubsub") if shape in member] == ["coder"]
        assert member["coder"] in coders, member
        out.append((member["id"], coders[member["coder"]]))
    return out


def dataclasses_replace(obj: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(obj, **changes)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_crashed_supervisors_tmux_is_swept_at_the_next_start(shared_party: Supervised) -> None:
    sv = shared_party
    old = {agent: sv.status()[agent]["pid"] for agent in AGENTS}
    assert sv.proc is not None
    sv.proc.kill()  # no graceful stop: the daemonized tmux server and its panes outlive it
    sv.proc.wait(60)
    assert all(_alive(pid) for pid in old.values()), old
    sv.start()
    for agent in AGENTS:
        row = sv.wait_running(agent)
        assert row["pid"] != old[agent], (row, old)
    until(lambda: not any(_alive(pid) for pid in old.values()), 60, "the old panes to end")
    assert tmux_sessions(sv) == set(AGENTS)
    assert any(e.get("event") == "supervisor.relay_swept" for e in sv.events(this_run=True))


def test_a_reload_regenerates_the_bundle_and_reconciles_its_sessions(
    shared_party: Supervised, tmp_path: Path
) -> None:
    sv = shared_party
    before = {agent: sv.wait_running(agent) for agent in AGENTS}
    # A's policy changes (restart), B is unchanged (untouched), C leaves the fleet
    sv.write_fleet(
        [
            {"id": "A", "command": echo_agent("A"), "policy": "operator"},
            {"id": "B", "command": echo_agent("B")},
        ],
        bundle="party",
        runner="tmux",
        restart="always",
    )
    try:
        sv.ctl("reload")
        row_a = sv.wait_running("A", before["A"]["generation"] + 1)
        status = sv.status()
        assert status["B"]["pid"] == before["B"]["pid"]
        assert "C" not in status and tmux_sessions(sv) == {"A", "B"}, row_a
        generated = (sv.state / "relay" / "config" / "bundles" / "party.toml").read_text()
        assert 'id = "C"' not in generated and 'policy = "operator"' in generated, generated
        listed = drive(sv, [{"tool": "list", "args": {"command": "principals"}}])[0]
        bundles = {b["id"]: b for b in payload(listed)["bundles"]}
        members = {p["id"]: p["ready"] for p in bundles["party"]["principals"]}
        assert members == {"A@party": True, "B@party": True}, listed
    finally:  # the party as the module started it: A back on its policy, C back
        write_party_fleet(sv)
        sv.ctl("reload")
    sv.wait_running("A", before["A"]["generation"] + 2)
    sv.wait_running("C")
    until(lambda: tmux_sessions(sv) == set(AGENTS), 60, "the party's tmux sessions back")


async def _without_tmux(directory: str) -> dict[str, Any]:
    """No tmux on PATH: a tmux agent's spawn fails (named), it does not crash anything."""
    from mcphost.supervisor.agents import runner
    from mcphost.supervisor.agents.relayhost import RelayHost
    from mcphost.supervisor.agents.runner import Collaborators
    from mcphost.supervisor.agents.tmux import TmuxRunner
    from mcphost.supervisor.confine.kernel import Reaper
    from mcphost.supervisor.state import StateStore
    from tests.supervisor.agents.test_runner import StubHome, StubPlan
    from tests.supervisor.confine.test_kernel import until_async

    runner.emit = lambda *a, **k: None
    store = StateStore(os.path.join(directory, "state.sqlite3"))
    reaper = Reaper()
    reaper.install()
    os.makedirs(os.path.join(directory, "workspace"))
    host = RelayHost(directory, {"PATH": directory}, _Agents(), watch=reaper.watch)  # no tmux
    ignore = lambda *a: None  # noqa: E731
    given = Collaborators(
        store=store, reaper=reaper, on_spawn=ignore, on_exit=ignore, argv=["true"], env={}
    )
    runner = TmuxRunner(
        StubPlan(agent_id="A", restart="never"),
        StubHome(os.path.join(directory, "workspace"), os.path.join(directory, "logs")),
        given,
        server=host.tmux_server("party"),
    )
    await runner.start()
    await until_async(lambda: runner.status().state == "failed", "failed")
    status = runner.status()
    await runner.aclose()
    await host.aclose()
    reaper.uninstall()
    store.close()
    return {"state": str(status.state), "reason": status.last_reason}


def test_without_tmux_a_tmux_agent_fails_its_spawn_and_says_why(tmp_path: Path) -> None:
    from tests.supervisor.confine.test_kernel import isolated

    directory = tempfile.mkdtemp(prefix="mcphost-nt-")
    try:
        out = isolated(_without_tmux, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    assert out["state"] == "failed", out
    assert "cannot start tmux session 'A'" in out["reason"], out
    assert "tmux-not-found-on-PATH" in out["reason"], out


def test_an_agent_in_a_pane_attaches_as_itself(tmp_path: Path, center: DevCenter) -> None:
    """The stand-in client runs *in* its tmux pane: its pumps descend from the pane's process
    (the registered root), so both surfaces serve it as D, and its relay tools reach the real
    relay as D@solo."""
    from tests.supervisor.supervise_harness import standin

    sv = Supervised(tmp_path, center)
    try:
        sv.write_fleet(
            [
                {
                    "id": "D",
                    "command": standin(
                        "--relay-call", "list", "--relay-args", '{{"command": "principals"}}',
                        "--hold",
                    ),
                }
            ],
            bundle="solo",
            runner="tmux",
        )  # fmt: skip
        sv.start()
        until(lambda: len(sv.calls("D")) >= 2, 120, "D's two calls")
        calls = sv.calls("D")
        by_server = {c["server"]: c for c in calls}
        heard = json.dumps(by_server["agent-center"])  # the center knows no D: it says so
        assert by_server["agent-center"]["ok"] or "agent 'D' does not exist" in heard, heard
        assert by_server["agentmux"]["ok"], by_server["agentmux"]
        # the pane's agent: the first process after bubblewrap's init in its own PID namespace
        assert by_server["agent-center"]["agent_pid"] == 2
        listed = json.dumps(by_server["agentmux"]["result"])
        assert "D@solo" in listed and '\\"ready\\":true' in listed, listed
    finally:
        sv.close()
        shutil.rmtree(sv.state, ignore_errors=True)


def test_a_process_agent_of_a_bundle_is_listed_as_what_it_is(tmp_path: Path) -> None:
    """A `runner = "process"` member speaks through its relay tools, but nothing can be
    delivered to it (no pane, no ACP): its session says `process`, which no member kind hosts
    (a target refused with `runtime_session_type_not_implemented`), and the bundle's
    `degraded` names the members that are not ready."""
    import asyncio

    from mcphost.relay import members
    from mcphost.relay.ops.listing import listed_bundle
    from mcphost.supervisor.agents.relayhost import RelayHost
    from mcphost.supervisor.plan import AgentDefaults, Fleet, apply_defaults

    base = AgentDefaults(bundle="party", client="command", command=("echo", "hi"))
    plans = (
        apply_defaults(base, "P"),
        apply_defaults(dataclasses_replace(base, runner="tmux"), "T"),
    )
    fleet = Fleet(path="f.toml", center=None, agents=plans)  # type: ignore[arg-type]
    host = RelayHost(str(tmp_path / "state"), {"AGENTMUX_STATE_DIRECTORY": "/x"}, _Agents())
    asyncio.run(host.configure(fleet))
    bundle = host.bundles()["party"]
    assert [(s.id, s.transport) for s in bundle.sessions] == [("P", "process"), ("T", "tmux")]
    assert members.kind_of(bundle, bundle.sessions[0]) is None

    class Ready:  # the host's word: T runs, P is a process (never ready)
        def member_state(self, b: Any, session_id: str) -> tuple[bool, Any]:
            from mcphost.relay.hosting import MemberHealth

            return session_id == "T", MemberHealth()

        def member_endpoint(self, b: Any, session_id: str) -> Any:
            from mcphost.relay.members.tmux import TmuxEndpoint

            return TmuxEndpoint(None, session_id) if session_id == "T" else None  # type: ignore[arg-type]

        def hosted(self, b: Any) -> bool:
            return True

    from mcphost.relay.state import RelayState

    state = RelayState.__new__(RelayState)
    state.host = Ready()  # type: ignore[assignment]
    state.choices = {}
    state.quiet_ms, state.poll_ms = 750, 50
    listed = listed_bundle(state, bundle)
    assert [(p.id, p.transport, p.ready) for p in listed.principals] == [
        ("P@party", "process", False),
        ("T@party", "tmux", True),
    ]
    assert (listed.startup_health, listed.state_reason_code) == (
        "degraded",
        "runtime_members_not_ready",
    )
    assert listed.state_reason == "1 of 2 members are not ready: P@party"
