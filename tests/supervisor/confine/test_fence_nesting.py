"""Black-box: an agent's own sandbox nests inside the fence and never sees more than it.

One real `mcphost supervise` (default `sandbox = "auto"`, run as this test's uid) runs one
holding agent, its state directory under the checkout rather than /tmp, so that the fence hides
it under a cover of its own (beneath the agent's private /tmp it would need none). Every command
runs through `mcphost ctl exec`, inside the agent's tree:
- a user namespace (`unshare -U -r`) and bubblewrap (`bwrap --ro-bind / / --dev /dev`) nest;
- a nested user and mount namespace, root in there, cannot undo the fence: unmounting the
  state directory's cover, the private /tmp or the read-only /proc/sys fails (the kernel locks
  every mount a less privileged namespace inherits), and the token file, the state file and the
  sysctls stay out of reach, exactly as they are for the agent itself;
- a nested /proc of its own (bubblewrap's `--proc`, what Claude Code's sandbox asks for) is
  refused where the agent is uid 0 outside (a root supervisor's: a /proc of its own would give
  it the sysctls back) and given where it is not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from mcphost import gate
from mcphost.supervisor.agents import reach
from mcphost.supervisor.confine import fence
from mcphost.supervisor.confine import probe as machine
from mcphost.testing.devcenter import DevCenter
from tests.supervisor.supervise_harness import REPO, Supervised

pytestmark = [
    pytest.mark.skipif(
        machine.probe().missing() is not None, reason=f"no fence here: {machine.probe().missing()}"
    ),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare is missing"),
]

HOLD = [sys.executable, "-c", "import signal; signal.pause()"]


def root_agent(sv: Supervised) -> bool:
    """Is the agent uid 0 outside? A root supervisor's agent runs as a uid of its own (uids.py)
    unless the fleet says user = "root" (the second run of this file)."""
    return sv.status()["agent-1"]["uid"] == 0


# What a command inside the fence (and inside a nested namespace) can undo or reach: each
# target unmounted (or the errno), each path opened (or the errno). Opening a sysctl for
# writing writes nothing.
PROBE = """
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
state, token = sys.argv[1], sys.argv[2]
points = {line.split()[4] for line in open("/proc/self/mountinfo")}
def umount(path):
    if path not in points:
        return "not a mount point"
    if libc.umount2(path.encode(), 2) == 0:  # MNT_DETACH
        return "unmounted"
    return errno.errorcode[ctypes.get_errno()]
def opened(path, flags):
    try:
        os.close(os.open(path, flags))
        return "opened"
    except OSError as exc:
        return errno.errorcode[exc.errno]
out = {"umount " + t: umount(t) for t in (state, "/tmp", "/proc/sys")}
out["token"] = opened(token, os.O_RDONLY)
out["state file"] = opened(state + "/state.sqlite3", os.O_RDONLY)
out["sysctl"] = opened("/proc/sys/vm/swappiness", os.O_WRONLY)
out["uid_map"] = open("/proc/self/uid_map").read().split()[:2]
print(json.dumps(out))
"""


@pytest.fixture(scope="module", params=["own uid", "user root"])
def sv(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Supervised]:
    if request.param == "user root" and os.geteuid() != 0:
        pytest.skip('user = "root" needs a root supervisor')
    base = tmp_path_factory.mktemp("nesting")
    with DevCenter.start(base / "center") as center:
        running = Supervised(base, center, state_parent=REPO)
        agent: dict[str, object] = {"id": "agent-1", "command": HOLD}
        if request.param == "user root":
            agent["user"] = "root"
        running.write_fleet([agent])
        try:
            running.start()
            running.wait_running("agent-1")
            yield running
        finally:
            running.close()


def ctl_exec(sv: Supervised, *argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mcphost", "ctl", "--state", str(sv.state), "exec", "agent-1"]
    return subprocess.run(
        [*command, "--", *argv], capture_output=True, text=True, env=sv.env(), timeout=60
    )


def test_a_user_namespace_nests(sv: Supervised) -> None:
    done = ctl_exec(sv, "unshare", "-U", "-r", "true")
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_bubblewrap_nests(sv: Supervised) -> None:
    done = ctl_exec(sv, "bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "true")
    assert done.returncode == 0, done.stderr


def test_a_nested_namespace_cannot_undo_the_fence(sv: Supervised) -> None:
    probe = [sys.executable, "-c", PROBE, str(sv.state), str(sv.token_file)]
    seen = {}
    for how, prefix in (("agent", []), ("nested", ["unshare", "-U", "-r", "-m"])):
        done = ctl_exec(sv, *prefix, *probe)
        assert done.returncode == 0, (how, done.stderr)
        seen[how] = json.loads(done.stdout)
    nested = seen["nested"]
    assert nested["uid_map"][0] == "0", nested  # root in a namespace of its own: it may try
    covered = not any(fence.beneath(REPO, p) for p in fence.PRIVATE)
    for how, out in seen.items():
        # the agent has no capability to unmount (EPERM); the nested root meets locked mounts
        refused = "EPERM" if how == "agent" else "EINVAL"
        assert out["token"] == "ENOENT" and out["state file"] == "ENOENT", (how, out)
        # uid 0 outside meets the read-only bind; any other uid, the file's mode
        assert out["sysctl"] == ("EROFS" if root_agent(sv) else "EACCES"), (how, out)
        assert out[f"umount {sv.state}"] == (refused if covered else "not a mount point"), out
        assert out["umount /tmp"] == refused, (how, out)
        assert out["umount /proc/sys"] == (refused if root_agent(sv) else "not a mount point"), out


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_a_nested_proc_of_its_own_only_where_the_agent_runs_bubblewrap_itself(
    sv: Supervised,
) -> None:
    """A /proc of its own is given where the fence's bubblewrap runs as the agent's uid (it
    then covers nothing of /proc); a root-run one covers parts of it, so a nested sandbox shares
    the agent's: for a uid-0 agent (a /proc of its own would give it the sysctls back), and for
    an agent of its own uid that cannot reach the supervisor's programs on the host (a Python
    under a 0700 home, as /root/.pyenv here: fence.for_agent)."""
    nested = ["bwrap", "--unshare-user", "--unshare-pid", "--ro-bind", "/", "/", "--dev", "/dev"]
    done = ctl_exec(sv, *nested, "--proc", "/proc", "true")
    uid = sv.status()["agent-1"]["uid"]
    runtime = (sys.prefix, sys.base_prefix, REPO)
    root_run = uid == 0 or not all(reach.passes(p, gate.Switch(uid, uid, ())) for p in runtime)
    if root_run:
        assert done.returncode != 0 and "Can't mount proc" in done.stderr, done
        shared = ctl_exec(sv, *nested, "--bind", "/proc", "/proc", "true")  # the agent's /proc
        assert shared.returncode == 0, shared.stderr
    else:
        assert done.returncode == 0, done.stderr


def test_the_plan_binds_proc_sys_read_only_for_a_root_agent_only() -> None:
    """Pure: the bubblewrap command line (`FencePlan.argv`)."""
    state = "/var/lib/mcphost"
    home = f"{state}/agents/a1"
    for root_agent in (True, False):
        planned = fence.plan(
            state_dir=state, home=home, workspace=home, sockets=(), secrets=(),
            root_agent=root_agent,
        )  # fmt: skip
        argv = planned.argv(["true"])
        bound = ["--ro-bind", fence.SYSCTLS, fence.SYSCTLS]
        at = [i for i in range(len(argv)) if argv[i : i + 3] == bound]
        assert len(at) == (1 if root_agent else 0), argv
        if root_agent:  # over the fence's own /proc, not beneath it
            assert argv.index("--proc") < at[0], argv
        assert fence.FencePlan.from_json(planned.to_json()) == planned
