"""records.py over a real state file and real processes. In a fresh process of its own (a child
subreaper, a real Reaper, real children): the look for escapees reads no stat of a child the
Reaper already watches (an agent, a command), is woken by a reap (an escaper that exited leaves
its orphan with us then, so no period is waited for), and an adopted escapee is watched as our
child from then on: its death forgets its record at once. And a fleet's spawns prune the records
a linear number of times (each prune reads every record's /proc entry), what is gone still
forgotten. Black-box, through a real supervisor: test_supervise_state.py."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcphost import procfs, procs
from mcphost.supervisor import records
from mcphost.supervisor.confine import kernel
from mcphost.supervisor.state import StateStore
from tests.supervisor.confine.test_kernel import isolated, until_async

# Starts a sleeper in a session of its own, prints its pid, and exits: the sleeper is an escapee
# reparented to the subreaper.
ESCAPER = (
    "import subprocess\n"
    "child = subprocess.Popen(['sleep', '1000'], start_new_session=True)\n"
    "print(child.pid, flush=True)\n"
)


async def _scenario(directory: str) -> dict[str, Any]:
    kernel.set_child_subreaper()
    store = StateStore(os.path.join(directory, "state.sqlite3"))
    kept = records.ProcessRecords(store)
    reaper = kernel.Reaper()
    reaper.install()
    read: list[int] = []
    real_read_stat = procfs.read_stat

    def counted(pid: int, proc: str = procfs.PROC) -> procfs.ProcStat | None:
        read.append(pid)
        return real_read_stat(pid, proc)

    procfs.read_stat = counted  # type: ignore[assignment]  # counts, reads the real file
    agents = [
        procs.spawn(["sleep", "1000"], cwd=None, env=os.environ, stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, new_session=True,
                    watch=reaper.watch)
        for _ in range(5)
    ]  # fmt: skip
    # no period to wait for: only a reap wakes the look
    watcher = asyncio.get_running_loop().create_task(kept.watch_adopted(reaper, 3600.0))
    try:
        escaper = procs.spawn([sys.executable, "-c", ESCAPER], cwd=None, env=os.environ,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, new_session=True, watch=reaper.watch)  # fmt: skip
        assert escaper.proc.stdout is not None
        escapee = int(escaper.proc.stdout.readline())
        await escaper.exit
        recorded = await until_async(
            lambda: [r for r in store.processes() if r.pid == escapee], "the escapee recorded"
        )
        stats_read = sorted(set(read))
        watched = reaper.watching(escapee)
        os.kill(escapee, signal.SIGKILL)
        await until_async(
            lambda: not [r for r in store.processes() if r.pid == escapee],
            "the escapee's record forgotten",
        )
        return {
            "kind": recorded[0].kind,
            "stats_read": stats_read,
            "escapee": escapee,
            "agents": [a.pid for a in agents],
            "watched": watched,
        }
    finally:
        watcher.cancel()
        for agent in agents:
            agent.proc.kill()
        await asyncio.gather(*(a.exit for a in agents))
        procfs.read_stat = real_read_stat  # type: ignore[assignment]
        reaper.uninstall()
        store.close()


def test_an_escapee_is_adopted_on_a_reap_reading_no_stat_of_a_watched_child() -> None:
    with tempfile.TemporaryDirectory() as directory:
        seen = isolated(_scenario, directory)
    assert seen["kind"] == "adopted"
    assert seen["watched"]  # the Reaper waits for it: no /proc read tells its death
    # the escapee's stat only: none of the five agents the Reaper watched from their spawn
    assert seen["stats_read"] == [seen["escapee"]], seen
    assert not set(seen["agents"]) & set(seen["stats_read"])


N = 3 * records.PRUNE_FLOOR


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(N):
            started.append(subprocess.Popen(["sleep", "600"], start_new_session=True))
        yield started
    finally:
        for proc in started:
            proc.kill()
            proc.wait()


def test_a_fleet_s_spawns_prune_a_linear_number_of_times(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """N starts look at fewer than 4N records (a prune at every start looked at N²/2), and the
    records of processes that ended are forgotten by a later start's prune."""
    store = StateStore(str(tmp_path / "state.sqlite3"))
    kept = records.ProcessRecords(store)
    looked = 0
    still_running = kernel.still_running

    def counted(record: kernel.Recorded) -> bool:
        nonlocal looked
        looked += 1
        return still_running(record)

    monkeypatch.setattr(records.kernel, "still_running", counted)
    half = N // 2
    for proc in sleepers[:half]:
        kept.started(proc.pid, kernel.proc_starttime(proc.pid) or 0, "a", "agent")
    for proc in sleepers[: half // 2]:  # a quarter of them end
        proc.kill()
        proc.wait()
    for proc in sleepers[half:]:
        kept.started(proc.pid, kernel.proc_starttime(proc.pid) or 0, "b", "agent")
    assert looked < 4 * N, looked
    left = {r.pid for r in store.processes()}
    assert not left & {p.pid for p in sleepers[: half // 2]}  # the ended ones: forgotten
    assert {p.pid for p in sleepers[half // 2 :]} <= left  # every live one: recorded
    store.close()
