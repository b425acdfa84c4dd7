"""Black-box: the fence (fence.py) around every agent's tree, with the default fleet (no `user`).

A real `mcphost supervise`, run as root and again as an unprivileged user (nobody, with a state
directory and token file it owns), runs a hostile stand-in agent (tests/supervisor/fence_probe.py)
next to another agent in a tmux pane of its own. The hostile agent, a `setsid` escapee it starts,
and a `ctl exec` command each try every forbidden thing as a separate probe (the token and fleet
files, the state file, logs, the other agent's home, the control socket, tmux sockets, signals and
ptrace of the supervisor and the other agent, writes outside, undoing the fence from a nested
namespace, the other agent's cgroups and the host's group above them under /sys/fs/cgroup, a write
to its own group) and every allowed one (workspace, home, /bin/sh, the attach socket, a loopback
TCP server, a private /tmp, its own cgroups read-only); the hostile agent's MCP call still reaches
the center as itself. The hostile agent runs as a plain process and as a tmux pane. `sandbox =
"none"` is the control: the same probes get through, so the test can fail.
"""

from __future__ import annotations

import ctypes
import json
import os
import pwd
import shutil
import signal
import socket
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mcphost import gate
from mcphost.supervisor.agents import signin
from mcphost.supervisor.confine import cgroups
from mcphost.supervisor.confine import probe as machine
from mcphost.testing.devcenter import DevCenter
from tests.supervisor.agents.test_signin import CREDENTIALS, OAUTH, RECORD
from tests.supervisor.supervise_harness import (
    AS_ROOT,
    REPO,
    UNFENCED,
    Supervised,
    fleet_toml,
    group_dirs,
    inline,
    standin,
)
from tests.supervisor.test_supervise_state import tagged
from tests.supervisor.test_supervise_user import run_as
from tests.waiting import until

PROBE = str(Path(__file__).parents[1] / "fence_probe.py")
FORBIDDEN = (
    "read_token", "read_fleet", "read_state_db", "read_other_log", "read_own_log",
    "read_other_home", "write_other_home", "write_outside", "connect_control", "control_status",
    "connect_other_tmux", "connect_own_tmux", "kill_supervisor", "kill_other",
    "ptrace_supervisor", "ptrace_other", "supervisor_environ", "undo",
    "read_other_relative", "open_other_pts", "read_other_cmdline", "connect_run_socket",
    "write_dev",
    "same_keyring",
    "read_other_cgroup", "list_other_cgroup", "read_host_cgroup", "write_own_cgroup",
)  # fmt: skip
# What the same probes reach without the fence (the control): every forbidden one but the
# control socket's request (its second wall), the hostile agent's own tmux socket (a process
# agent has none), ptrace (not tried unfenced: a tracer that stays would freeze its tracee) and
# `undo` (nothing to undo).
UNFENCED_THROUGH = tuple(
    name
    for name in FORBIDDEN
    if name
    not in (
        "control_status", "connect_own_tmux", "ptrace_supervisor", "ptrace_other", "undo",
        "connect_run_socket", "same_keyring",  # the socket: root runs only; the keyring: below
        "write_dev",  # tried fenced only
    )
)  # fmt: skip
TMP_SIZE = 16 << 20  # the fleet's tmp_size in these runs: each private tmpfs is this large
ALLOWED = (
    "write_workspace", "write_home", "run_sh", "connect_attach", "tcp_loopback", "tmp_write",
    "var_tmp_write",
)  # fmt: skip
SUPPORTED = machine.probe().missing() is None
# deep (make test-slow): five supervisors (root and nobody) with hostile fenced agents.
pytestmark = [
    pytest.mark.deep,
    pytest.mark.skipif(not SUPPORTED, reason=f"no fence here: {machine.probe().missing()}"),
]


@pytest.fixture(scope="module")
def center(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCenter]:
    """The reference center over TCP too: a supervisor of any uid reaches it (pinned)."""
    with DevCenter.start(tmp_path_factory.mktemp("center"), tcp=True) as running:
        yield running


@pytest.fixture
def loopback() -> Iterator[int]:
    """A TCP server on 127.0.0.1 that accepts and closes: its port."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


class AsUser(Supervised):
    """A supervisor run as `uid` (nobody) through setpriv, everything it needs owned by it."""

    def __init__(self, base: Path, center: DevCenter, uid: int | None) -> None:
        super().__init__(base, center)
        self.uid = uid
        if uid is not None:
            for path in (base, self.state, self.token_file):
                os.chown(path, uid, uid)
            run_as(self, pwd.getpwuid(uid))  # an interpreter that user can run

    def argv(self) -> list[str]:
        argv = super().argv()
        if self.uid is None:
            return argv
        ids = [f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups"]
        return ["setpriv", *ids, *argv]


def run_fleet(
    sv: AsUser,
    center: DevCenter,
    runner: str,
    sandbox: str,
    port: int,
    outside: Path,
    *,
    level: str | None = None,
    while_running: Callable[[], None] | None = None,
) -> dict[str, dict[str, str]]:
    """Every probe's outcome, by mode (`agent`, `escapee`, `exec`), once the fleet ran them.
    `level`: the fence level the agents must show (default: this machine's); `while_running`
    is called once every probe is in, before the supervisor stops."""
    marker = Path(tempfile.mkdtemp(prefix="fence-marker-")) / "host-only"
    marker.write_text("host")
    os.chmod(marker.parent, 0o755)
    run_socket = _run_socket() if sv.uid is None else None
    exec_tag = f"mcphost-exec-escapee-{uuid.uuid4().hex}"
    cfg = {
        "state": str(sv.state), "me": "hostile", "other": "other", "token": str(sv.token_file),
        "fleet": str(sv.fleet), "port": port, "fenced": sandbox != "none", "outside": str(outside), "marker": str(marker),
        "run_socket": run_socket.getsockname() if run_socket else "", "keyring": session_keyring(),
        "exec_tag": exec_tag,
    }  # fmt: skip
    braced = json.dumps(cfg).replace("{", "{{").replace("}", "}}")  # no placeholder
    hostile = {
        "id": "hostile",
        "runner": runner,
        "command": [sv.python, PROBE, "agent", braced, sv.python, *standin("--hold")[1:]],
    }
    other = {"id": "other", "runner": "tmux", "command": [sv.python, "-c", HOLD]}
    # unfenced, as the supervisor's uid: the control, where nothing but the fence changes
    unfenced = UNFENCED if sandbox == "none" else {"sandbox": sandbox}
    text = fleet_toml(center, sv.token_file, [hostile, other], tmp_size=TMP_SIZE, **unfenced)
    # the tcp:// binding, which a supervisor of any uid reaches (the unix socket is root's)
    text = text.replace(
        f'admin_url = "{center.admin_url("unix")}"',
        f'admin_url = "{center.admin_url("tcp")}"\nfingerprint = "{center.fingerprint}"',
    )
    sv.fleet.write_text(text)
    if sv.uid is not None:
        os.chown(sv.fleet, sv.uid, sv.uid)
    sv.extra_env.setdefault("PYTHONPATH", REPO)
    sv.start()
    try:
        until(lambda: sv.status()["hostile"]["state"] != "starting", 60, "a first spawn")
        assert sv.status()["hostile"]["state"] == "running", json.dumps(
            [sv.status()["hostile"], [e for e in sv.events() if "hostile" in str(e)][-6:]]
        )
        hostile_row = sv.wait_running("hostile")
        other_row = sv.wait_running("other")
        expected = "none" if sandbox == "none" else (level or machine.probe().level())
        assert hostile_row["sandbox"] == expected, hostile_row
        workspace = sv.workspace("hostile")
        go = {
            "supervisor": sv.proc.pid if sv.proc else 0,
            "other": other_row["pid"],
            "cgroups": {"own": _groups(sv, "hostile"), "other": _groups(sv, "other")},
        }
        (workspace / ".go").write_text(json.dumps(go))
        if sv.uid is not None:
            os.chown(workspace / ".go", sv.uid, sv.uid)
        os.rename(workspace / ".go", workspace / "go.json")
        done = sv.ctl("exec", "hostile", "--", sv.python, PROBE, "exec", json.dumps(cfg))
        assert done.returncode == 0, done.stderr
        # ctl exec's `setsid` escapee (which held the operator's terminal): fenced, it ends
        # with the command's PID namespace; unfenced, it outlives the command
        if sandbox != "none":
            until(lambda: not tagged(exec_tag), 60, "the exec escapee to end with its command")
        else:
            assert tagged(exec_tag), "the control: an unfenced exec escapee outlives ctl"
        results = {
            mode: until(lambda mode=mode: _load(workspace / f"{mode}.json"), 60, f"{mode} probes")
            for mode in ("agent", "escapee", "exec")
        }
        until(lambda: sv.calls("hostile"), 60, "the hostile agent's call")
        heard = [  # its attach socket reached the center, as itself
            r for r in center.requests(500) if (r.get("body") or {}).get("agent_id") == "hostile"
        ]
        assert heard, "the center never heard the hostile agent"
        written = [
            Path(f"{tmp}/fence-probe-{sv.state.name}-{mode}")
            for tmp in ("/tmp", "/var/tmp")
            for mode in ("agent", "escapee", "exec")
        ]
        results["tmp"] = {"host_sees_agent_tmp": str(any(path.exists() for path in written))}
        for path in written:
            path.unlink(missing_ok=True)
        if while_running is not None:
            while_running()
        return results
    finally:
        sv.close()
        shutil.rmtree(marker.parent, ignore_errors=True)
        for pid in tagged(exec_tag):
            os.kill(pid, signal.SIGKILL)
        if run_socket is not None:
            os.unlink(run_socket.getsockname())
            run_socket.close()


HOLD = "import time\nwhile True: time.sleep(60)"


def held(results: dict[str, dict[str, str]], mode: str) -> dict[str, str]:
    """`mode`'s probes, after checking that every forbidden one was refused and every allowed
    one worked."""
    seen = results[mode]
    got_in = {name: seen[name] for name in FORBIDDEN if seen[name] == "ok"}
    assert not got_in, (mode, got_in, seen)
    refused = {name: seen[name] for name in ALLOWED if seen[name] != "ok"}
    assert not refused, (mode, refused, seen)
    return seen


def _groups(sv: AsUser, agent_id: str) -> list[str]:
    """The agent's cgroup directories, each once (none where the supervisor makes none: as
    nobody, or on a machine without a backend)."""
    if sv.uid is not None or cgroups.detect().kind == "none":
        return []
    return sorted(set(group_dirs(sv, agent_id).values()))


def _run_socket() -> socket.socket | None:
    """A root-only listening socket under /run, as the system bus or a runtime socket is (a
    root supervisor's agents must not reach it); None where the test cannot make one."""
    try:
        sock = socket.socket(socket.AF_UNIX)
        path = f"/run/mcphost-fence-test-{uuid.uuid4().hex[:12]}.sock"
        sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(8)
        return sock
    except OSError:
        return None


def session_keyring() -> int:
    """This process's session keyring id: the supervisor it starts inherits it."""
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.syscall(gate.SYS_KEYCTL, 0, -3, 0))


def _load(path: Path) -> dict[str, str] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def users() -> list[int | None]:
    found: list[int | None] = [None]
    if os.geteuid() == 0:
        try:
            found.append(pwd.getpwnam("nobody").pw_uid)
        except KeyError:
            pass
    return found


@pytest.mark.parametrize("uid", users(), ids=lambda u: "as-self" if u is None else "as-nobody")
@pytest.mark.parametrize("runner", ["process", "tmux"])
def test_every_probe_from_inside_the_fence_is_refused_and_the_agent_still_works(
    tmp_path: Path, center: DevCenter, loopback: int, runner: str, uid: int | None
) -> None:
    base = Path(tempfile.mkdtemp(prefix="fence-"))
    outside = Path(tempfile.mkdtemp(prefix="fence-outside-"))
    outside.chmod(0o777)  # writable for any uid: only the fence keeps the agent out
    sv = AsUser(base, center, uid)
    try:
        results = run_fleet(sv, center, runner, "auto", loopback, outside)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(sv.state, ignore_errors=True)
    for mode in ("agent", "escapee", "exec"):
        seen = held(results, mode)
        assert seen["tmp_host_marker"] == "missing", (mode, seen)  # a private /tmp
        assert seen["tmux_env"] == "unset", (mode, seen)
        assert int(seen["tmp_bytes"]) == TMP_SIZE, (mode, seen)  # bounded by the fleet's key
        assert int(seen["processes_seen"]) < 16, (mode, seen)  # its own PID namespace
        # its own cgroups come back, read-only (a root supervisor's agents have some)
        if uid is None and cgroups.detect().kind != "none":
            assert seen["read_own_cgroup"] == "ok", (mode, seen)
    assert results["tmp"]["host_sees_agent_tmp"] == "False"
    assert not list(outside.iterdir())
    shutil.rmtree(outside, ignore_errors=True)


def test_without_the_fence_the_same_probes_get_through(
    tmp_path: Path, center: DevCenter, loopback: int
) -> None:
    """The control: `sandbox = "none"` (the only way left to read the token, use the control
    socket or signal the supervisor from an agent's tree)."""
    base = Path(tempfile.mkdtemp(prefix="fence-"))
    outside = Path(tempfile.mkdtemp(prefix="fence-outside-"))
    sv = AsUser(base, center, None)
    try:
        results = run_fleet(sv, center, "process", "none", loopback, outside)
        landed = sorted(path.name for path in outside.iterdir())
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(sv.state, ignore_errors=True)
        shutil.rmtree(outside, ignore_errors=True)
    for mode in ("agent", "escapee", "exec"):
        seen = results[mode]
        refused = {name: seen[name] for name in UNFENCED_THROUGH if seen[name] != "ok"}
        assert not refused, (mode, refused, seen)
        assert seen["tmp_host_marker"] == "ok", (mode, seen)  # the host's /tmp
        assert int(seen["tmp_bytes"]) != TMP_SIZE, (mode, seen)
        # the second wall holds even unfenced: the control socket refuses the supervisor's tree
        assert seen["control_status"] in ("EACCES", "EPIPE", "ECONNRESET"), seen  # forbidden_peer
    assert landed == ["planted-agent", "planted-escapee", "planted-exec"], landed


PEEK = """
import os, sys, time
while True:
    try:
        with open(sys.argv[1]) as token:
            seen = "readable" if token.read() else "empty"
    except OSError as exc:
        seen = type(exc).__name__
    with open("peek.tmp", "w") as out:
        out.write(seen)
    os.replace("peek.tmp", "peek.txt")
    time.sleep(0.1)
"""


def test_a_reload_that_moves_the_token_file_refences_the_running_agents(center: DevCenter) -> None:
    """A fence hides the token file by the path it had when the agent's slot was made. A reload
    that moves `[center] token_file` to a path no fence covers (here beside the project, which
    every agent sees) must not leave the running agent able to read it: the supervisor gives
    it a fence with the new path and restarts it into that fence (a new generation)."""
    base = Path(tempfile.mkdtemp(prefix="fence-refence-"))
    moved = Path(tempfile.mkdtemp(prefix="token-", dir=REPO)) / "worker.token"
    sv = Supervised(base, center)
    try:
        moved.write_text(sv.token_file.read_text())
        moved.chmod(0o600)
        sv.write_fleet([_peeker(sv, moved)])
        sv.start()
        first = sv.wait_running("peeker")["generation"]
        peek = sv.workspace("peeker") / "peek.txt"
        # the hole's precondition: nothing hides the new path from the running agent yet
        until(lambda: peek.exists() and peek.read_text() == "readable", 60, "a first peek")
        sv.fleet.write_text(fleet_toml(center, moved, [_peeker(sv, moved)]))
        reloaded = sv.ctl("reload")
        assert reloaded.returncode == 0, reloaded.stderr
        row = until(
            lambda: (
                (r := sv.status()["peeker"])["generation"] > first and r["state"] == "running" and r
            ),
            60,
            "the agent restarted into its new fence",
        )
        assert row["sandbox"].startswith("bwrap"), row
        peek.unlink(missing_ok=True)
        seen = until(lambda: peek.exists() and peek.read_text(), 60, "a peek from the new fence")
        assert seen != "readable", seen
        refenced = [e for e in sv.events() if e.get("event") == "supervisor.agent_refenced"]
        assert [(e["agent_id"], e["restarted"]) for e in refenced] == [("peeker", True)], refenced
    finally:
        sv.close()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(sv.state, ignore_errors=True)
        shutil.rmtree(moved.parent, ignore_errors=True)


def _peeker(sv: Supervised, token: Path) -> dict[str, object]:
    # uid 0 outside (`user = "root"`): only the fence keeps it from a 0600 token, which an agent
    # of its own uid could not read anyway
    return {"id": "peeker", "command": [sv.python, "-c", PEEK, str(token)], **AS_ROOT}


READ_ALL = """
import json, os, signal, sys
seen = {}
for path in sys.argv[1:]:
    try:
        with open(path, "rb") as handle:
            seen[path] = "readable" if handle.read() else "empty"
    except OSError as exc:
        seen[path] = type(exc).__name__
with open("read.tmp", "w") as out:
    json.dump(seen, out)
os.replace("read.tmp", "read.json")
signal.pause()
"""


def test_the_operator_s_sign_in_outside_their_home_is_hidden_and_each_agent_gets_its_copy(
    center: DevCenter,
) -> None:
    """Issue 32: the supervisor's `CLAUDE_CONFIG_DIR` and `CODEX_HOME` name directories outside
    the operator's home (beside the project, which every agent sees, not under the private
    /tmp). A fenced claude and a fenced codex agent try to read every sign-in file there (the
    full credentials with an MCP server's token, the record with the operator's projects,
    Codex's auth.json) and another file beside them: none is there for them; each agent's home
    still gets its filtered copy."""
    base = Path(tempfile.mkdtemp(prefix="fence-signin-"))
    ops = Path(tempfile.mkdtemp(prefix="ops-", dir=REPO))
    ops.chmod(0o755)  # passable: what hides it is the fence, not its mode
    claude_dir, codex_dir = ops / "claude", ops / "codex"
    claude_dir.mkdir()
    codex_dir.mkdir()
    (claude_dir / ".credentials.json").write_text(json.dumps(CREDENTIALS))
    (claude_dir / ".claude.json").write_text(json.dumps(RECORD))
    auth = b'{"auth_mode": "chatgpt", "tokens": {"access_token": "operator"}}'
    (codex_dir / "auth.json").write_bytes(auth)
    targets = [
        str(claude_dir / ".credentials.json"),
        str(claude_dir / ".claude.json"),
        str(codex_dir / "auth.json"),
        str(claude_dir / "other.json"),
    ]
    sv = Supervised(base, center)
    sv.extra_env.update({name: "" for name in signin.INHERITED})  # the operator's sign-in only
    sv.extra_env.update(CLAUDE_CONFIG_DIR=str(claude_dir), CODEX_HOME=str(codex_dir))
    agents = [
        {"id": "claude-1", "client": "claude", "command": inline(READ_ALL, *targets)},
        {"id": "codex-1", "client": "codex", "command": inline(READ_ALL, *targets)},
    ]
    try:
        sv.write_fleet(agents)
        # any other file there: the whole directory is hidden, not each file the supervisor reads
        (claude_dir / "other.json").write_text("{}")
        sv.start()
        for agent_id in ("claude-1", "codex-1"):
            assert sv.wait_running(agent_id)["sandbox"].startswith("bwrap")
            read = sv.workspace(agent_id) / "read.json"
            seen = until(lambda read=read: _load(read), 60, f"{agent_id}'s reads")
            assert seen == {path: "FileNotFoundError" for path in targets}, (agent_id, seen)
        home = sv.state / "agents"
        copied = json.loads((home / "claude-1" / ".claude" / ".credentials.json").read_text())
        assert copied == {"claudeAiOauth": OAUTH}  # filtered: no MCP server's token
        record = json.loads((home / "claude-1" / ".claude.json").read_text())
        assert record["userID"] == RECORD["userID"]  # its sign-in, not the operator's projects
        assert list(record["projects"]) == [str(home / "claude-1" / "workspace")]
        assert (home / "codex-1" / "codex" / "auth.json").read_bytes() == auth
    finally:
        sv.close()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(sv.state, ignore_errors=True)
        shutil.rmtree(ops, ignore_errors=True)
