"""The state store: generations strictly increase, are committed before they are handed out, and
survive a reopen, a SIGKILL right after the call, and two processes allocating at once."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mcphost.supervisor.state import StateStore, generation_after


def test_the_next_generation_is_one_more_or_at_least_what_is_asked() -> None:
    assert generation_after(None) == 1  # the first spawn
    assert generation_after(0) == 1  # a center that has seen generation 0
    assert generation_after(4) == 5
    assert generation_after(None, at_least=7) == 7
    assert generation_after(9, at_least=3) == 10  # never backwards
    assert generation_after(9, at_least=10) == 10


def test_generations_start_at_one_and_increase_per_agent(tmp_path: object) -> None:
    store = StateStore(os.path.join(str(tmp_path), "state.sqlite3"))
    assert store.generation("a") is None
    assert [store.next_generation("a") for _ in range(3)] == [1, 2, 3]
    assert store.next_generation("b") == 1
    assert store.generation("a") == 3
    assert store.generation("b") == 1
    store.close()


def test_a_generation_is_at_least_what_the_center_reserved(tmp_path: object) -> None:
    store = StateStore(os.path.join(str(tmp_path), "state.sqlite3"))
    assert store.next_generation("a", at_least=7) == 7  # a fresh state directory: the center's
    assert store.next_generation("a", at_least=3) == 8  # never backwards: the local one wins
    assert store.next_generation("a") == 9
    assert store.next_generation("a", at_least=20) == 20
    assert store.next_generation("b", at_least=0) == 1
    assert store.generation("a") == 20
    store.close()


def test_generations_persist_across_reopen_and_file_is_private(tmp_path: object) -> None:
    state_dir = os.path.join(str(tmp_path), "state")
    path = os.path.join(state_dir, "state.sqlite3")
    store = StateStore(path)
    store.next_generation("a")
    store.next_generation("a")
    store.close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(state_dir).st_mode) == 0o700
    again = StateStore(path)
    assert again.generation("a") == 2
    assert again.next_generation("a") == 3
    again.close()


def test_a_generation_is_committed_before_it_is_returned(tmp_path: object) -> None:
    """The process is SIGKILLed right after the call returns: a new store still sees it."""
    path = os.path.join(str(tmp_path), "state.sqlite3")
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from mcphost.supervisor.state import StateStore, generation_after
        store = StateStore({path!r})
        for _ in range(4):
            generation = store.next_generation("a")
        sys.stdout.write(str(generation)); sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert done.returncode == -9
    assert done.stdout == b"4"
    store = StateStore(path)
    assert store.generation("a") == 4
    assert store.next_generation("a") == 5
    store.close()


def test_two_processes_never_get_the_same_generation(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "state.sqlite3")
    StateStore(path).close()
    script = textwrap.dedent(
        f"""
        from mcphost.supervisor.state import StateStore, generation_after
        store = StateStore({path!r})
        print(" ".join(str(store.next_generation("a")) for _ in range(40)))
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE) for _ in range(2)
    ]
    seen: list[int] = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        values = [int(v) for v in out.split()]
        assert values == sorted(values) and len(set(values)) == 40  # increasing in each process
        seen += values
    assert sorted(seen) == list(range(1, 81))


def test_last_exit_is_kept_across_reopen(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "state.sqlite3")
    store = StateStore(path)
    assert store.last_exit("a") is None
    store.record_exit("a", 1, "exit 1", "exited with status 1", at=100.0)
    store.record_exit("a", 2, "signal 9", "killed by SIGKILL", at=200.0)
    store.close()
    record = StateStore(path).last_exit("a")
    assert record is not None
    assert (record.generation, record.at, record.exit, record.reason) == (
        2,
        200.0,
        "signal 9",
        "killed by SIGKILL",
    )


def test_recorded_processes_persist_until_forgotten(tmp_path: object) -> None:
    from mcphost.supervisor.state import ProcessRecord

    path = os.path.join(str(tmp_path), "state.sqlite3")
    store = StateStore(path)
    agent = ProcessRecord(100, 5000, 100, 100, "a", "agent")
    escapee = ProcessRecord(230, 7000, 230, 229, None, "adopted")
    store.record_process(agent)
    store.record_process(escapee)
    store.record_process(agent)  # twice: one row
    store.close()  # committed on return: a reopen (as after a crash) sees both
    again = StateStore(path)
    assert again.processes() == [agent, escapee]
    again.forget_processes([(100, 5000), (230, 1)])  # the second names another process
    assert again.processes() == [escapee]
    again.close()


def test_no_generation_follows_the_top_of_the_range() -> None:
    from mcphost.supervisor.state import MAX_GENERATION, GenerationExhausted, generation_after

    assert generation_after(MAX_GENERATION - 1) == MAX_GENERATION
    with pytest.raises(GenerationExhausted) as caught:
        generation_after(MAX_GENERATION)
    assert caught.value.code == "generation_exhausted"
    with pytest.raises(GenerationExhausted):
        generation_after(None, at_least=MAX_GENERATION + 1)


def _fsyncs_per_phase(tmp_path: object, phases: str) -> list[int]:
    """Run `phases` (Python; `store` is an open StateStore, `mark()` ends a phase: a syscall
    nothing else here makes) in a child under strace: how many fsync/fdatasync calls each phase
    made."""
    import shutil

    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed")
    path = os.path.join(str(tmp_path), "state.sqlite3")
    trace = os.path.join(str(tmp_path), "trace")
    script = "import os\nfrom mcphost.supervisor.state import *\n"
    script += f"store = StateStore({path!r})\n"
    script += "def mark():\n    os.getpriority(os.PRIO_PROCESS, 0)\nmark()\n"
    script += textwrap.dedent(phases) + "\nmark()\n"
    argv = [strace, "-qq", "-e", "trace=fsync,fdatasync,getpriority", "-o", trace, sys.executable]
    done = subprocess.run([*argv, "-c", script], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    counts: list[int] = []
    for line in Path(trace).read_text().splitlines():
        if line.startswith("getpriority("):
            counts.append(0)
        elif counts and ("fsync(" in line or "fdatasync(" in line):
            counts[-1] += 1
    return counts[:-1]  # the phases after the opening one (the last mark ends the last)


def test_process_records_cost_no_fsync_and_generations_one_each(tmp_path: object) -> None:
    """A spawn's process record and an exit are in the log with no fsync of their own (they
    need only outlive the supervisor); each generation is fsynced before it is returned."""
    counts = _fsyncs_per_phase(
        tmp_path,
        """
        for pid in range(100, 110):
            store.record_process(ProcessRecord(pid, 7, pid, pid, "a", "agent"))
            store.record_exit("a", 1, "exit 0", "exited")
        mark()
        for _ in range(3):
            store.next_generation("a")
        mark()
        store.keep_uids({"a": 70000})
        """,
    )
    assert counts == [0, 3, 1]


def test_a_start_up_s_generations_are_one_durable_commit(tmp_path: object) -> None:
    """`next_generations`: each agent's next generation (at least its floor), in one
    transaction and one fsync; one that cannot be given leaves every one as it was."""
    counts = _fsyncs_per_phase(
        tmp_path,
        """
        store.next_generation("b")
        mark()
        given = store.next_generations({"a": 1, "b": 1, "c": 7})
        assert given == {"a": 1, "b": 2, "c": 7}, given
        assert [store.generation(x) for x in "abc"] == [1, 2, 7]
        mark()
        try:
            store.next_generations({"a": 1, "d": MAX_GENERATION + 1})
        except GenerationExhausted:
            pass
        assert store.generation("a") == 1 and store.generation("d") is None
        """,
    )
    assert counts == [1, 1, 0]  # one for one agent, one for three, none for a refusal
