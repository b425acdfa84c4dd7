"""Per-agent resource usage: memory (current and peak), CPU seconds and processes.

Two sources, the better first:
- the agent's own cgroup, when it has one (`CgroupFiles`: the four files cgroups.py names for
  its backend), the kernel's own count of everything the agent ran there since the group was
  made (at its spawn; kept across restarts, removed when the agent stops). cgroup v2:
  `memory.current`, `memory.peak`, `cpu.stat`'s `usage_usec`, `pids.current`; cgroup v1:
  `memory.usage_in_bytes`, `memory.max_usage_in_bytes`, `cpuacct.usage` (nanoseconds),
  `pids.current`. `pids.current` counts tasks: processes and their threads. Reading them costs
  four small reads per agent, whatever the agent runs;
- else the agent's process trees in /proc: each identity root `(pid, starttime)` of the agent
  (identity.py: its spawn and its `ctl exec` commands) and every live descendant. Memory is the
  sum of each process's resident set (`stat` field 24; a process's proportional share, PSS from
  `smaps_rollup`, with `pss=True`: dearer, read once per process), CPU the sum of `utime + stime
  + cutime + cstime` (a process's own time and that of the children it has waited for: nothing
  counted twice), processes the count. A process that left the tree (reparented to the
  supervisor, the child subreaper) is no longer counted; its time is lost with it. This needs a
  scan of all of /proc (mcphost/procfs.py `scan`, read into one `ProcTable` shared by every
  agent of a sample).

The peak from /proc (and from a cgroup without a peak file) is the largest current figure the
supervisor has seen for the agent's current generation (`Peaks`: every sample).

Owns: the pure parsers of the cgroup files and of `smaps_rollup` (`parse_smaps_rollup`,
`parse_cpu_stat`, `parse_counter`, `parse_cpu`), the process table of one scan with its
children (`ProcTable`: the stat parse and the scan are procfs.py's), the tree walk
(`tree_usage`), the cgroup read (`cgroup_usage`), the peaks, and `agent_usage`, the one call the
operations make per agent.
Must never: write anything, follow a reused pid into another process's tree (a child that
started before its parent is not its child), raise on a process that vanished mid-read
(gone is simply not counted), scan /proc for an agent that has nothing to find there, or import
anything of the supervisor's above identity.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from mcphost import procfs
from mcphost.procfs import ProcStat

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
FIELDS = ("memory_current_bytes", "memory_peak_bytes", "cpu_seconds", "processes")


@dataclass(frozen=True, slots=True)
class Usage:
    """One agent's figures; None when unknown (no process, or a file that could not be read).
    `source`: "cgroup", "proc", or "none" (nothing running). `sampled_peak`: the peak is the
    largest figure seen at samples (`Peaks`), not the kernel's: worth sampling between
    statuses (not shown)."""

    memory_current_bytes: int | None = None
    memory_peak_bytes: int | None = None
    cpu_seconds: float | None = None
    processes: int | None = None
    source: str = "none"
    sampled_peak: bool = False

    def as_json(self) -> dict[str, object]:
        """`FIELDS` and `source`, as a `ctl status` row's `usage` has them."""
        return {
            "memory_current_bytes": self.memory_current_bytes,
            "memory_peak_bytes": self.memory_peak_bytes,
            "cpu_seconds": self.cpu_seconds,
            "processes": self.processes,
            "source": self.source,
        }


# -- pure parsers --------------------------------------------------------------------------------


def parse_smaps_rollup(text: str) -> int | None:
    """The `Pss:` of `/proc/<pid>/smaps_rollup`, in bytes; None when it has none."""
    for line in text.splitlines():
        if line.startswith("Pss:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * 1024
    return None


def parse_cpu_stat(text: str) -> float | None:
    """cgroup v2 `cpu.stat`'s `usage_usec`, in seconds; None when it has none."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec" and value.strip().isdigit():
            return int(value) / 1_000_000
    return None


def parse_counter(text: str) -> int | None:
    """A one-number cgroup file (`memory.current`, `memory.peak`, `pids.current`, v1's
    `memory.usage_in_bytes`); None for anything else (`max`, empty)."""
    text = text.strip()
    return int(text) if text.isdigit() else None


def parse_cpuacct_usage(text: str) -> float | None:
    """cgroup v1 `cpuacct.usage` (nanoseconds), in seconds; None when it is not a number."""
    count = parse_counter(text)
    return count / 1_000_000_000 if count is not None else None


# The CPU file's name -> its parser (the backend's file: cgroups.py names it).
CPU_PARSERS: dict[str, Callable[[str], float | None]] = {
    "cpu.stat": parse_cpu_stat,
    "cpuacct.usage": parse_cpuacct_usage,
}


def parse_cpu(name: str, text: str) -> float | None:
    """The CPU seconds of a group's CPU file, by its base name (`cpu.stat` or `cpuacct.usage`)."""
    parser = CPU_PARSERS.get(name)
    return parser(text) if parser is not None else None


# -- /proc ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class ProcTable:
    """Every process's stat and its children, from one scan of /proc (`procfs.scan`)."""

    entries: dict[int, ProcStat] = field(default_factory=dict)
    children: dict[int, list[int]] = field(default_factory=dict)

    @classmethod
    def scan(cls, proc: str = procfs.PROC) -> ProcTable:
        table = cls()
        for entry in procfs.scan(proc).values():
            table.add(entry)
        return table

    def add(self, entry: ProcStat) -> None:
        self.entries[entry.pid] = entry
        self.children.setdefault(entry.ppid, []).append(entry.pid)

    def tree(self, roots: Iterable[tuple[int, int]]) -> list[ProcStat]:
        """The live processes of the trees under `roots` (`(pid, starttime)`: a root whose pid
        now names another process is not one), each once."""
        found: dict[int, ProcStat] = {}
        stack = []
        for pid, starttime in roots:
            entry = self.entries.get(pid)
            if entry is not None and entry.starttime == starttime:
                stack.append(entry)
        while stack:
            entry = stack.pop()
            if entry.pid in found:
                continue
            found[entry.pid] = entry
            for child in self.children.get(entry.pid, ()):
                kid = self.entries[child]
                if kid.starttime >= entry.starttime:  # else a reused pid's parent link
                    stack.append(kid)
        return list(found.values())


def tree_usage(entries: list[ProcStat], *, pss: bool = False, proc: str = procfs.PROC) -> Usage:
    """Usage of the processes `entries` (`ProcTable.tree`); memory from PSS where `pss` and
    readable, else RSS. The peak is left to `Peaks`."""
    if not entries:
        return Usage(source="none")
    memory = 0
    for entry in entries:
        share = None
        if pss:
            text = procfs.read_text(f"{proc}/{entry.pid}/smaps_rollup")
            share = parse_smaps_rollup(text) if text is not None else None
        memory += share if share is not None else entry.rss_pages * PAGE_SIZE
    return Usage(
        memory_current_bytes=memory,
        cpu_seconds=round(sum(e.cpu_ticks for e in entries) / CLOCK_TICKS, 2),
        processes=len(entries),
        source="proc",
    )


# -- cgroups --------------------------------------------------------------------------------------


class CgroupFiles(NamedTuple):
    """Where one agent's group keeps its four figures (cgroups.py `AgentGroup.usage_files`:
    v2, one directory; v1, the memory, cpuacct and pids hierarchies' groups)."""

    memory_current: str
    memory_peak: str
    cpu: str  # `cpu.stat` (v2) or `cpuacct.usage` (v1): parsed by its name (`parse_cpu`)
    processes: str


def cgroup_usage(files: CgroupFiles) -> Usage | None:
    """Usage from the agent's group `files`; None when none of them can be read (gone)."""
    texts = [procfs.read_text(path, 1024) for path in files]
    if all(text is None for text in texts):
        return None
    current, peak, cpu_text, processes = texts
    cpu = parse_cpu(os.path.basename(files.cpu), cpu_text) if cpu_text is not None else None
    return Usage(
        memory_current_bytes=parse_counter(current) if current is not None else None,
        memory_peak_bytes=parse_counter(peak) if peak is not None else None,
        cpu_seconds=round(cpu, 2) if cpu is not None else None,
        processes=parse_counter(processes) if processes is not None else None,
        source="cgroup",
    )


# -- peaks and the one call ----------------------------------------------------------------------


class Peaks:
    """The largest memory seen per agent, for its current generation (a new one starts over)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int | None, int]] = {}  # agent -> (generation, bytes)

    def update(self, agent_id: str, generation: int | None, current: int | None) -> int | None:
        held = self._seen.get(agent_id)
        peak = held[1] if held is not None and held[0] == generation else None
        if current is not None:
            peak = current if peak is None else max(peak, current)
        if peak is not None:
            self._seen[agent_id] = (generation, peak)
        return peak

    def keep_only(self, agent_ids: Iterable[str]) -> None:
        keep = set(agent_ids)
        for agent_id in [a for a in self._seen if a not in keep]:
            del self._seen[agent_id]


def agent_usage(
    agent_id: str,
    generation: int | None,
    roots: Iterable[tuple[int, int]],
    *,
    table: Callable[[], ProcTable] | ProcTable | None,
    peaks: Peaks,
    cgroup: CgroupFiles | None = None,
    pss: bool = False,
) -> Usage:
    """One agent's usage: its group's files when it has a group, else its trees in /proc
    (`table`: one `ProcTable.scan` for every agent of a sample: pass the same table, or a
    function that scans once when first asked; None scans now). No scan for an agent without
    roots (nothing running). The peak through `peaks` where the source has none."""
    usage = cgroup_usage(cgroup) if cgroup is not None else None
    if usage is None:
        roots = list(roots)
        if not roots:
            usage = Usage(source="none")
        else:
            if table is None:
                table = ProcTable.scan()
            elif callable(table):
                table = table()
            usage = tree_usage(table.tree(roots), pss=pss)
    if usage.memory_peak_bytes is None:
        peak = peaks.update(agent_id, generation, usage.memory_current_bytes)
        if usage.source != "none":
            usage = Usage(
                usage.memory_current_bytes,
                peak,
                usage.cpu_seconds,
                usage.processes,
                usage.source,
                sampled_peak=True,
            )
    return usage


def usage_json(usage: Usage | None, extra: Mapping[str, object]) -> dict[str, object]:
    """The `usage` object of a `ctl status` row: `FIELDS`, `source`, then `extra`."""
    out: dict[str, object] = dict.fromkeys(FIELDS) if usage is None else usage.as_json()
    out.update(extra)
    return out
