"""Black-box: per-agent usage in `ctl status`, the live view (`ctl top` / `status --watch`) and
`ctl logs --supervisor`, through a real `mcphost supervise` process.

The usage figures of an agent that used a known amount of CPU, holds a known amount of memory
and runs a known number of processes are checked against the kernel's own word, read here (not
with the supervisor's parsers): with a cgroup backend (v1 on this project's machines), against
the files of the agent's own group (memory now and its peak, the CPU account, the task count);
without one (a supervisor started where no cgroup hierarchy is mounted), against its process
tree as `ps` reports it.
"""

from __future__ import annotations

import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
from collections.abc import Iterator
from fcntl import ioctl
from pathlib import Path
from typing import Any

import pytest

from mcphost.supervisor.confine import cgroups
from mcphost.testing.devcenter import DevCenter
from tests.supervisor.supervise_harness import Supervised, group_dirs, inline
from tests.waiting import SLOWDOWN, until

BACKEND = cgroups.detect()

MIB = 1 << 20
HOLD = 64  # MiB the hog holds
KIDS = 3  # processes it runs beside itself
# Uses 1 s of CPU in a child it waits for, then holds HOLD MiB (every page touched) and KIDS
# sleeping children, says `ready`, frees the memory when `free` appears, and waits.
HOG = (
    "import os, subprocess, sys, time\n"
    "busy = 'import time\\nwhile time.process_time() < 1.0: pass'\n"
    "subprocess.run([sys.executable, '-c', busy], check=True)\n"
    f"held = bytearray(b'x') * ({HOLD} << 20)\n"
    "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])"
    f" for _ in range({KIDS})]\n"
    "open('ready', 'w').close()\n"
    "while not os.path.exists('free'):\n"
    "    time.sleep(0.05)\n"
    "del held\n"
    "open('freed', 'w').close()\n"
    "time.sleep(600)\n"
)


def _tree_by_ps(root: int) -> dict[int, int]:
    """`{pid: rss bytes}` of `root` and its descendants, as `ps` reports them."""
    out = subprocess.run(
        ["ps", "-e", "-o", "pid=,ppid=,rss="], capture_output=True, text=True, check=True
    ).stdout
    rows = [tuple(int(f) for f in line.split()) for line in out.splitlines() if line.strip()]
    children: dict[int, list[int]] = {}
    rss = {}
    for pid, ppid, kib in rows:
        children.setdefault(ppid, []).append(pid)
        rss[pid] = kib * 1024
    found, stack = {}, [root]
    while stack:
        pid = stack.pop()
        if pid in rss and pid not in found:
            found[pid] = rss[pid]
            stack.extend(children.get(pid, ()))
    return found


def _start(supervised: Supervised) -> dict[str, Any]:
    supervised.write_fleet(
        [
            {"id": "hog", "command": inline(HOG)},
            {"id": "caller", "command": supervised.standin()},
        ]
    )
    supervised.start()
    until(lambda: (supervised.workspace("hog") / "ready").exists(), 60, "the hog to be ready")
    return supervised.wait_running("hog")


class WithoutCgroups(Supervised):
    """A supervisor in a mount namespace of its own with no cgroup hierarchy mounted (as on a
    machine without one): backend `none`, every agent's usage from /proc."""

    def argv(self) -> list[str]:
        unmount = 'umount -R /sys/fs/cgroup && exec "$@"'
        return ["unshare", "--mount", "--propagation", "private", "--",
                "/bin/sh", "-c", unmount, "sh", *super().argv()]  # fmt: skip


def _group_files(supervised: Supervised, agent_id: str) -> dict[str, Path]:
    """The agent's group's own files for each figure, as the kernel names them."""
    dirs = {c: Path(d) for c, d in group_dirs(supervised, agent_id).items()}
    if BACKEND.kind == "v2":
        group = dirs[""]
        return {
            "memory": group / "memory.current",
            "peak": group / "memory.peak",
            "cpu": group / "cpu.stat",
            "tasks": group / "pids.current",
        }
    return {
        "memory": dirs["memory"] / "memory.usage_in_bytes",
        "peak": dirs["memory"] / "memory.max_usage_in_bytes",
        "cpu": dirs["cpuacct"] / "cpuacct.usage",
        "tasks": dirs["pids"] / "pids.current",
    }


def _read_group(files: dict[str, Path]) -> dict[str, float | None]:
    """The group's figures now: bytes, bytes, CPU seconds, tasks. v2 has `memory.peak` from
    Linux 5.19 (Debian 11's 5.10 has none: tests/kernels/): without it, the peak is None."""
    cpu = files["cpu"].read_text()
    seconds = (
        int(cpu.split("usage_usec ")[1].split()[0]) / 1e6
        if files["cpu"].name == "cpu.stat"
        else int(cpu) / 1e9
    )
    return {
        "memory_current_bytes": int(files["memory"].read_text()),
        "memory_peak_bytes": int(files["peak"].read_text()) if files["peak"].exists() else None,
        "cpu_seconds": seconds,
        "processes": int(files["tasks"].read_text()),
    }


def _agrees(usage: dict[str, Any], group: dict[str, Any]) -> bool:
    """The row's figures are the group's (read a moment apart: memory within 5%, CPU within
    0.1 s, tasks exactly; the peak the kernel's, which only grows within a run, or, where the
    kernel keeps none, the largest figure the supervisor saw)."""
    kernel_peak = group["memory_peak_bytes"]
    if kernel_peak is None:
        kernel_peak = usage["memory_peak_bytes"]
    return (
        usage["processes"] == group["processes"]
        and abs(usage["memory_current_bytes"] - group["memory_current_bytes"])
        <= 0.05 * group["memory_current_bytes"]
        and abs(usage["cpu_seconds"] - group["cpu_seconds"]) <= 0.1
        and usage["memory_current_bytes"] <= usage["memory_peak_bytes"] <= kernel_peak
    )


@pytest.mark.skipif(BACKEND.kind == "none", reason=f"no cgroup backend here: {BACKEND.reason}")
def test_usage_figures_are_the_agents_groups_own(supervised: Supervised, center: DevCenter) -> None:
    row = _start(supervised)
    files = _group_files(supervised, "hog")
    seen: dict[str, Any] = {}

    def agreeing() -> bool:
        seen["usage"] = supervised.status()["hog"]["usage"]
        seen["group"] = _read_group(files)
        return _agrees(seen["usage"], seen["group"])

    until(agreeing, 60, f"the hog's figures to be its group's: {seen}")
    usage = seen["usage"]
    assert usage["source"] == "cgroup", usage
    assert usage["processes"] >= 1 + KIDS  # tasks: the hog, its children (one thread each)
    assert usage["memory_current_bytes"] >= HOLD * MIB, usage
    # the busy child, and the starts (CPU time too stretches under a kernel test's emulation)
    assert 1.0 <= usage["cpu_seconds"] < 1.0 + 10 * SLOWDOWN, usage
    assert usage["relay_queue_depth"] is None  # no bundle
    assert (usage["center_calls"], usage["center_errors"]) == (0, 0)
    # memory freed: the current figure falls, the peak stays the kernel's
    after = _freed(supervised, usage)
    assert after["memory_peak_bytes"] >= usage["memory_current_bytes"]
    if files["peak"].exists():
        assert after["memory_peak_bytes"] == int(files["peak"].read_text())
    # the runner's own restart (the agent killed) keeps the group; the new run counts anew
    # (v1: the peak and the CPU account start over at its spawn; v2 counts from the group's
    # making): its CPU is its own busy second and starts, not both runs'
    for name in ("ready", "free", "freed"):
        (supervised.workspace("hog") / name).unlink()
    os.killpg(row["pid"], signal.SIGKILL)  # the hog and its children: its own process group
    supervised.wait_running("hog", generation=row["generation"] + 1)
    until(lambda: (supervised.workspace("hog") / "ready").exists(), 60, "the new hog ready")
    again = until(
        lambda: agreeing() and seen["usage"]["processes"] >= 1 + KIDS and seen["usage"],
        60,
        f"the new run's figures to be its group's: {seen}",
    )
    if BACKEND.kind == "v1":
        assert 1.0 <= again["cpu_seconds"] < usage["cpu_seconds"] + 0.9, (usage, again)
    _check_calls_and_table(supervised, usage)


def test_usage_figures_without_cgroups_match_ps(supervised: Supervised, center: DevCenter) -> None:
    supervised.__class__ = WithoutCgroups
    row = _start(supervised)
    shown = supervised.ctl("status").stdout
    assert "limits: none: " in shown, shown
    seen: dict[str, Any] = {}

    def agreeing() -> bool:
        seen["usage"] = usage = supervised.status()["hog"]["usage"]
        seen["tree"] = tree = _tree_by_ps(row["pid"])
        total = sum(tree.values())
        return usage["processes"] == len(tree) and (
            abs(usage["memory_current_bytes"] - total) <= 0.05 * total
        )

    until(agreeing, 60, f"the hog's figures to be its tree's: {seen}")
    usage = seen["usage"]
    assert usage["source"] == "proc", usage
    assert usage["processes"] >= 1 + KIDS
    assert usage["memory_current_bytes"] >= HOLD * MIB, usage
    # the busy child, and the starts (CPU time too stretches under a kernel test's emulation)
    assert 1.0 <= usage["cpu_seconds"] < 1.0 + 10 * SLOWDOWN, usage
    assert usage["memory_peak_bytes"] >= usage["memory_current_bytes"]
    # memory freed: the current figure falls, the peak stays what the supervisor saw
    after = _freed(supervised, usage)
    assert after["memory_peak_bytes"] >= usage["memory_current_bytes"]
    _check_calls_and_table(supervised, usage)


def _freed(supervised: Supervised, usage: dict[str, Any]) -> dict[str, Any]:
    """Have the hog free half its memory; its next row whose memory fell (a status reads a
    sample at most USAGE_SAMPLE_SECONDS old: this waits for a fresh one)."""
    (supervised.workspace("hog") / "free").write_text("")
    until(lambda: (supervised.workspace("hog") / "freed").exists(), 60, "the hog to free")
    fell = usage["memory_current_bytes"] - HOLD * MIB / 2
    after: dict[str, Any] = until(
        lambda: (u := supervised.status()["hog"]["usage"])["memory_current_bytes"] < fell and u,
        60,
        "the hog's memory to fall",
    )
    return after


def _check_calls_and_table(supervised: Supervised, usage: dict[str, Any]) -> None:
    """The stand-in's center calls counted; the table's usage columns, one row per agent."""
    until(lambda: supervised.calls("caller"), 60, "the stand-in's first call")
    caller = until(
        lambda: supervised.status()["caller"]["usage"]["center_calls"] or None, 60, "calls"
    )
    assert caller >= 1
    table = supervised.ctl("status").stdout.splitlines()
    header = next(line for line in table if line.startswith("AGENT ")).split()
    assert header[7:11] == ["MEM", "PEAK", "CPU", "PROCS"], table
    (hog_line,) = [line for line in table if line.startswith("hog ")]
    hog = dict(zip(header, hog_line.split(), strict=False))
    assert hog["PROCS"].isdigit() and int(hog["PROCS"]) >= 1 + KIDS, hog
    assert re.fullmatch(r"\d+(\.\d)?M", hog["MEM"]) and hog["PEAK"].endswith("M"), hog


def _read_until(fd: int, done: Any) -> str:
    seen = b""

    def more() -> bool:
        nonlocal seen
        try:
            seen += os.read(fd, 65536)
        except OSError:
            return True  # the other side closed
        return bool(done(seen.decode(errors="replace")))

    until(more, 60, "the live view's output")
    return seen.decode(errors="replace")


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory, center: DevCenter) -> Iterator[Supervised]:
    """One supervisor with the hog and the stand-in, started once for the tests that read it
    (the one that restarts the hog waits until the new one is ready again)."""
    supervised = Supervised(tmp_path_factory.mktemp("usage"), center)
    try:
        _start(supervised)
        yield supervised
    finally:
        supervised.close()


def test_top_refreshes_in_place_in_80_columns_and_ends_on_ctrl_c(running: Supervised) -> None:
    supervised = running
    leader, follower = pty.openpty()
    ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcphost", "ctl", "--state", str(supervised.state), "top",
         "--sort", "mem", "--interval", "0.2"],
        stdin=follower, stdout=follower, stderr=subprocess.PIPE, env=supervised.env(),
    )  # fmt: skip
    os.close(follower)
    try:
        text = _read_until(leader, lambda seen: seen.count("\x1b[H") >= 3)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    frame = text.split("\x1b[H")[2]
    lines = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", line) for line in frame.split("\r\n")]
    lines = [line for line in lines if line]
    assert lines[0].startswith("mcphost top: 2 agents") and "sorted by mem" in lines[0], lines
    assert all(len(line) <= 80 for line in lines), lines
    at = next(n for n, line in enumerate(lines) if line.startswith("AGENT "))
    header = lines[at].split()
    assert {"AGENT", "STATE", "MEM", "CPU", "PROCS"} <= set(header), lines
    assert lines[at + 1].split()[0] == "hog", lines  # the most memory first
    # what repeats on both rows (the fence, the default limits) is said once below them
    assert all(line.startswith(("same on every row: ", "  ")) for line in lines[at + 3 :]), lines


def test_status_watch_to_a_pipe_repeats_plain_tables(running: Supervised) -> None:
    supervised = running
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcphost", "ctl", "--state", str(supervised.state), "status",
         "--watch", "--interval", "0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=supervised.env(),
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        fd = proc.stdout.fileno()
        text = _read_until(fd, lambda seen: seen.count("mcphost top:") >= 2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "\x1b" not in text and text.count("AGENT ") >= 2, repr(text)


def test_logs_supervisor_shows_its_own_events(running: Supervised, center: DevCenter) -> None:
    supervised = running
    row = supervised.wait_running("hog")
    follow = subprocess.Popen(
        [sys.executable, "-m", "mcphost", "ctl", "--state", str(supervised.state), "logs",
         "--supervisor", "--follow", "--lines", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=supervised.env(),
    )  # fmt: skip
    assert follow.stdout is not None
    try:
        # the follow prints the last line, then what comes: once that line is here, it follows
        fd = follow.stdout.fileno()
        _read_until(fd, lambda seen: seen.endswith("\n"))
        (supervised.workspace("hog") / "ready").unlink()
        supervised.ctl("restart", "hog")
        text = _read_until(fd, lambda seen: '"generation": 2' in seen)
    finally:
        follow.kill()
        follow.wait()
    exited, spawned = (
        f'"event": "supervisor.agent_{what}", "agent_id": "hog"' for what in ("exited", "spawned")
    )
    assert exited in text and spawned in text, text
    logged = supervised.ctl("logs", "--supervisor", "-n", "10000").stdout
    spawned = f'"event": "supervisor.agent_spawned", "agent_id": "hog", "pid": {row["pid"]}'
    assert spawned in logged, logged[-2000:]
    assert '"event": "supervisor.agent_exited", "agent_id": "hog"' in logged
    path = Path(supervised.state) / "logs" / "supervisor.log"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert center.token not in path.read_text()
    both = supervised.ctl("logs", "hog", "--supervisor", check=False)
    assert both.returncode == 2 and "AGENT or --supervisor" in both.stderr
    # the hog holds its memory again, as the module's other tests expect it
    until(lambda: (supervised.workspace("hog") / "ready").exists(), 60, "the new hog ready")
