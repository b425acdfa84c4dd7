"""Black-box: the fence on the kernels workers run, simulated here by a real seccomp filter.

tests/kernelsim.py starts a real `mcphost supervise` (as root, or as nobody through setpriv) on a
kernel without Landlock (`no-landlock`: its system calls fail with ENOSYS) or without user
namespaces (`no-userns`: `unshare`/`clone` with CLONE_NEWUSER fail with EPERM), for the whole
tree: supervisor, bubblewrap, agents. Each level:

- no Landlock (Debian 12's ABI 2 and RHEL 9 look like this to the fence), root and nobody: the
  fence still runs; the hostile agent of confine/test_fence.py (its agent, its `setsid` escapee, a
  `ctl exec` command) finds the token, the fleet file, the state and the other agent hidden and
  cannot signal or trace the supervisor; `--check` names that abstract Unix sockets are not
  scoped; `ctl status` shows the level in its FENCE column.
- no user namespaces, root supervisor: the fence is built all the same (root's bubblewrap needs
  none), with the same probes refused; `--check` names that agents cannot nest their own
  sandboxes.
- no user namespaces, unprivileged supervisor: nothing can hide a path, so `mcphost supervise`
  refuses in one line naming `defaults.sandbox` and the kernel feature, and exits 2.

What this machine cannot simulate (AppArmor's restriction, Landlock ABI 1-5) is covered by
confine/test_probe.py.
"""

from __future__ import annotations

import json
import os
import platform
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcphost.supervisor.confine import probe as machine
from mcphost.supervisor.confine.probe import Support
from mcphost.testing.devcenter import DevCenter
from tests import kernelsim
from tests.supervisor.confine.test_fence import HOLD, AsUser, held, run_fleet
from tests.supervisor.confine.test_fence import loopback as loopback  # a fixture, used by name

REAL = machine.probe()
ROOT = os.geteuid() == 0
try:
    NOBODY: int | None = pwd.getpwnam("nobody").pw_uid
except KeyError:
    NOBODY = None
# deep (make test-slow): three supervisors with hostile fenced agents on simulated kernels.
pytestmark = [
    pytest.mark.deep,
    pytest.mark.skipif(
        platform.machine() not in kernelsim.ARCHES, reason="kernelsim: x86_64 and aarch64 only"
    ),
    pytest.mark.skipif(REAL.missing() is not None, reason=f"no fence here: {REAL.missing()}"),
]


@pytest.fixture(scope="module")
def center(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCenter]:
    """The reference center over TCP too: a supervisor of any uid reaches it (pinned)."""
    with DevCenter.start(tmp_path_factory.mktemp("center"), tcp=True) as running:
        yield running


class Simulated(AsUser):
    """A supervisor (as `uid`, or as this process's user) on the kernel `modes` simulate."""

    def __init__(self, base: Path, center: DevCenter, uid: int | None, modes: str) -> None:
        super().__init__(base, center, uid)
        self.modes = modes

    def argv(self) -> list[str]:
        return kernelsim.argv(self.modes, super().argv())

    def check(self) -> subprocess.CompletedProcess[str]:
        """`mcphost supervise --check` on the same kernel, as the same user."""
        return subprocess.run(
            [*self.argv(), "--check"], capture_output=True, text=True, env=self.env(), timeout=120
        )


def expected(modes: str, uid: int | None) -> Support:
    """What the fence should find on the simulated kernel: this machine, less what `modes` take."""
    return Support(
        0 if "no-landlock" in modes else REAL.landlock_abi,
        "no-userns" not in modes and REAL.userns,
        "unshare: Operation not permitted",
        root=uid is None and ROOT,
        userns_limit=REAL.userns_limit,
    )


def fence_cells(table: str, agent: str) -> str:
    """The FENCE cell of `agent`'s row in `ctl status`'s table."""
    lines = table.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("AGENT"))
    start, end = lines[header].index("FENCE"), lines[header].index("EXIT")
    (row,) = [line for line in lines[header + 1 :] if line.split()[:1] == [agent]]
    return row[start:end].strip()


def test_the_simulated_kernel_refuses_what_it_lacks_to_the_whole_tree() -> None:
    """The simulation itself: a grandchild of the launcher (through fork and exec, with threads,
    as the supervisor's agents are) gets ENOSYS from Landlock and EPERM for a user namespace,
    and may still make mount and PID namespaces (root) or nothing changes (not root)."""
    script = (
        "import ctypes, json, os, subprocess, sys, threading\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def call(fn, *args):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os._exit(0 if fn(*args) >= 0 else ctypes.get_errno())\n"
        "    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])\n"
        "t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
        "out = dict(landlock=call(libc.syscall, 444, None, 0, 1),\n"
        "           userns=call(libc.unshare, 0x10000000),\n"
        "           mountns=call(libc.unshare, 0x00020000 | 0x20000000),\n"
        "           seccomp=[l for l in open('/proc/self/status') if l.startswith('Seccomp:')])\n"
        "print(json.dumps(out))\n"
    )
    child = [sys.executable, "-c", "import subprocess, sys; subprocess.run(sys.argv[1:])"]
    done = subprocess.run(
        kernelsim.argv("no-landlock,no-userns", [*child, sys.executable, "-c", script]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["landlock"] == 38, seen  # ENOSYS
    assert seen["userns"] == 1, seen  # EPERM
    assert seen["mountns"] == (0 if ROOT else 1), seen
    assert seen["seccomp"] == ["Seccomp:\t2\n"], seen
    bad = subprocess.run(kernelsim.argv("no-such-thing", ["true"]), capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown mode no-such-thing" in bad.stderr, bad.stderr


LEVELS = [
    pytest.param("no-landlock", None, id="no-landlock-as-self"),
    pytest.param("no-landlock", NOBODY, id="no-landlock-as-nobody"),
    pytest.param("no-userns", None, id="no-userns-as-root"),
]


@pytest.mark.parametrize(("modes", "uid"), LEVELS)
def test_on_a_lesser_kernel_the_fence_still_hides_the_fleet_and_keeps_signals_inside(
    center: DevCenter, loopback: int, modes: str, uid: int | None
) -> None:
    if uid is not None and not ROOT:
        pytest.skip("running the supervisor as nobody needs root")
    if uid is not None and NOBODY is None:
        pytest.skip("no user nobody here")
    if "no-userns" in modes and not ROOT:
        pytest.skip("without user namespaces only a root supervisor fences (the next test)")
    if uid is not None and not REAL.userns:
        pytest.skip("this machine has no user namespaces for an unprivileged supervisor")
    support = expected(modes, uid)
    level = support.level()
    assert ("landlock" in level) is ("no-landlock" not in modes), level
    assert ("(no nesting)" in level) is ("no-userns" in modes), level
    base = Path(tempfile.mkdtemp(prefix="fence-level-"))
    outside = Path(tempfile.mkdtemp(prefix="fence-outside-"))
    outside.chmod(0o777)  # writable for any uid: only the fence keeps the agent out
    sv = Simulated(base, center, uid, modes)
    shown: dict[str, str] = {}

    def look() -> None:
        shown["table"] = sv.ctl("status").stdout

    try:
        results = run_fleet(
            sv, center, "process", "auto", loopback, outside, level=level, while_running=look
        )
        check = sv.check()  # the fleet file is still there; the supervisor has stopped
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(sv.state, ignore_errors=True)
    for mode in ("agent", "escapee", "exec"):
        seen = held(results, mode)
        assert seen["kill_supervisor"] == "ESRCH", (mode, seen)  # not even there to be named
    assert not list(outside.iterdir())
    shutil.rmtree(outside, ignore_errors=True)
    # an unprivileged supervisor's agents share its uid, and the FENCE column says so
    shown_level = level if ROOT and uid is None else f"{level} (shared uid)"
    assert fence_cells(shown["table"], "hostile") == shown_level, shown["table"]
    assert fence_cells(shown["table"], "other") == shown_level, shown["table"]
    (line,) = [
        x for x in check.stderr.splitlines() if x.startswith("mcphost supervise --check: fence")
    ]
    assert line == f"mcphost supervise --check: fence: {support.describe()}", line
    if "no-landlock" in modes:
        assert "abstract Unix sockets are not scoped (Landlock ABI >= 6; here: no Landlock)" in line
    if "no-userns" in modes:
        assert "agents cannot nest their own sandboxes" in line, line
    assert check.returncode == 0, check.stderr


def test_without_user_namespaces_an_unprivileged_supervisor_refuses_in_one_line(
    center: DevCenter,
) -> None:
    if not ROOT or NOBODY is None:
        pytest.skip("needs root to run the supervisor as nobody")
    base = Path(tempfile.mkdtemp(prefix="fence-level-"))
    sv = Simulated(base, center, NOBODY, "no-userns")
    try:
        sv.write_fleet([{"id": "a1", "command": [sv.python, "-c", HOLD]}])
        os.chown(sv.fleet, NOBODY, NOBODY)
        done = sv.run_to_exit()
        check = sv.check()
        started = sorted(p.name for p in sv.state.iterdir())
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(sv.state, ignore_errors=True)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"mcphost supervise: {sv.fleet}: defaults.sandbox "), line
    assert "this machine lacks unprivileged user namespaces (unshare: Operation not permitted)" in (
        line
    ), line
    assert "run the supervisor as root" in line and 'sandbox = "none"' in line, line
    assert started == [], started  # refused before the state directory was touched
    assert check.returncode == 2, check.stderr
    lines = check.stderr.splitlines()
    # --check also says what limits the agents get (cgroups.py): a line of its own
    limits = [x for x in lines if x.startswith("mcphost supervise --check: limits: ")]
    # and whom the agents run as: an unprivileged supervisor's share its uid
    (identity,) = [x for x in lines if x.startswith("mcphost supervise --check: identity: ")]
    assert "the agents share the supervisor's uid" in identity, identity
    assert len(limits) == 1, lines
    limits.append(identity)
    assert [x for x in lines if x not in limits] == [
        "mcphost supervise --check: fence: unavailable: this machine lacks unprivileged user "
        "namespaces (unshare: Operation not permitted); run the supervisor as root "
        "(contrib/systemd/mcphost-supervisor.service without User=) to fence without them",
        line,
    ]
