"""Per-agent usage (mcphost/supervisor/confine/usage.py): the parsers on this machine's real /proc and
cgroup files, and the tree walk over real processes (the stat parse and the scan under it:
tests/core/test_procfs.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcphost import procfs
from mcphost.procfs import ProcStat
from mcphost.supervisor.confine import usage as U

UNIFIED = Path("/sys/fs/cgroup/unified/cpu.stat")
CPUACCT = Path("/sys/fs/cgroup/cpuacct/cpuacct.usage")  # this machine's v1 CPU account


def _read(path: str) -> str:
    return Path(path).read_bytes().decode("latin-1")


def test_parse_smaps_rollup() -> None:
    pss = U.parse_smaps_rollup(_read(f"/proc/{os.getpid()}/smaps_rollup"))
    assert pss is not None and 0 < pss <= procfs.parse_stat(_read("/proc/self/stat")).rss_pages * (
        U.PAGE_SIZE * 2
    )
    assert U.parse_smaps_rollup("Rss: 10 kB\n") is None


@pytest.mark.skipif(not UNIFIED.exists(), reason="no cgroup2 cpu.stat on this machine")
def test_parse_cpu_stat_of_a_real_cgroup2() -> None:
    seconds = U.parse_cpu_stat(UNIFIED.read_text())
    assert seconds is not None and seconds > 0
    assert U.parse_cpu_stat("user_usec 5\n") is None


def test_parse_counter() -> None:
    assert U.parse_counter("123456\n") == 123456
    assert U.parse_counter("max\n") is None
    assert U.parse_counter("") is None


@pytest.mark.skipif(not CPUACCT.exists(), reason="no cgroup v1 cpuacct hierarchy on this machine")
def test_parse_cpuacct_usage_of_a_real_v1_group() -> None:
    seconds = U.parse_cpu("cpuacct.usage", CPUACCT.read_text())
    assert seconds is not None and seconds > 0
    assert U.parse_cpuacct_usage("2500000000\n") == 2.5
    assert U.parse_cpu("cpu.stat", "usage_usec 1500000\n") == 1.5
    assert U.parse_cpu("memory.current", "12\n") is None  # not a CPU file


def _files(directory: Path, v1: bool = False) -> U.CgroupFiles:
    """The four files of a group in `directory` (the v2 names, or v1's in one directory)."""
    names = (
        ("memory.usage_in_bytes", "memory.max_usage_in_bytes", "cpuacct.usage", "pids.current")
        if v1
        else ("memory.current", "memory.peak", "cpu.stat", "pids.current")
    )
    return U.CgroupFiles(*(str(directory / name) for name in names))


def test_cgroup_usage_reads_the_four_files(tmp_path: Path) -> None:
    # the kernel's formats, written here (usage against a real v1 group of a real agent:
    # test_supervise_usage.py)
    (tmp_path / "memory.current").write_text("4096000\n")
    (tmp_path / "memory.peak").write_text("8192000\n")
    (tmp_path / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    (tmp_path / "pids.current").write_text("7\n")
    assert U.cgroup_usage(_files(tmp_path)) == U.Usage(4096000, 8192000, 2.5, 7, "cgroup")
    (tmp_path / "memory.usage_in_bytes").write_text("4096000\n")
    (tmp_path / "memory.max_usage_in_bytes").write_text("8192000\n")
    (tmp_path / "cpuacct.usage").write_text("2504000000\n")  # nanoseconds
    assert U.cgroup_usage(_files(tmp_path, v1=True)) == U.Usage(4096000, 8192000, 2.5, 7, "cgroup")
    assert U.cgroup_usage(_files(tmp_path / "gone")) is None


def _no_scan() -> U.ProcTable:
    raise AssertionError("/proc scanned")


def test_agent_usage_prefers_the_cgroup_and_keeps_a_peak_where_it_has_none(tmp_path: Path) -> None:
    (tmp_path / "memory.current").write_text("100\n")
    peaks = U.Peaks()
    group = _files(tmp_path)
    first = U.agent_usage("a", 1, [(1, 1)], table=_no_scan, peaks=peaks, cgroup=group)
    assert (first.memory_current_bytes, first.memory_peak_bytes, first.source) == (
        100,
        100,
        "cgroup",
    )
    assert first.sampled_peak  # no memory.peak: the supervisor's own
    (tmp_path / "memory.current").write_text("40\n")
    second = U.agent_usage("a", 1, [(1, 1)], table=_no_scan, peaks=peaks, cgroup=group)
    assert (second.memory_current_bytes, second.memory_peak_bytes) == (40, 100)
    newer = U.agent_usage("a", 2, [(1, 1)], table=_no_scan, peaks=peaks, cgroup=group)
    assert newer.memory_peak_bytes == 40  # a new generation starts over
    (tmp_path / "memory.peak").write_text("500\n")
    kernels = U.agent_usage("a", 2, [(1, 1)], table=_no_scan, peaks=peaks, cgroup=group)
    assert (kernels.memory_peak_bytes, kernels.sampled_peak) == (500, False)


def test_no_scan_of_proc_for_an_agent_with_nothing_running(tmp_path: Path) -> None:
    gone = _files(tmp_path / "removed")  # a stopped agent's group is removed
    for cgroup in (gone, None):
        usage = U.agent_usage("a", 1, (), table=_no_scan, peaks=U.Peaks(), cgroup=cgroup)
        assert usage == U.Usage()
    scans: list[int] = []

    def scan_once() -> U.ProcTable:
        scans.append(1)
        return U.ProcTable()

    # a group gone while the agent still has a root: its trees in /proc, from the shared table
    fell_back = U.agent_usage("a", 1, [(1, 1)], table=scan_once, peaks=U.Peaks(), cgroup=gone)
    assert fell_back.source == "none" and scans == [1]


@pytest.fixture
def tree() -> Iterator[subprocess.Popen[str]]:
    """A parent with two sleeping children; prints the children's pids."""
    script = (
        "import subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
        " for _ in range(2)]\n"
        "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    yield proc
    proc.kill()
    proc.wait()


def test_a_tree_is_the_root_and_its_descendants(tree: subprocess.Popen[str]) -> None:
    assert tree.stdout is not None
    kids = [int(pid) for pid in tree.stdout.readline().split()]
    table = U.ProcTable.scan()
    root = table.entries[tree.pid]
    found = table.tree([(tree.pid, root.starttime)])
    assert sorted(e.pid for e in found) == sorted([tree.pid, *kids])
    usage = U.tree_usage(found)
    assert usage.processes == 3 and usage.source == "proc"
    rss = sum(entry.rss_pages for entry in found)  # as the scan read them (the kids still start)
    assert usage.memory_current_bytes == rss * U.PAGE_SIZE > 0
    assert (U.tree_usage(found, pss=True).memory_current_bytes or 0) > 0
    # a root whose pid names another process now (another starttime) is nobody's tree
    assert table.tree([(tree.pid, root.starttime + 1)]) == []
    assert U.tree_usage([]) == U.Usage()


def test_a_childs_start_before_its_parent_is_a_reused_pid() -> None:
    table = U.ProcTable()
    table.add(ProcStat(10, ppid=1, pgrp=10, session=10, starttime=500, cpu_ticks=1, rss_pages=1))
    # 11 started before 10: a reused pid, not its child
    table.add(ProcStat(11, ppid=10, pgrp=10, session=10, starttime=400, cpu_ticks=1, rss_pages=1))
    table.add(ProcStat(12, ppid=10, pgrp=10, session=10, starttime=600, cpu_ticks=1, rss_pages=1))
    assert sorted(e.pid for e in table.tree([(10, 500)])) == [10, 12]


def test_cpu_seconds_count_the_children_a_process_waited_for() -> None:
    busy = "import time\nwhile time.process_time() < 0.6: pass"
    script = f"import subprocess,sys; subprocess.run([sys.executable,'-c',{busy!r}])"
    done = subprocess.Popen(
        [sys.executable, "-c", script + "\nimport time; print('x', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert done.stdout is not None
        done.stdout.readline()  # the busy child used 0.6 s of CPU and was waited for
        table = U.ProcTable.scan()
        entry = table.entries[done.pid]
        usage = U.tree_usage(table.tree([(done.pid, entry.starttime)]))
        assert usage.processes == 1
        assert usage.cpu_seconds is not None and usage.cpu_seconds >= 0.5
    finally:
        done.kill()
        done.wait()


def test_peaks_follow_the_generation() -> None:
    peaks = U.Peaks()
    assert peaks.update("a", 1, None) is None
    assert peaks.update("a", 1, 50) == 50
    assert peaks.update("a", 1, 20) == 50
    assert peaks.update("a", 2, 20) == 20
    peaks.keep_only(["b"])
    assert peaks.update("a", 2, None) is None


def test_usage_json_has_every_key() -> None:
    out = U.usage_json(None, {"center_calls": 0})
    assert set(out) == {*U.FIELDS, "center_calls"}
    assert U.usage_json(U.Usage(1, 2, 3.0, 4, "proc"), {})["source"] == "proc"
