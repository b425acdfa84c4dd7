"""Black-box: `user = "..."` in the fleet file, through a real `mcphost supervise` process.

What the issue and docs/supervisor.md promise: with `user = "nobody"` (the supervisor running as
root) the agent runs under that uid, its calls still reach the center as itself, the attach
sockets and state directories let it through (sockets 0666, directories 0711: the kernel
credentials are the gate), and it cannot read the 0600 token file nor the supervisor's
environment. A `user` the supervisor cannot switch to (no such user, or the supervisor is not
root) is refused when the fleet file is loaded, naming the key, at start and at reload alike.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from mcphost.testing.devcenter import DevCenter
from tests.supervisor.supervise_harness import REPO, Supervised, inner, standin, tree_for
from tests.waiting import until

# deep (make test-slow): agents under another user.
pytestmark = pytest.mark.deep

ROOT = os.geteuid() == 0


def nobody() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


# Run inside the agent (as its user) before it becomes the stand-in: try to read the token file
# and the supervisor's environment (its nearest ancestor of uid 0; fenced, its own PID namespace
# shows none: "hidden"), record what the kernel said.
PROBE = (
    "import json, os, sys\n"
    "out = dict()\n"
    "pid = os.getppid()\n"
    "while pid > 1 and os.stat('/proc/%d' % pid).st_uid != 0:\n"
    "    pid = int(open('/proc/%d/stat' % pid).read().rpartition(')')[2].split()[1])\n"
    "if os.stat('/proc/%d' % pid).st_uid != 0:\n"
    "    out['environ'] = 'hidden'\n"
    "for name, path in (('token', sys.argv[1]), ('environ', '/proc/%d/environ' % pid)):\n"
    "    if name in out:\n"
    "        continue\n"
    "    try:\n"
    "        open(path, 'rb').read()\n"
    "        out[name] = 'read'\n"
    "    except OSError as exc:\n"
    "        out[name] = exc.errno\n"
    "open('probe.json', 'w').write(json.dumps(out))\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])\n"
)


def python_for(user: pwd.struct_passwd) -> str | None:
    """An interpreter `user` may run, of this one's version (the supervisor's interpreter is its
    pumps' too, so an agent's user must be able to run it: a virtualenv under /root is not)."""
    return python_for_ids(user.pw_uid, user.pw_gid)


def python_for_ids(uid: int, gid: int) -> str | None:
    """`python_for` by uid and gid (in no other group): an agent's own uid has no user entry."""
    wanted = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for candidate in (sys.executable, f"/usr/bin/python{wanted}", "/usr/bin/python3"):
        try:
            done = subprocess.run(
                [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                user=uid,
                group=gid,
                extra_groups=[],
                timeout=60,
            )
        except OSError:
            continue
        if done.returncode == 0 and done.stdout.strip() == wanted:
            return candidate
    return None


def run_as(supervised: Supervised, user: pwd.struct_passwd) -> str:
    """Make `supervised` start with an interpreter `user` can run (the same site-packages), and
    its pump and stand-in (`Supervised.standin`) where `user` can read them: a copy of the
    packages (`tree_for`) when the checkout is in a directory that user cannot pass."""
    python = python_for(user)
    if python is None:
        pytest.skip(f"no python{sys.version_info[0]}.{sys.version_info[1]} {user.pw_name} can run")
    if python != sys.executable:
        site = sysconfig.get_paths()["purelib"]
        supervised.python = python
        supervised.extra_env["PYTHONPATH"] = os.pathsep.join((REPO, site))
    gids = frozenset(os.getgrouplist(user.pw_name, user.pw_gid))
    tree = tree_for(user.pw_uid, gids)
    if tree is not None:
        supervised.use_tree(tree)
    return python


def ids(pid: int, kind: str) -> list[int]:
    """The Uid: or Gid: line of /proc/<pid>/status (real, effective, saved, filesystem)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{kind}:"):
            return [int(v) for v in line.split()[1:]]
    raise AssertionError(f"no {kind} in /proc/{pid}/status")


def children_of(pid: int) -> list[int]:
    out: list[int] = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                text = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(text.rpartition(")")[2].split()[1]) == pid:
                out += [int(entry), *children_of(int(entry))]
    return out


@pytest.mark.skipif(not ROOT, reason="running an agent as another user needs a root supervisor")
@pytest.mark.skipif(nobody() is None, reason="no user nobody on this machine")
@pytest.mark.parametrize(
    ("sandbox", "token_errno"),
    [
        pytest.param("none", errno.EACCES, id="unfenced"),
        pytest.param("auto", errno.ENOENT, id="fenced"),
    ],
)
def test_an_agent_runs_as_its_user_and_cannot_read_the_token(
    supervised: Supervised, center: DevCenter, sandbox: str, token_errno: int
):
    """`user =` alone (`sandbox = "none"`): the token file's 0600 mode keeps the agent out
    (EACCES). With the fence too (the default), the agent does not even see it (ENOENT)."""
    user = nobody()
    assert user is not None
    # The token file where the agent's user may reach it (a world-searchable directory):
    # without the fence, only its 0600 mode keeps the agent out.
    shared = Path(tempfile.mkdtemp(prefix="mcphost-tok-"))
    try:
        shared.chmod(0o755)
        supervised.token_file = shared / "worker.token"
        supervised.token_file.write_text(center.token + "\n")
        supervised.token_file.chmod(0o600)
        python = run_as(supervised, user)
        supervised.write_fleet(
            [
                {
                    "id": "agent-1",
                    "user": "nobody",
                    "command": [
                        python,
                        "-c",
                        PROBE,
                        str(supervised.token_file),
                        *supervised.standin("--hold")[1:],
                    ],
                }
            ],
            sandbox=sandbox,
        )
        supervised.start()
        row = supervised.wait_running("agent-1")
        call = until(lambda: supervised.calls("agent-1"), 60, "the agent's call")[0]
        assert call["ok"], call
        # the agent and every process of its tree (the pump included) run as that user
        tree = [row["pid"], *children_of(row["pid"])]
        assert len(tree) >= 2, tree
        for pid in tree:
            assert ids(pid, "Uid") == [user.pw_uid] * 4, pid
            assert ids(pid, "Gid") == [user.pw_gid] * 4, pid
        # ... and the center heard it as agent-1, with its generation
        heard = [
            r
            for r in center.requests(200)
            if r["route"].endswith("/get_my_work") and r["body"]["agent_id"] == "agent-1"
        ]
        generations = {
            {k.lower(): v for k, v in r["headers"].items()}.get("x-ac-mcp-generation")
            for r in heard
        }
        assert str(row["generation"]) in generations
        # the kernel kept it out of the token file and the supervisor's environment
        probe = until(
            lambda: (Path(supervised.workspace("agent-1")) / "probe.json").exists(), 60, "probe"
        )
        assert probe
        seen = json.loads((supervised.workspace("agent-1") / "probe.json").read_text())
        environ: object = "hidden" if token_errno == errno.ENOENT else errno.EACCES
        assert seen == {"token": token_errno, "environ": environ}, seen
        # what let it in: the sockets are 0666 and the directories above them 0711
        state = supervised.state
        for sock in ("center.sock", "relay.sock"):
            info = os.stat(state / "run" / sock)
            assert stat.S_ISSOCK(info.st_mode)
            assert stat.S_IMODE(info.st_mode) == 0o666, sock
        for directory in (state, state / "run", state / "agents"):
            assert stat.S_IMODE(os.stat(directory).st_mode) == 0o711, directory
        # ... while its home is its own, its log (outside the home) and the control socket stay
        # the supervisor's
        home = state / "agents" / "agent-1"
        assert os.stat(home).st_uid == user.pw_uid
        assert os.stat(home / "workspace").st_uid == user.pw_uid
        assert not (home / "logs").exists()
        logs = state / "logs" / "agent-1"
        assert (os.stat(logs).st_uid, stat.S_IMODE(os.stat(logs).st_mode)) == (0, 0o700)
        assert (
            os.stat(logs / "agent.log").st_uid,
            stat.S_IMODE(os.stat(logs / "agent.log").st_mode),
        ) == (0, 0o600)
        assert stat.S_IMODE(os.stat(state / "control.sock").st_mode) == 0o600
        assert supervised.status()["agent-1"]["sessions"] >= 1
    finally:
        supervised.close()
        for path in shared.iterdir():
            path.unlink()
        shared.rmdir()


def test_a_user_that_does_not_exist_is_refused_at_start(supervised: Supervised):
    supervised.write_fleet(
        [
            {"id": "agent-1", "command": standin()},
            {"id": "agent-2", "command": standin(), "user": "no-such-user-mcphost"},
        ]
    )
    done = supervised.run_to_exit()
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert f"{supervised.fleet}: agent[1].user" in done.stderr, done.stderr
    assert "no-such-user-mcphost" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (supervised.state / "agents" / "agent-1").exists()  # nothing was started


def test_a_reload_naming_a_user_that_does_not_exist_changes_nothing(supervised: Supervised):
    supervised.write_fleet([{"id": "agent-1", "command": standin("--hold")}])
    supervised.start()
    before = supervised.wait_running("agent-1")
    supervised.write_fleet(
        [
            {"id": "agent-1", "command": standin("--hold")},
            {"id": "agent-2", "command": standin("--hold"), "user": "no-such-user-mcphost"},
        ]
    )
    done = supervised.ctl("reload", check=False)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "reload_failed" in done.stderr and "agent[1].user" in done.stderr, done.stderr
    status = supervised.status()
    assert sorted(status) == ["agent-1"]
    assert (status["agent-1"]["pid"], status["agent-1"]["generation"]) == (
        before["pid"],
        before["generation"],
    )
    assert supervised.proc is not None and supervised.proc.poll() is None


def test_a_user_switch_without_root_is_refused_at_start(supervised: Supervised, tmp_path: Path):
    """The supervisor is not root (when the tests run as root, it runs as nobody) and a plan
    asks for another user: refused at load, naming the key, before any agent starts."""
    other = "root"
    popen: dict[str, object] = {}
    if ROOT:
        user = nobody()
        if user is None:
            pytest.skip("no user nobody to run the supervisor as")
        # everything the supervisor needs, owned by nobody, where nobody can reach it
        base = Path(tempfile.mkdtemp(prefix="mcphost-nr-"))
        base.chmod(0o755)
        supervised.state = base / "state"
        supervised.fleet = base / "fleet.toml"
        supervised.token_file = base / "worker.token"
        supervised.token_file.write_text("x" * 43 + "\n")
        supervised.token_file.chmod(0o600)
        os.chown(supervised.token_file, user.pw_uid, user.pw_gid)
        os.chown(base, user.pw_uid, user.pw_gid)
        popen = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        run_as(supervised, user)
    elif nobody() is not None:
        other = "nobody"
    supervised.write_fleet([{"id": "agent-1", "command": standin(), "user": other}])
    supervised.fleet.chmod(0o644)
    done = supervised.run_to_exit(**popen)
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert f"{supervised.fleet}: agent[0].user" in done.stderr, done.stderr
    assert "root" in done.stderr and "Traceback" not in done.stderr, done.stderr


# Run as the agent (`ctl exec`, so as its user): upload a file of its own, then move its
# workspace away and plant a symlink to each target in its place, opening a new center session
# after each swap, and try to upload `secret.txt` and download its own file as `planted.txt`
# through that session. Prints what each call answered, as JSON.
SWAP = (
    "import json, os, sys\n"
    "sys.path.insert(0, os.path.dirname(sys.argv[1]))\n"
    "from standin_agent import Session\n"
    "config, home, targets = sys.argv[2], sys.argv[3], json.loads(sys.argv[4])\n"
    "entry = json.load(open(config))['mcpServers']['agent-center']\n"
    "def call(session, name, arguments):\n"
    "    reply = session.request('tools/call', dict(name=name, arguments=arguments))\n"
    "    return reply.get('result', reply.get('error'))\n"
    "def opened():\n"
    "    session = Session(entry)\n"
    "    session.open()\n"
    "    return session\n"
    "open('mine.txt', 'w').write('the agent its own bytes')\n"
    "first = opened()\n"
    "mine = call(first, 'upload_file', dict(path='mine.txt'))\n"
    "first.proc.kill()\n"
    "uri = mine['structuredContent']['file_uri']\n"
    "workspace = os.path.join(home, 'workspace')\n"
    "os.rename(workspace, workspace + '.moved')\n"
    "out = []\n"
    "for target in targets:\n"
    "    if os.path.lexists(workspace):\n"
    "        os.unlink(workspace)\n"
    "    os.symlink(target, workspace)\n"
    "    session = opened()\n"
    "    up = call(session, 'upload_file', dict(path='secret.txt'))\n"
    "    down = call(session, 'download_file', dict(file=uri, dest_path='planted.txt', overwrite=True))\n"
    "    session.proc.kill()\n"
    "    out.append(dict(target=target, upload=up, download=down))\n"
    "print(json.dumps(out))\n"
)


@pytest.mark.skipif(not ROOT, reason="running an agent as another user needs a root supervisor")
@pytest.mark.skipif(nobody() is None, reason="no user nobody on this machine")
def test_a_swapped_workspace_never_lends_the_agent_root_file_access(
    supervised: Supervised, center: DevCenter
):
    """V11/W4: agent-1 (nobody) renames its workspace away and puts a symlink in its place, to a
    root-only directory and then to agent-2's (root's) workspace. A new session's file tools
    keep working in the directory the supervisor created (moved or not) and never through the
    symlink: the secret is not uploaded, nothing is written where the symlink points, and a
    command started as the agent afterwards (`ctl exec`, a restart) does not start there."""
    user = nobody()
    assert user is not None
    python = run_as(supervised, user)
    secret_dir = Path(tempfile.mkdtemp(prefix="mcphost-rootonly-"))  # root's, 0700
    try:
        hold = [python, "-c", "import signal; signal.pause()"]
        supervised.write_fleet(
            [
                {"id": "agent-1", "user": "nobody", "command": hold},
                {"id": "agent-2", "command": hold},
            ]
        )
        supervised.start()
        supervised.wait_running("agent-1")
        supervised.wait_running("agent-2")
        other = supervised.workspace("agent-2")
        for directory in (secret_dir, other):
            (directory / "secret.txt").write_text("root's secret")
            (directory / "secret.txt").chmod(0o600)
        home = supervised.state / "agents" / "agent-1"
        targets = [str(secret_dir), str(other)]
        done = supervised.ctl(
            "exec", "agent-1", "--", python, "-c", SWAP, supervised.standin_script,
            str(home / "mcp.json"), str(home), json.dumps(targets),
        )  # fmt: skip
        seen = json.loads(done.stdout)
        assert [attempt["target"] for attempt in seen] == targets
        moved = home / "workspace.moved"
        for attempt in seen:
            # the held workspace has no secret.txt: not found there, never read through the link
            assert attempt["upload"]["isError"], attempt
            assert "root's secret" not in json.dumps(attempt), attempt
            assert "path_not_found" in json.dumps(attempt["upload"]), attempt
            # the download lands in the directory the supervisor created, wherever it now is
            assert not attempt["download"].get("isError"), attempt
        assert sorted(os.listdir(secret_dir)) == ["secret.txt"]
        assert "planted.txt" not in os.listdir(other)
        assert (moved / "planted.txt").read_text() == "the agent its own bytes"
        # a command started as the agent now starts in the held workspace, not through the link
        here = supervised.ctl(
            "exec", "agent-1", "--", python, "-c", "import os; print(os.getcwd())"
        ).stdout.strip()
        assert here == str(moved), here
        before = supervised.status()["agent-1"]["generation"]
        supervised.ctl("restart", "agent-1")
        row = supervised.wait_running("agent-1", before + 1)
        assert os.readlink(f"/proc/{inner(row['pid'])}/cwd") == str(moved)  # the agent's own
    finally:
        supervised.close()
        shutil.rmtree(secret_dir, ignore_errors=True)


# Run as the agent: replace its home's `logs` with a symlink to the directory given, then write
# enough output for several rotations, then a marker, and wait.
FLOOD = (
    "import os, signal, sys\n"
    "logs = os.path.join(sys.argv[1], 'logs')\n"
    "if os.path.lexists(logs):\n"
    "    os.rename(logs, logs + '.moved')\n"
    "os.symlink(sys.argv[2], logs)\n"
    "for _ in range(40):\n"
    "    sys.stdout.write('x' * 1023 + '\\n')\n"
    "    sys.stdout.flush()\n"
    "print('FLOODED', flush=True)\n"
    "signal.pause()\n"
)


@pytest.mark.skipif(not ROOT, reason="running an agent as another user needs a root supervisor")
@pytest.mark.skipif(nobody() is None, reason="no user nobody on this machine")
def test_a_planted_logs_symlink_makes_the_supervisor_touch_nothing_there(
    supervised: Supervised, center: DevCenter
):
    """V8: agent-1 (nobody) swaps `logs` in its home for a symlink to a directory of root's
    holding `agent.log` and `agent.log.1`, then writes enough for several rotations. The
    supervisor keeps its logs where no agent can write: nothing there is created, renamed,
    changed or unlinked, and `ctl logs` shows the output."""
    user = nobody()
    assert user is not None
    python = run_as(supervised, user)
    target = Path(tempfile.mkdtemp(prefix="mcphost-logtarget-"))  # root's
    try:
        for name in ("agent.log", "agent.log.1", "agent.log.3"):
            (target / name).write_text(f"root's {name}\n")
        before = {p.name: (p.stat().st_ino, p.read_bytes()) for p in target.iterdir()}
        supervised.write_fleet(
            [
                {
                    "id": "agent-1",
                    "user": "nobody",
                    "command": [python, "-c", FLOOD, "{home}", str(target)],
                    "log_max_bytes": 4096,
                    "log_keep": 3,
                }
            ]
        )
        supervised.start()
        supervised.wait_running("agent-1")
        until(
            lambda: "FLOODED" in supervised.ctl("logs", "agent-1", "--lines", "3").stdout,
            60,
            "the agent's output in its log",
        )
        after = {p.name: (p.stat().st_ino, p.read_bytes()) for p in target.iterdir()}
        assert after == before
        assert (supervised.state / "agents" / "agent-1" / "logs").is_symlink()  # it was planted
    finally:
        supervised.close()
        shutil.rmtree(target, ignore_errors=True)


# Run as the agent: upload a file of its own through a new center session, download it again
# into directories that do not exist yet, print both answers as JSON.
ROUND_TRIP = (
    "import json, os, sys\n"
    "sys.path.insert(0, os.path.dirname(sys.argv[1]))\n"
    "from standin_agent import Session\n"
    "entry = json.load(open(sys.argv[2]))['mcpServers']['agent-center']\n"
    "session = Session(entry)\n"
    "session.open()\n"
    "def call(name, arguments):\n"
    "    reply = session.request('tools/call', dict(name=name, arguments=arguments))\n"
    "    return reply.get('result', reply.get('error'))\n"
    "open('mine.txt', 'w').write('the agent its own bytes')\n"
    "up = call('upload_file', dict(path='mine.txt'))\n"
    "uri = up['structuredContent']['file_uri']\n"
    "down = call('download_file', dict(file=uri, dest_path='new/deeper/got.txt'))\n"
    "print(json.dumps(dict(upload=up, download=down)))\n"
)


@pytest.mark.skipif(not ROOT, reason="running an agent as another user needs a root supervisor")
@pytest.mark.skipif(nobody() is None, reason="no user nobody on this machine")
def test_a_download_lands_as_the_agents_own_file(supervised: Supervised, center: DevCenter):
    """W5: the file tools of a `user = "nobody"` agent run in the supervisor (root); what a
    download creates (the file and the parents it makes) is the agent's, so the agent can read
    it, and stays private (0600 / 0700)."""
    user = nobody()
    assert user is not None
    python = run_as(supervised, user)
    try:
        hold = [python, "-c", "import signal; signal.pause()"]
        supervised.write_fleet([{"id": "agent-1", "user": "nobody", "command": hold}])
        supervised.start()
        supervised.wait_running("agent-1")
        home = supervised.state / "agents" / "agent-1"
        done = supervised.ctl(
            "exec", "agent-1", "--", python, "-c", ROUND_TRIP, supervised.standin_script,
            str(home / "mcp.json"),
        )  # fmt: skip
        seen = json.loads(done.stdout)
        assert not seen["download"].get("isError"), seen
        workspace = supervised.workspace("agent-1")
        for made, mode in (("new", 0o700), ("new/deeper", 0o700), ("new/deeper/got.txt", 0o600)):
            info = os.stat(workspace / made)
            assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (
                user.pw_uid,
                user.pw_gid,
                mode,
            ), made
        read = supervised.ctl("exec", "agent-1", "--", "cat", "new/deeper/got.txt", check=False)
        assert (read.returncode, read.stdout) == (0, "the agent its own bytes"), read
    finally:
        supervised.close()


@pytest.mark.skipif(not ROOT, reason="running an agent as another user needs a root supervisor")
@pytest.mark.skipif(nobody() is None, reason="no user nobody on this machine")
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is missing")
def test_a_tmux_agent_runs_as_its_user_in_its_pane(supervised: Supervised) -> None:
    """`user =` and a tmux pane combine (they were refused together): the pane's gate becomes
    the user (or the fence's bubblewrap does, inside) before the agent's program runs, though
    the tmux server runs as root."""
    user = nobody()
    assert user is not None
    hold = [sys.executable, "-c", "import signal; signal.pause()"]
    supervised.write_fleet(
        [{"id": "pane-1", "user": "nobody", "command": hold, "runner": "tmux", "bundle": "p"}]
    )
    supervised.start()
    pid = supervised.wait_running("pane-1")["pid"]

    def program() -> int | None:
        for candidate in [pid, *children_of(pid)]:
            try:
                argv = Path(f"/proc/{candidate}/cmdline").read_bytes().split(b"\0")[:-1]
            except OSError:
                continue
            if argv == [a.encode() for a in hold]:
                return candidate
        return None

    own = until(program, 60, "the pane's program")
    assert set(ids(own, "Uid")) == {user.pw_uid}
    assert supervised.status()["pane-1"]["identity"] == "user"
