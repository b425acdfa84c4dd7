"""Per-agent cgroups (cgroups.py): the pure planning (keys, defaults, writes, detection, v1's
cpuacct apart or with cpu, the files each backend's usage is read from, the counts of the limits
met), and, where this machine has a usable backend, a child's entry into a real group and the
kernel's counts of a real fork loop and a real memory hog in it, kept across the group's
removal."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from mcphost.supervisor.confine import cgroups as cg
from mcphost.supervisor.confine.kernel import child_setup

HYBRID_CGROUP = """9:name=systemd:/
8:pids:/
4:memory:/process_api/abc
2:cpuacct:/
1:cpu:/
0::/
"""
HYBRID_MOUNTS = """31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
UNIFIED_MOUNTS = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n"
LIMITS = cg.Limits(256 << 20, 64, 100)


def test_defaults_leave_the_supervisor_its_share() -> None:
    # a big machine, no limit above: the documented caps
    assert cg.default_limits(64 << 30, None) == cg.Limits(2 << 30, 512, 100)
    # under TasksMax=200 and 1 GiB: a quarter of the processes, half the memory
    assert cg.default_limits(1 << 30, 200) == cg.Limits(512 << 20, 50, 100)


def test_resolve_limits() -> None:
    defaults = cg.Limits(2 << 30, 512, 100)
    assert cg.resolve_limits(None, None, None, defaults) == defaults
    assert cg.resolve_limits("max", "max", 50, defaults) == cg.Limits(None, None, 50)
    assert cg.resolve_limits(1 << 20, 64, None, defaults) == cg.Limits(1 << 20, 64, 100)


def test_writes_per_backend() -> None:
    limits = cg.Limits(512 << 20, 64, 200)
    v2 = dict(((f, v) for _c, f, v in cg.writes("v2", limits)))
    assert v2 == {
        "memory.max": str(512 << 20),
        "memory.swap.max": "0",
        "memory.oom.group": "1",
        "pids.max": "64",
        "cpu.weight": "200",
    }
    v1 = cg.writes("v1", limits)
    assert [f for _c, f, _v in v1][:2] == ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]
    assert ("cpu", "cpu.shares", "2048") in v1
    assert ("pids", "pids.max", "64") in v1
    unlimited = cg.writes("v1", cg.Limits(None, None, 100))
    assert ("memory", "memory.limit_in_bytes", "-1") in unlimited
    assert ("pids", "pids.max", "max") in unlimited
    assert cg.writes("none", limits) == []


def test_oom_counters() -> None:
    assert cg.oom_kills("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n") == 2
    assert cg.oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n") == 1
    assert cg.oom_kills("oom_kill_disable 0\nunder_oom 0\n") == 0


def test_limit_events_of_each_backends_files() -> None:
    v2 = cg.limit_events(
        "low 0\nhigh 0\nmax 9\noom 4\noom_kill 3\noom_group_kill 1\n", "max 819\n"
    )  # memory.events' `max` is not the pids limit: only pids.events' is
    assert v2 == cg.LimitEvents(oom_kills=3, pids_limit_hits=819, oom_group_kills=1)
    v1 = cg.limit_events("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n", "max 5\n")
    assert v1 == cg.LimitEvents(2, 5, 0)
    assert cg.limit_events("", "") == cg.LimitEvents()
    assert v1 + v2 == cg.LimitEvents(5, 824, 1)
    assert cg.pids_events_file("v1") == ("pids", "pids.events")
    assert cg.pids_events_file("v2") == ("", "pids.events")


# Forks until refused (children that wait), says how many were refused, ends them.
FORKS = (
    "import os, signal\n"
    "kids, refused = [], 0\n"
    "for _ in range(40):\n"
    "    try:\n"
    "        pid = os.fork()\n"
    "    except OSError:\n"
    "        refused += 1\n"
    "        continue\n"
    "    if pid == 0:\n"
    "        signal.pause()\n"
    "    kids.append(pid)\n"
    "for pid in kids:\n"
    "    os.kill(pid, signal.SIGKILL)\n"
    "    os.waitpid(pid, 0)\n"
    "print(refused)\n"
)
HOG = "x = []\nwhile True:\n    x.append(bytearray(4 << 20))\n"


def _run_in(entry: tuple[str, ...], code: str) -> subprocess.CompletedProcess[str]:
    setup = child_setup(["python3", "-c", code], cwd="/", env=dict(os.environ), creds=None,
                        fence=None, cgroup=entry)  # fmt: skip
    return subprocess.run(
        setup.argv, cwd=setup.cwd, preexec_fn=setup.preexec, capture_output=True, text=True,
        timeout=120, env=dict(os.environ),
    )  # fmt: skip


def test_a_groups_limit_events_are_the_kernels_and_outlive_the_group() -> None:
    """Issue #34: a fork loop that survives showed PROCS 32 while the kernel counted 819 refused
    forks, and nothing counted OOM kills. A real group at `pids_max = 16` and `memory_max =
    48 MiB`: the refused forks and the OOM kill are the kernel's counts, and they are kept when
    the group is removed and made anew (the agent's next run)."""
    backend = cg.detect()
    if backend.kind == "none":
        pytest.skip(f"no usable cgroup backend here: {backend.reason}")
    limits = cg.Limits(48 << 20, 16, 100)
    with tempfile.TemporaryDirectory(prefix="mcphost-test-cg-") as state:
        groups = cg.Cgroups(backend, state, limits)
        groups.prepare()
        group = groups.group("limited", limits)
        assert group is not None
        try:
            first = _run_in(group.ensure(new_run=True), FORKS)
            refused = int(first.stdout)
            assert refused > 0, first
            assert group.events() == cg.LimitEvents(pids_limit_hits=refused)
            hog = _run_in(group.ensure(new_run=True), HOG)
            assert hog.returncode == -9, hog  # SIGKILL: the OOM killer's
            assert group.events().oom_kills >= 1
            assert group.oom_kills() == group.events().oom_kills
            before = group.events()
            assert groups_removed(group)
            assert group.events() == before  # folded in when the group went
            again = int(_run_in(group.ensure(new_run=True), FORKS).stdout)
            assert group.oom_kills() == 0  # the new group's own count starts at 0
            assert group.events() == before + cg.LimitEvents(pids_limit_hits=again)
        finally:
            assert groups_removed(group)
            groups.close()


def test_proc_cgroup_and_mounts() -> None:
    unified, v1 = cg.parse_proc_cgroup(HYBRID_CGROUP)
    assert unified == "/"
    assert v1 == {"pids": "/", "memory": "/process_api/abc", "cpuacct": "/", "cpu": "/"}
    v2_mount, mounts = cg.parse_mountinfo(HYBRID_MOUNTS)
    assert v2_mount is not None and v2_mount.point == "/sys/fs/cgroup/unified"
    assert mounts["memory"].point == "/sys/fs/cgroup/memory"
    assert cg.located(mounts["memory"], v1["memory"]) == "/sys/fs/cgroup/memory/process_api/abc"
    assert cg.located(mounts["pids"], "/") == "/sys/fs/cgroup/pids"
    # a container that sees only part of the hierarchy
    part = cg.Mount("/sys/fs/cgroup", "/docker/x", frozenset())
    assert cg.located(part, "/docker/x/sub") == "/sys/fs/cgroup/sub"
    assert cg.located(part, "/elsewhere") is None


def test_detect_without_controllers_says_why() -> None:
    backend = cg.detect(
        "0::/user.slice/x\n", UNIFIED_MOUNTS.replace("/sys/fs/cgroup", "/nonexistent")
    )
    assert backend.kind == "none"
    assert "cgroup v2" in backend.reason and "controller" in backend.reason


def test_a_supervisor_started_in_the_leaf_of_an_earlier_one_shares_its_base() -> None:
    """Found on Debian 12's kernel (tests/kernels/test_kernels.py): a supervisor started again
    from a process the first one moved into its leaf took the leaf as its base, nested a new
    leaf in it, and never found the groups the crashed one left."""
    assert (
        cg.own_base("/system.slice/mcphost.service/supervisor") == "/system.slice/mcphost.service"
    )
    assert cg.own_base("/system.slice/mcphost.service") == "/system.slice/mcphost.service"
    assert cg.own_base("/supervisor") == "/"
    assert cg.own_base("/") == "/"
    assert cg.own_base("/x/supervisors") == "/x/supervisors"


def test_names_are_stable() -> None:
    assert cg.instance_name("/var/lib/x") == cg.instance_name("/var/lib/x/")
    assert cg.instance_name("/var/lib/x") != cg.instance_name("/var/lib/y")
    assert cg.group_name("a1") == "agent-a1"


def test_entry_files_per_backend() -> None:
    """v1: `tasks` (the writer's thread alone: no wait for an RCU grace period); v2:
    `cgroup.procs` (a thread cannot leave its domain group there)."""
    assert cg.entry_file("v1") == "tasks"
    assert cg.entry_file("v2") == "cgroup.procs"


def test_a_child_and_what_it_starts_are_in_every_hierarchy_of_its_group() -> None:
    """The spawn's pre-exec step (kernel.child_setup) with the entry files `ensure` returns: the
    child, and a process it starts, are in the agent's group in every controller; the spawning
    process is not."""
    backend = cg.detect()
    if backend.kind == "none":
        pytest.skip(f"no usable cgroup backend here: {backend.reason}")
    with tempfile.TemporaryDirectory(prefix="mcphost-test-cg-") as state:
        groups = cg.Cgroups(backend, state, LIMITS)
        groups.prepare()
        group = groups.group("entry", LIMITS)
        assert group is not None
        try:
            entry = group.ensure()
            assert {os.path.basename(p) for p in entry} == {cg.entry_file(backend.kind)}
            script = "cat /proc/self/cgroup; sh -c 'cat /proc/self/cgroup'"
            setup = child_setup(["sh", "-c", script], cwd="/", env={}, creds=None, fence=None,
                                cgroup=entry)  # fmt: skip
            done = subprocess.run(
                setup.argv, cwd=setup.cwd, preexec_fn=setup.preexec, capture_output=True,
                text=True, check=True, timeout=60,
            )  # fmt: skip
        finally:
            assert groups_removed(group)
            groups.close()
    name = cg.group_name("entry")
    lines = done.stdout.splitlines()
    for table in (lines[: len(lines) // 2], lines[len(lines) // 2 :]):
        unified, v1 = cg.parse_proc_cgroup("\n".join(table))
        paths = [unified] if backend.kind == "v2" else [v1[c] for c in backend.bases]
        assert all(path is not None and path.endswith("/" + name) for path in paths), table
    with open("/proc/self/cgroup") as own:
        assert name not in own.read()


def groups_removed(group: cg.AgentGroup) -> bool:
    return group.remove_now() and not group.exists


def _hierarchies(tmp_path: Path, mounts: dict[str, str]) -> str:
    """A mountinfo of v1 hierarchies at directories under `tmp_path` ({point: controllers}),
    each writable as root's are (a `cgroup.procs` in it)."""
    lines = []
    for index, (point, controllers) in enumerate(mounts.items()):
        directory = tmp_path / point
        directory.mkdir()
        (directory / "cgroup.procs").write_text("")
        lines.append(
            f"{40 + index} 31 0:{40 + index} / {directory} rw - cgroup cgroup rw,{controllers}"
        )
    return "\n".join(lines) + "\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="the hierarchies must be writable as root's are")
@pytest.mark.parametrize("together", [False, True])
def test_v1_accounts_cpu_in_cpuacct_apart_or_mounted_with_cpu(
    tmp_path: Path, together: bool
) -> None:
    mounts = {"memory": "memory", "pids": "pids"}
    mounts.update(
        {"cpu,cpuacct": "cpu,cpuacct"} if together else {"cpu": "cpu", "cpuacct": "cpuacct"}
    )
    own = (
        "8:pids:/\n4:memory:/\n2:cpuacct:/\n1:cpu:/\n"
        if not together
        else "8:pids:/\n4:memory:/\n1:cpu,cpuacct:/\n"
    )
    backend = cg.detect(own, _hierarchies(tmp_path, mounts))
    assert backend.kind == "v1" and set(backend.bases) == {"memory", "pids", "cpu", "cpuacct"}
    assert backend.reason.count(str(tmp_path)) == (3 if together else 4)  # each directory once
    group = cg.Cgroups(backend, str(tmp_path / "state"), cg.Limits(None, None, 100)).group(
        "a1", cg.Limits(None, None, 100)
    )
    assert group is not None
    assert len(group.unique_dirs) == (3 if together else 4)
    files = group.usage_files
    assert files is not None
    assert files.memory_current == os.path.join(group.dirs["memory"], "memory.usage_in_bytes")
    assert files.memory_peak == os.path.join(group.dirs["memory"], "memory.max_usage_in_bytes")
    assert files.cpu == os.path.join(group.dirs["cpuacct"], "cpuacct.usage")
    assert files.processes == os.path.join(group.dirs["pids"], "pids.current")


@pytest.mark.skipif(os.geteuid() != 0, reason="the hierarchies must be writable as root's are")
def test_v1_without_cpuacct_keeps_its_limits_and_reads_usage_from_proc(tmp_path: Path) -> None:
    mounts = _hierarchies(tmp_path, {"memory": "memory", "pids": "pids", "cpu": "cpu"})
    backend = cg.detect("8:pids:/\n4:memory:/\n1:cpu:/\n", mounts)
    assert backend.kind == "v1" and "cpuacct" not in backend.bases
    group = cg.AgentGroup("v1", "a1", {c: f"/x/{c}" for c in backend.bases}, cg.Limits(1, 1, 1))
    assert group.usage_files is None


def test_usage_files_of_v2() -> None:
    files = cg.usage_files("v2", {"": "/sys/fs/cgroup/m/agent-a1"})
    assert files is not None and [os.path.basename(f) for f in files] == [
        "memory.current", "memory.peak", "cpu.stat", "pids.current",
    ]  # fmt: skip
    assert cg.usage_files("none", {}) is None


def test_the_kernel_keeps_the_peaks_only_where_every_group_has_a_peak_and_a_cpu_account(
    tmp_path: Path,
) -> None:
    """`Cgroups.keeps_peaks`: where it holds, the supervisor samples no usage between readers
    (operations.py `sample_usage_forever` ends at once: nothing wakes an idle supervisor)."""
    state = str(tmp_path / "state")
    limits = cg.Limits(None, None, 100)
    v1 = {c: str(tmp_path / c) for c in ("memory", "pids", "cpu", "cpuacct")}
    assert cg.Cgroups(cg.Backend("v1", "", v1), state, limits).keeps_peaks()
    without_cpuacct = {c: p for c, p in v1.items() if c != "cpuacct"}
    assert not cg.Cgroups(cg.Backend("v1", "", without_cpuacct), state, limits).keeps_peaks()
    v2 = cg.Cgroups(cg.Backend("v2", "", {"": str(tmp_path / "v2")}), state, limits)
    assert not v2.keeps_peaks()  # no memory.peak (before Linux 5.19)
    instance = tmp_path / "v2" / cg.instance_name(state)
    instance.mkdir(parents=True)
    (instance / "memory.peak").write_text("0\n")
    assert v2.keeps_peaks()
    assert not cg.Cgroups(cg.Backend("none", "no backend"), state, limits).keeps_peaks()
