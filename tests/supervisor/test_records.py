"""The process records, in process over a real state file and real processes: a fleet's spawns
prune the records a linear number of times (each prune reads every record's /proc entry), and
what is gone is still forgotten."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcphost.supervisor import records as records_module
from mcphost.supervisor.confine import kernel
from mcphost.supervisor.records import PRUNE_FLOOR, ProcessRecords
from mcphost.supervisor.state import StateStore

N = 3 * PRUNE_FLOOR


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
    records = ProcessRecords(store)
    looked = 0
    still_running = kernel.still_running

    def counted(record: kernel.Recorded) -> bool:
        nonlocal looked
        looked += 1
        return still_running(record)

    monkeypatch.setattr(records_module.kernel, "still_running", counted)
    half = N // 2
    for proc in sleepers[:half]:
        records.started(proc.pid, kernel.proc_starttime(proc.pid) or 0, "a", "agent")
    for proc in sleepers[: half // 2]:  # a quarter of them end
        proc.kill()
        proc.wait()
    for proc in sleepers[half:]:
        records.started(proc.pid, kernel.proc_starttime(proc.pid) or 0, "b", "agent")
    assert looked < 4 * N, looked
    left = {r.pid for r in store.processes()}
    assert not left & {p.pid for p in sleepers[: half // 2]}  # the ended ones: forgotten
    assert {p.pid for p in sleepers[half // 2 :]} <= left  # every live one: recorded
    store.close()
