"""Per-agent limits: each agent's process tree in a cgroup of its own.

Owns: the planning (pure: the fleet keys `memory_max`, `pids_max`, `cpu_weight` as numbers (parsed
as values.py's sizes and counts; "max", `UNLIMITED`, is no limit), the documented defaults derived
from what the supervisor's own group may use, the files each backend writes, the files each
backend's usage is read from (`usage_files`: usage.py reads them), the parsing of
`/proc/self/cgroup`, `/proc/self/mountinfo` and the kernel's counts of the limits met
(`LimitEvents`: OOM kills from `memory.events` on v2, `memory.oom_control` on v1; forks refused
at `pids_max` from `pids.events`, both)) and a thin writer (`Cgroups`, `AgentGroup`): detect the
backend at start, make the groups, write the limits, read the counts, and remove a group once
nothing of it runs.

The counts are the agent's since its runner was made (`AgentGroup.events`): the kernel's count of
the group now, plus what its earlier groups counted (a group removed when its runner stops
running the agent, `ctl restart` and `ctl stop` then `start` among them, folds its count in
first), so a counter never goes back while the fleet keeps the agent's plan.

Layout: `<base>/mcphost-<instance>/agent-<id>`, where `<base>` is the supervisor's own cgroup
(per controller on v1) and `<instance>` a digest of the state directory, so the next supervisor
of the same state finds (and cleans) what a crashed one left. A group is made at an agent's
spawn and removed when its runner stops running it (stopped, failed, removed): restarts reuse
it. The supervisor stays outside its agents' groups: on cgroup v2 it moves itself (and whatever shared its group) into the leaf
`<base>/supervisor` first (v2 lets a group hand controllers to children only while it has no
process of its own), unless `<base>` is the root; a supervisor that starts inside such a leaf
takes the leaf's parent as its base (`own_base`).

Backends, detected at start (`detect`): `v2` (a cgroup2 mount whose `cgroup.controllers` has
memory, pids and cpu, the supervisor's own group writable: root, or a delegated subtree:
systemd's `Delegate=yes`), `v1` (the memory, pids and cpu hierarchies mounted and writable:
root on a legacy or hybrid system; the cpuacct hierarchy too where it is, mounted with cpu or
apart, for the agents' CPU time: without it their usage comes from /proc), else `none` with the
reason (`mcphost supervise --check` and `ctl status` say so; agents then run without limits).

Placement: a child enters its group before it execs: the spawn's pre-exec step (kernel.py)
writes "0" (the writer itself) to each entry file `AgentGroup.ensure` returns; a tmux pane's
gate (mcphost/gate.py `main`) does the same from the paths in its FIFO message. Everything the child
starts inherits the group. The entry files (`entry_file`): v2's `cgroup.procs`; on v1 each
hierarchy's `tasks`, which moves the writing thread alone: the writer (a child between fork and
exec, or the gate: one thread each) is its whole process, and the kernel moves the current
thread alone without the global threadgroup lock, whose every writer waits for an RCU grace
period (5 to 12 ms on the test machine, each spawn: bench/cgroups.py); a move by v1's
`cgroup.procs` took it. On v2 a thread cannot move to another domain group, so the entry is
`cgroup.procs` there.

Must never: put the supervisor in an agent's group, write outside `<base>/mcphost-<instance>`
(and the v2 leaf and `cgroup.subtree_control` of `<base>`), remove a group that still has a
process (what is left is killed first: the agent's run has ended), or hand an entry file to a
writer that has more than one thread (on v1 the others would stay behind).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from mcphost.events import emit
from mcphost.supervisor.confine.usage import CgroupFiles
from mcphost.supervisor.values import UNLIMITED

CGROUP_ROOT = "/sys/fs/cgroup"
V1_CONTROLLERS = ("memory", "pids", "cpu")
V1_ACCOUNTING = ("cpuacct",)  # used where mounted and writable: the CPU time of usage.py
V2_CONTROLLERS = ("memory", "pids", "cpu")
DEFAULT_MEMORY_MAX = 2 << 30  # at most; and at most half of what the supervisor's group may use
DEFAULT_PIDS_MAX = 512  # at most; and at most a quarter of the supervisor's group's limit
DEFAULT_CPU_WEIGHT = 100  # cgroup v2's default weight: every agent an equal share
MEMORY_SHARE = 2
PIDS_SHARE = 4
OOM_REASON = "out of memory"
_UNLIMITED_V1 = 1 << 62  # v1 reads back "no limit" as a huge number

Kind = Literal["v2", "v1", "none"]
LEAF = "supervisor"  # v2: the supervisor's own leaf beside its agents' groups


class Planned(Protocol):
    """What the limits read of an agent's plan (plan.AgentPlan)."""

    @property
    def memory_max(self) -> int | str | None: ...
    @property
    def pids_max(self) -> int | str | None: ...
    @property
    def cpu_weight(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class Limits:
    """One agent's limits as written to its group (None: no limit)."""

    memory_max: int | None
    pids_max: int | None
    cpu_weight: int

    def as_json(self) -> dict[str, int | None]:
        return {
            "memory_max": self.memory_max,
            "pids_max": self.pids_max,
            "cpu_weight": self.cpu_weight,
        }


def default_limits(memory_ceiling: int | None, pids_ceiling: int | None) -> Limits:
    """The documented defaults: memory `min(2 GiB, ceiling / 2)`, processes
    `min(512, ceiling / 4)`, weight 100. A ceiling is what the supervisor's own group (and its
    ancestors) may use: the machine's RAM or the tightest memory limit above; the tightest
    `pids.max` above (None: none), so one agent never takes all of its supervisor's share."""
    memory = DEFAULT_MEMORY_MAX
    if memory_ceiling is not None:
        memory = max(16 << 20, min(memory, memory_ceiling // MEMORY_SHARE))
    pids = DEFAULT_PIDS_MAX
    if pids_ceiling is not None:
        pids = max(16, min(pids, pids_ceiling // PIDS_SHARE))
    return Limits(memory, pids, DEFAULT_CPU_WEIGHT)


def resolve_limits(
    memory_max: int | str | None,
    pids_max: int | str | None,
    cpu_weight: int | None,
    defaults: Limits,
) -> Limits:
    """An agent's limits: its plan's values (None: the default; "max": no limit)."""

    def pick(value: int | str | None, default: int | None) -> int | None:
        if value is None:
            return default
        return None if value == UNLIMITED else int(value)

    return Limits(
        pick(memory_max, defaults.memory_max),
        pick(pids_max, defaults.pids_max),
        defaults.cpu_weight if cpu_weight is None else cpu_weight,
    )


# -- what each backend writes ---------------------------------------------------------------


def v1_cpu_shares(weight: int) -> int:
    """cgroup v1's `cpu.shares` for a v2 `cpu.weight` (100 -> 1024, the v1 default)."""
    return max(2, weight * 1024 // 100)


def writes(kind: Kind, limits: Limits) -> list[tuple[str, str, str]]:
    """(controller, file, value) in the order to write them ("" is v2's one hierarchy).
    v1 writes memsw after memory (the kernel refuses memsw below memory); both bound RAM with
    swap, as v2's `memory.swap.max = 0` does, so a hog is killed rather than swapped."""
    memory = UNLIMITED if limits.memory_max is None else str(limits.memory_max)
    pids = UNLIMITED if limits.pids_max is None else str(limits.pids_max)
    if kind == "v2":
        return [
            ("", "memory.max", memory),
            ("", "memory.swap.max", "0" if limits.memory_max is not None else UNLIMITED),
            ("", "memory.oom.group", "1"),
            ("", "pids.max", pids),
            ("", "cpu.weight", str(limits.cpu_weight)),
        ]
    if kind == "v1":
        v1_memory = "-1" if limits.memory_max is None else memory
        return [
            ("memory", "memory.limit_in_bytes", v1_memory),
            ("memory", "memory.memsw.limit_in_bytes", v1_memory),
            ("pids", "pids.max", pids),
            ("cpu", "cpu.shares", str(v1_cpu_shares(limits.cpu_weight))),
        ]
    return []


OPTIONAL_FILES = frozenset({"memory.swap.max", "memory.memsw.limit_in_bytes", "memory.oom.group"})
# v1 counters a spawn starts over (a write resets them), so a group that outlives restarts shows
# the current generation's peak and CPU time, as /proc does; best effort. v2 has no such reset:
# its `memory.peak` and `cpu.stat` count since the group was made.
V1_RESETS = (
    ("memory", "memory.max_usage_in_bytes", "0"),
    ("cpuacct", "cpuacct.usage", "0"),
)


def usage_files(kind: Kind, dirs: Mapping[str, str]) -> CgroupFiles | None:
    """Where usage.py reads a group's memory, peak, CPU and processes (`dirs`: the group's
    directory per controller, "" for v2); None without a CPU account (v1 without cpuacct)."""
    if kind == "v2" and "" in dirs:
        group = dirs[""]
        return CgroupFiles(
            os.path.join(group, "memory.current"),
            os.path.join(group, "memory.peak"),
            os.path.join(group, "cpu.stat"),
            os.path.join(group, "pids.current"),
        )
    if kind != "v1" or not {"memory", "cpuacct", "pids"} <= set(dirs):
        return None
    return CgroupFiles(
        os.path.join(dirs["memory"], "memory.usage_in_bytes"),
        os.path.join(dirs["memory"], "memory.max_usage_in_bytes"),
        os.path.join(dirs["cpuacct"], "cpuacct.usage"),
        os.path.join(dirs["pids"], "pids.current"),
    )


def event_count(text: str, key: str) -> int:
    """`<key> N` of a flat-keyed cgroup file (`memory.events`, `memory.oom_control`,
    `pids.events`); 0 without."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def oom_kills(text: str) -> int:
    """`oom_kill N` of a `memory.events` (v2) or `memory.oom_control` (v1) file: the processes
    of the group the OOM killer ended (v2 with `memory.oom.group`: every process of a group kill
    counts); 0 without."""
    return event_count(text, "oom_kill")


def pids_limit_hits(text: str) -> int:
    """`max N` of a `pids.events` file (v1 and v2): the forks and clones refused because the
    group was at its `pids.max`; 0 without."""
    return event_count(text, "max")


def oom_file(kind: Kind) -> tuple[str, str]:
    return ("", "memory.events") if kind == "v2" else ("memory", "memory.oom_control")


def pids_events_file(kind: Kind) -> tuple[str, str]:
    return ("" if kind == "v2" else "pids", "pids.events")


@dataclass(frozen=True, slots=True)
class LimitEvents:
    """How often an agent met its limits: `oom_kills` (processes the kernel's OOM killer ended),
    `pids_limit_hits` (forks refused at `pids_max`), `oom_group_kills` (v2 with
    `memory.oom.group`, kernel 5.19 and later: the times the whole group was ended at once)."""

    oom_kills: int = 0
    pids_limit_hits: int = 0
    oom_group_kills: int = 0

    def __add__(self, other: LimitEvents) -> LimitEvents:
        return LimitEvents(
            self.oom_kills + other.oom_kills,
            self.pids_limit_hits + other.pids_limit_hits,
            self.oom_group_kills + other.oom_group_kills,
        )

    def as_json(self) -> dict[str, int]:
        return {
            "oom_kills": self.oom_kills,
            "pids_limit_hits": self.pids_limit_hits,
            "oom_group_kills": self.oom_group_kills,
        }


def limit_events(memory_events: str, pids_events: str) -> LimitEvents:
    """The counts of a group's memory events file (`oom_file`) and its `pids.events`."""
    return LimitEvents(
        oom_kills(memory_events),
        pids_limit_hits(pids_events),
        event_count(memory_events, "oom_group_kill"),
    )


def entry_file(kind: Kind) -> str:
    """The file of a group a single-threaded process writes "0" to, to enter it (module doc,
    Placement): v1's `tasks` (no RCU grace period), v2's `cgroup.procs`."""
    return "cgroup.procs" if kind == "v2" else "tasks"


# -- detection (pure parts) -----------------------------------------------------------------


def parse_proc_cgroup(text: str) -> tuple[str | None, dict[str, str]]:
    """`/proc/<pid>/cgroup` -> (the v2 path or None, {v1 controller: path})."""
    unified: str | None = None
    v1: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, names, path = parts
        if hid == "0" and names == "":
            unified = path
            continue
        for name in names.split(","):
            if name and not name.startswith("name="):
                v1[name] = path
    return unified, v1


@dataclass(frozen=True, slots=True)
class Mount:
    point: str
    root: str  # the part of the hierarchy mounted there
    options: frozenset[str]


def parse_mountinfo(text: str) -> tuple[Mount | None, dict[str, Mount]]:
    """`/proc/self/mountinfo` -> (the cgroup2 mount or None, {v1 controller: its mount})."""
    unified: Mount | None = None
    v1: dict[str, Mount] = {}
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        fstype, super_opts = tail[0], frozenset(tail[2].split(","))
        point = fields[4].replace("\\040", " ")
        mount = Mount(point, fields[3], super_opts)
        if fstype == "cgroup2" and unified is None:
            unified = mount
        elif fstype == "cgroup":
            for name in super_opts:
                if name in ("cpu", "cpuacct", "memory", "pids", "cpuset") and name not in v1:
                    v1[name] = mount
    return unified, v1


def located(mount: Mount, path: str) -> str | None:
    """Where the group `path` (as /proc/self/cgroup names it) is under `mount`; None when the
    mount does not show it (another part of the hierarchy is mounted)."""
    root = mount.root.rstrip("/")
    if root and path != root and not path.startswith(root + "/"):
        return None
    rest = path[len(root) :].lstrip("/")
    return os.path.join(mount.point, rest) if rest else mount.point


def instance_name(state_dir: str) -> str:
    """`mcphost-<12 hex of the state directory's real path>`: stable across restarts."""
    digest = hashlib.sha256(os.path.realpath(state_dir).encode()).hexdigest()[:12]
    return f"mcphost-{digest}"


def group_name(agent_id: str) -> str:
    return f"agent-{agent_id}"


@dataclass(frozen=True, slots=True)
class Backend:
    """What `detect` found: `kind`, its base group per controller ("" for v2), and `reason`
    (why `none`, or which hierarchy is used)."""

    kind: Kind
    reason: str
    bases: Mapping[str, str] = field(default_factory=dict)
    is_root: bool = False  # v2: the base is the hierarchy's root (no leaf needed)

    def as_json(self) -> dict[str, object]:
        return {"backend": self.kind, "reason": self.reason}


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as handle:
        return handle.read()


def _writable(path: str) -> bool:
    return os.access(path, os.W_OK) and os.access(os.path.join(path, "cgroup.procs"), os.W_OK)


def own_base(group: str) -> str:
    """The base of a supervisor in v2 group `group`: that group, or, when it is the leaf an
    earlier supervisor made (`<base>/supervisor`: a supervisor started again from a shell or a
    process that was moved there with it), the leaf's parent. So every supervisor of a state
    uses one base, and finds (and cleans) the groups a crashed one left."""
    parent, _, name = group.rstrip("/").rpartition("/")
    return (parent or "/") if name == LEAF else group


def _v1_base(
    name: str, mounts: Mapping[str, Mount], own: Mapping[str, str]
) -> tuple[str | None, str | None]:
    """(the supervisor's group in the v1 hierarchy of controller `name`, or why not)."""
    mount, path = mounts.get(name), own.get(name)
    where = located(mount, path) if mount is not None and path is not None else None
    if where is None:
        return None, f"cgroup v1: no {name} hierarchy"
    if not _writable(where):
        return None, f"cgroup v1: {where} is not writable (run as root)"
    return where, None


def detect(proc_cgroup: str | None = None, mountinfo: str | None = None) -> Backend:
    """The backend for this process (its own cgroup and the machine's mounts)."""
    try:
        proc_cgroup = _read("/proc/self/cgroup") if proc_cgroup is None else proc_cgroup
        mountinfo = _read("/proc/self/mountinfo") if mountinfo is None else mountinfo
    except OSError as exc:
        return Backend("none", f"cannot read the process's cgroups: {exc}")
    own_v2, own_v1 = parse_proc_cgroup(proc_cgroup)
    own_v2 = None if own_v2 is None else own_base(own_v2)
    unified, v1_mounts = parse_mountinfo(mountinfo)
    problems: list[str] = []
    if unified is not None and own_v2 is not None:
        base = located(unified, own_v2)
        try:
            enabled = set(_read(os.path.join(unified.point, "cgroup.controllers")).split())
        except OSError:
            enabled = set()
        missing = [c for c in V2_CONTROLLERS if c not in enabled]
        if base is None:
            problems.append(f"cgroup v2: the supervisor's group {own_v2} is not mounted here")
        elif missing:
            problems.append(f"cgroup v2 at {unified.point} has no {', '.join(missing)} controller")
        elif not _writable(base):
            problems.append(
                f"cgroup v2: the supervisor's group {base} is not writable (run as root, or "
                "under a systemd unit with Delegate=yes)"
            )
        else:
            try:
                here = set(_read(os.path.join(base, "cgroup.controllers")).split())
            except OSError:
                here = set()
            lost = [c for c in V2_CONTROLLERS if c not in here]
            if lost:
                problems.append(f"cgroup v2: {base} is not given the {', '.join(lost)} controller")
            else:
                return Backend("v2", f"cgroup v2 at {base}", {"": base}, own_v2 in ("/", ""))
    bases: dict[str, str] = {}
    for name in V1_CONTROLLERS:
        where, problem = _v1_base(name, v1_mounts, own_v1)
        if where is not None:
            bases[name] = where
        elif problem is not None:
            problems.append(problem)
    if len(bases) == len(V1_CONTROLLERS):
        for name in V1_ACCOUNTING:  # optional: without it, usage from /proc
            where, _ = _v1_base(name, v1_mounts, own_v1)
            if where is not None:
                bases[name] = where
        shown = ", ".join(dict.fromkeys(bases.values()))  # cpu and cpuacct mounted together: once
        return Backend("v1", f"cgroup v1 ({shown})", bases)
    return Backend("none", "; ".join(problems) or "no cgroup hierarchy")


def ceilings(backend: Backend) -> tuple[int | None, int | None]:
    """(memory, processes) the supervisor's own group and its ancestors allow: the tightest
    limit found walking up from each base (memory: at most the machine's RAM)."""
    ram: int | None
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        ram = None
    if backend.kind == "none":
        return ram, None
    memory_base = backend.bases["" if backend.kind == "v2" else "memory"]
    pids_base = backend.bases["" if backend.kind == "v2" else "pids"]
    memory_file = "memory.max" if backend.kind == "v2" else "memory.limit_in_bytes"
    memory = _tightest(memory_base, memory_file, ram)
    return memory, _tightest(pids_base, "pids.max", None)


def _tightest(start: str, name: str, bound: int | None) -> int | None:
    best = bound
    path = start
    while path.startswith(CGROUP_ROOT) and len(path) > len(CGROUP_ROOT):
        with contextlib.suppress(OSError, ValueError):
            text = _read(os.path.join(path, name)).strip()
            if text != UNLIMITED and int(text) < _UNLIMITED_V1:
                best = int(text) if best is None else min(best, int(text))
        path = os.path.dirname(path)
    return best


# -- the writer -----------------------------------------------------------------------------


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _pids(group: str) -> list[int]:
    try:
        return [int(p) for p in _read(os.path.join(group, "cgroup.procs")).split()]
    except (OSError, ValueError):
        return []


def _kill_all(group: str) -> None:
    """SIGKILL everything in `group` (v2's `cgroup.kill` where there is one)."""
    kill = os.path.join(group, "cgroup.kill")
    if os.path.exists(kill):
        with contextlib.suppress(OSError):
            _write(kill, "1")
            return
    for pid in _pids(group):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _rmdir_quietly(path: str) -> bool:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


class AgentGroup:
    """One agent's group (one directory per controller on v1). Event loop thread only."""

    def __init__(self, kind: Kind, agent_id: str, dirs: Mapping[str, str], limits: Limits) -> None:
        self.kind = kind
        self.agent_id = agent_id
        self.dirs = dict(dirs)
        self.limits = limits
        # each directory once (v1's cpu and cpuacct may be one hierarchy: one directory)
        self.unique_dirs = tuple(dict.fromkeys(self.dirs.values()))
        self.usage_files = usage_files(kind, self.dirs)  # None: the agent's usage from /proc
        self._earlier = LimitEvents()  # what the agent's removed groups counted (`events`)
        self._folded = False  # this group's counts are in `_earlier` (it is being removed)

    @property
    def path(self) -> str:
        """The group usage is read from: v2's directory, v1's memory one."""
        return self.dirs["" if self.kind == "v2" else "memory"]

    @property
    def exists(self) -> bool:
        return os.path.isdir(self.path)

    def ensure(self, new_run: bool = False) -> tuple[str, ...]:
        """Make the group (if need be) with its limits; the entry files (`entry_file`) a
        single-threaded child writes "0" to before it execs. `new_run`: the agent's spawn (not
        a `ctl exec`): v1's peak and CPU counters start over (`V1_RESETS`). OSError when it
        cannot be made."""
        for directory in self.unique_dirs:
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory, 0o755)
                self._folded = False  # a new group: the kernel counts from 0
        for controller, name, value in writes(self.kind, self.limits):
            path = os.path.join(self.dirs[controller], name)
            try:
                _write(path, value)
            except OSError:
                if name not in OPTIONAL_FILES:  # a kernel without swap accounting, say
                    raise
        if new_run and self.kind == "v1":
            for controller, name, value in V1_RESETS:
                if controller in self.dirs:
                    with contextlib.suppress(OSError):
                        _write(os.path.join(self.dirs[controller], name), value)
        return tuple(os.path.join(d, entry_file(self.kind)) for d in self.unique_dirs)

    def oom_kills(self) -> int:
        """The OOM kills of the group now (not its earlier groups': `events` adds those)."""
        return self._current().oom_kills

    def _current(self) -> LimitEvents:
        """The kernel's counts of the group as it is now (none when it is not there)."""
        texts = []
        for controller, name in (oom_file(self.kind), pids_events_file(self.kind)):
            try:
                texts.append(_read(os.path.join(self.dirs[controller], name)))
            except (OSError, KeyError):
                texts.append("")
        return limit_events(*texts)

    def events(self) -> LimitEvents:
        """How often the agent met its limits since its runner was made: this group's counts
        and those of the groups it had before (module doc)."""
        return self._earlier if self._folded else self._earlier + self._current()

    def _fold(self) -> None:
        """Before the group is removed: its counts kept (`events`), once per group made."""
        if not self._folded:
            self._earlier = self._earlier + self._current()
            self._folded = True

    async def remove(self, timeout: float = 10.0) -> bool:
        """Kill what is left in the group, wait until it is empty, remove it; False when it
        could not be (an unkillable process: left, and said)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self._fold()
        for directory in self.unique_dirs:
            while os.path.isdir(directory) and not _rmdir_quietly(directory):
                if loop.time() >= deadline:
                    emit(
                        "supervisor.cgroup_busy",
                        level="error",
                        agent_id=self.agent_id,
                        group=directory,
                    )
                    return False
                _kill_all(directory)
                await asyncio.sleep(0.01)
        return True

    def remove_now(self, timeout: float = 10.0) -> bool:
        """`remove`, blocking (at start, before the event loop serves anything)."""
        deadline = time.monotonic() + timeout
        self._fold()
        for directory in self.unique_dirs:
            while os.path.isdir(directory) and not _rmdir_quietly(directory):
                if time.monotonic() >= deadline:
                    return False
                _kill_all(directory)
                time.sleep(0.01)
        return True


class Cgroups:
    """The supervisor's per-agent groups under one backend (see the module docstring)."""

    def __init__(self, backend: Backend, state_dir: str, defaults: Limits | None = None) -> None:
        self.backend = backend
        self.instance = instance_name(state_dir)
        if defaults is None:
            defaults = default_limits(*ceilings(backend))
        self.defaults = defaults

    @property
    def kind(self) -> Kind:
        return self.backend.kind

    def as_json(self) -> dict[str, object]:
        return {**self.backend.as_json(), "defaults": self.defaults.as_json()}

    def keeps_peaks(self) -> bool:
        """Whether the kernel keeps every agent group's memory peak and CPU account (usage.py
        reads them when asked): v1 with its cpuacct hierarchy (`memory.max_usage_in_bytes`),
        v2 with `memory.peak` (Linux 5.19 and later; looked for in the instance's own group,
        after `prepare`). Then nothing need be sampled between readers."""
        dirs = self._instance_dirs()
        if self.kind == "v1":
            return {"memory", "cpuacct", "pids"} <= set(dirs)
        if self.kind == "v2" and "" in dirs:
            return os.path.exists(os.path.join(dirs[""], "memory.peak"))
        return False

    def _instance_dirs(self) -> dict[str, str]:
        return {c: os.path.join(base, self.instance) for c, base in self.backend.bases.items()}

    def _unique_instance_dirs(self) -> dict[str, str]:
        """`_instance_dirs` with each directory once: {directory: a controller of it}."""
        unique: dict[str, str] = {}
        for controller, directory in self._instance_dirs().items():
            unique.setdefault(directory, controller)
        return unique

    def prepare(self) -> list[str]:
        """Start-up: (v2) the supervisor into its leaf and the controllers handed down; the
        instance's groups made, and every agent group a crashed supervisor left removed (what
        ran in it killed). Returns the stale groups removed. OSError when the base refuses."""
        if self.kind == "none":
            return []
        if self.kind == "v2":
            self._prepare_v2()
        stale: list[str] = []
        for directory, controller in self._unique_instance_dirs().items():
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory, 0o755)
            if self.kind == "v2":
                _write(os.path.join(directory, "cgroup.subtree_control"), _enable())
            for name in sorted(os.listdir(directory)):
                path = os.path.join(directory, name)
                if name.startswith("agent-") and os.path.isdir(path):
                    AgentGroup(self.kind, name, {controller: path}, self.defaults).remove_now()
                    stale.append(path)
        if stale:
            emit("supervisor.cgroups_stale_removed", groups=stale)
        return stale

    def _prepare_v2(self) -> None:
        base = self.backend.bases[""]
        if not self.backend.is_root:
            leaf = os.path.join(base, LEAF)
            with contextlib.suppress(FileExistsError):
                os.mkdir(leaf, 0o755)
            for _ in range(8):  # a process forked meanwhile: move it too
                pids = _pids(base)
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        _write(os.path.join(leaf, "cgroup.procs"), str(pid))
        _write(os.path.join(base, "cgroup.subtree_control"), _enable())

    def group(self, agent_id: str, limits: Limits) -> AgentGroup | None:
        """The agent's group (made at its first spawn: `AgentGroup.ensure`); None without a
        backend."""
        if self.kind == "none":
            return None
        dirs = {c: os.path.join(d, group_name(agent_id)) for c, d in self._instance_dirs().items()}
        return AgentGroup(self.kind, agent_id, dirs, limits)

    def limits_of(self, plan: Planned) -> Limits:
        """The limits of an agent's plan, defaults applied."""
        return resolve_limits(plan.memory_max, plan.pids_max, plan.cpu_weight, self.defaults)

    def close(self) -> None:
        """At shutdown, after every agent is gone: the instance's groups removed."""
        for directory in self._unique_instance_dirs():
            _rmdir_quietly(directory)


def _enable() -> str:
    return " ".join(f"+{c}" for c in V2_CONTROLLERS)


def open_cgroups(state_dir: str) -> Cgroups:
    """Detect the backend and prepare it; a backend that refuses to be prepared is `none`,
    with the reason (emitted as a warning: agents run without limits; a backend found is a
    debug line, `ctl status` and `--check` name it)."""
    cgroups = Cgroups(detect(), state_dir)
    try:
        cgroups.prepare()
    except OSError as exc:
        reason = f"{cgroups.backend.reason}: cannot prepare it: {exc}"
        cgroups = Cgroups(Backend("none", reason), state_dir)
    emit(
        "supervisor.limits",
        level="debug" if cgroups.kind != "none" else "warning",
        **cgroups.as_json(),
    )
    return cgroups
