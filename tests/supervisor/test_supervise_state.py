"""Black-box: the state directory belongs to one supervisor, and a restart cleans up after a
crash, through real `mcphost supervise` processes.

- A second `mcphost supervise` on a live state directory is refused before it changes anything:
  exit 3 (`control_in_use`), one stderr line naming the state directory and the running
  supervisor's pid; the modes of `<state>`, `run/` and `agents/` stay what the running one set
  (0711 for a `user = "nobody"` agent, unfenced), and that agent still attaches and calls.
  Its interpreter, pump and stand-in are ones nobody can run wherever the checkout is
  (`run_as`: a copy of the packages when the checkout is in a private directory).
- After `kill -9` of the supervisor, an agent that ignores SIGTERM (so its parent-death signal)
  and an escapee that left its agent's session with a double fork and `setsid` keep running;
  the supervisor started again on the same state directory ends them (from what the dead one
  recorded in the state file) before it spawns, and exactly one copy of each agent runs.
- An adopted escapee is watched from then on as the supervisor's child (no /proc read): when it
  dies, the supervisor says so (`supervisor.adopted_exited`) and its record leaves the state
  file, without waiting for anything else to happen.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import stat
import sys
import uuid
from pathlib import Path

import pytest

from mcphost.testing.devcenter import DevCenter
from tests.supervisor.supervise_harness import UNFENCED, Supervised, descendants_alive, standin
from tests.supervisor.test_supervise_user import ROOT, nobody, run_as
from tests.waiting import until


def modes(state: Path) -> dict[str, int]:
    return {name: stat.S_IMODE(os.stat(state / name).st_mode) for name in (".", "run", "agents")}


@pytest.mark.skipif(not ROOT, reason="running an agent as another user needs a root supervisor")
@pytest.mark.skipif(nobody() is None, reason="no user nobody on this machine")
def test_a_second_supervisor_on_a_live_state_is_refused_before_it_changes_anything(
    supervised: Supervised, center: DevCenter, tmp_path: Path
) -> None:
    user = nobody()
    assert user is not None
    python = run_as(supervised, user)  # an interpreter and a pump nobody can run
    # Unfenced: what is proved here is the host's modes of <state>, run/ and agents/, the
    # only way in for an agent of another uid without the fence (inside it, the fence's own
    # directories decide: tests/supervisor/test_supervise_user.py).
    agent = {"id": "agent-1", "user": "nobody", "sandbox": "none"}
    supervised.write_fleet([{**agent, "command": supervised.standin("--hold")}])
    supervised.start()
    supervised.wait_running("agent-1")
    until(lambda: supervised.calls("agent-1"), 60, "the agent's first call")
    before = modes(supervised.state)
    assert before == {".": 0o711, "run": 0o711, "agents": 0o711}, before

    # The second one: same state directory, a fleet without `user` (it would want 0700).
    (tmp_path / "second").mkdir()
    second = Supervised(tmp_path / "second", center)
    os.rmdir(second.state)
    second.state = supervised.state
    second.write_fleet([{"id": "agent-2", "command": standin("--hold")}])
    done = second.run_to_exit()

    assert done.returncode == 3, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and done.stdout == "", done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert supervised.proc is not None
    assert str(supervised.state) in lines[0], lines[0]
    assert f"pid {supervised.proc.pid}" in lines[0] and "control_in_use" in lines[0], lines[0]
    assert modes(supervised.state) == before
    assert not (supervised.state / "agents" / "agent-2").exists()

    # The running supervisor's agent still works: a fresh attach from inside it (as nobody,
    # through the 0711 directories) reaches the center.
    calls = len(supervised.calls("agent-1"))
    config = supervised.state / "agents" / "agent-1" / "mcp.json"
    supervised.ctl("exec", "agent-1", "--", python, supervised.standin_script, str(config))
    latest = supervised.calls("agent-1")[calls:]
    assert latest and all(call["ok"] for call in latest), latest
    assert supervised.status()["agent-1"]["state"] == "running"


# -- a restart after `kill -9` ends what the dead supervisor left running -------------------------


def test_a_restart_after_kill_9_ends_a_fenced_agents_escapees_with_its_namespace(
    supervised: Supervised,
) -> None:
    """A fenced agent's `setsid` escapee is reparented to bubblewrap's init in the agent's PID
    namespace, not to the supervisor: a `kill -9` of the supervisor ends bubblewrap (its
    parent-death signal, SIGKILL), its init with it, and the whole namespace, escapee included;
    the next start runs the agent afresh."""
    tag = f"mcphost-fenced-leftover-{uuid.uuid4().hex}"
    escaper, escapee = f"{tag}-escaper", f"{tag}-escaper-escapee"
    supervised.write_fleet([{"id": "escaper", "command": [sys.executable, "-c", ESCAPER, escaper]}])
    try:
        supervised.start()
        supervised.wait_running("escaper")
        (old_escapee,) = until(lambda: tagged(escapee), 60, "the escapee")
        assert supervised.proc is not None
        supervised.proc.kill()
        supervised.proc.wait(timeout=60)
        until(lambda: old_escapee not in tagged(escapee), 60, "the escapee to end with it")
        supervised.start()
        supervised.wait_running("escaper")
        until(lambda: len(tagged(escapee)) == 1, 60, "the new escaper's escapee")
    finally:
        supervised.close()
        for pid in tagged(escaper) + tagged(escapee):
            os.kill(pid, signal.SIGKILL)


STUBBORN = (
    "import os, signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "open('stubborn.pids', 'a').write('%d\\n' % os.getpid())\n"
    "while True:\n"
    "    time.sleep(3600)\n"
)
# Double fork: the middle process leaves the agent's session (setsid) and exits at once, so the
# escapee is in a session of its own whose leader is gone, reparented to the supervisor.
ESCAPER = (
    "import os, sys, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        open('escapee.pids', 'a').write('%d\\n' % os.getpid())\n"
    "        code = 'import time\\nwhile True:\\n    time.sleep(3600)\\n'\n"
    "        os.execv(sys.executable, [sys.executable, '-c', code, sys.argv[1] + '-escapee'])\n"
    "    os._exit(0)\n"
    "os.wait()\n"
    "while True:\n"
    "    time.sleep(3600)\n"
)


def tagged(tag: str) -> list[int]:
    """Live (non-zombie) processes with `tag` as one of their arguments."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if tag.encode() in argv and descendants_alive([int(entry)]):
            found.append(int(entry))
    return found


def pids_in(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def test_a_restart_after_kill_9_ends_what_the_dead_supervisor_left(
    supervised: Supervised,
) -> None:
    tag = f"mcphost-leftover-{uuid.uuid4().hex}"
    stubborn, escaper, escapee = f"{tag}-stubborn", f"{tag}-escaper", f"{tag}-escaper-escapee"
    # unfenced: the sweep of recorded sessions and adopted escapees, what a `sandbox = "none"`
    # agent relies on (a fenced one's escapees live in its PID namespace: the test below)
    supervised.write_fleet(
        [
            {"id": "stubborn", "command": [sys.executable, "-c", STUBBORN, stubborn]},
            {"id": "escaper", "command": [sys.executable, "-c", ESCAPER, escaper]},
        ],
        **UNFENCED,
    )
    try:
        supervised.start()
        old_stubborn = supervised.wait_running("stubborn")["pid"]
        supervised.wait_running("escaper")
        escapees = supervised.workspace("escaper") / "escapee.pids"
        old_escapee = until(lambda: pids_in(escapees), 60, "the escapee")[0]
        until(
            lambda: any(
                e.get("event") == "supervisor.process_adopted" and e.get("pid") == old_escapee
                for e in supervised.events()
            ),
            60,
            "the supervisor to record the escapee it adopted",
        )
        assert supervised.proc is not None
        supervised.proc.kill()
        supervised.proc.wait(timeout=60)
        # The dead supervisor's parent-death signal (SIGTERM) ended only the escaper itself.
        until(lambda: not tagged(escaper), 60, "the escaper to die with its supervisor")
        assert descendants_alive([old_stubborn, old_escapee]) == [old_stubborn, old_escapee]

        supervised.start()  # the same state directory
        assert descendants_alive([old_stubborn, old_escapee]) == []  # ended before any spawn
        new_stubborn = supervised.wait_running("stubborn")["pid"]
        supervised.wait_running("escaper")
        assert new_stubborn != old_stubborn
        until(lambda: len(pids_in(escapees)) == 2, 60, "the new escaper's escapee")
        assert tagged(stubborn) == [new_stubborn]
        assert len(tagged(escaper)) == 1 and tagged(escapee) == [pids_in(escapees)[1]]
        ended = [e for e in supervised.events(this_run=True) if e["event"].endswith("_ended")]
        assert ended and {old_stubborn, old_escapee} <= set(ended[0]["pids"]), ended
    finally:
        supervised.close()
        for pid in tagged(stubborn) + tagged(escaper) + tagged(escapee):
            os.kill(pid, signal.SIGKILL)  # whatever a failed run left


def test_after_kill_9_the_next_supervisor_shows_the_crash_as_the_last_exit(
    supervised: Supervised,
) -> None:
    """Not the exit before it (a clean stop's "stopped by the supervisor"): the generation that
    ran when the supervisor died has no exit recorded, so the next one records the crash."""
    supervised.write_fleet([{"id": "agent-1", "command": supervised.standin("--hold")}])
    try:
        supervised.start()
        first = supervised.wait_running("agent-1")["generation"]
        assert supervised.terminate() == 0
        supervised.start()
        row = supervised.wait_running("agent-1")
        assert row["generation"] > first and row["last_reason"] == "stopped by the supervisor"
        lost_generation = row["generation"]
        assert supervised.proc is not None
        supervised.proc.kill()
        supervised.proc.wait(timeout=60)
        supervised.start()
        row = supervised.wait_running("agent-1")
        assert row["generation"] > lost_generation, row
        assert (row["last_exit"], row["last_reason"]) == (
            "unknown",
            "the supervisor died while this generation ran (no exit was recorded)",
        ), row
        (lost,) = [
            e
            for e in supervised.events(this_run=True)
            if e["event"] == "supervisor.lost_runs_recorded"
        ]
        assert lost["agents"] == {"agent-1": lost_generation}, lost
    finally:
        supervised.close()


def test_a_fleet_s_start_up_commits_its_generations_in_one_fsync(
    supervised: Supervised, tmp_path: Path
) -> None:
    """Four agents start: their generations are reserved at the center together and committed
    in one transaction (one fsync of the state's log, not one per spawn), their process records
    in the log with no fsync of their own; each runs at a generation of its own. Counted on the
    real supervisor under strace (its `fsync`s on the state file's log, by path)."""
    import shutil

    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed")
    trace = tmp_path / "fsyncs"
    plain = supervised.argv
    traced = [strace, "-f", "-qq", "-y", "-e", "trace=fsync,fdatasync", "-o", str(trace)]
    supervised.argv = lambda: [*traced, *plain()]  # type: ignore[method-assign]
    ids = ("agent-1", "agent-2", "agent-x", "agent-y")
    hold = [sys.executable, "-c", "import time; time.sleep(3600)"]
    supervised.write_fleet([{"id": a, "command": hold} for a in ids], **UNFENCED)
    try:
        supervised.start()  # ready: every agent of the fleet was started
        rows = {a: supervised.wait_running(a) for a in ids}
        assert all(row["generation"] >= 1 for row in rows.values()), rows
        log = str(supervised.state / "state.sqlite3-wal")
        synced = [line for line in trace.read_text().splitlines() if f"<{log}>" in line]
        # the generations' commit, and the agents' own uids kept (a root supervisor's)
        assert 1 <= len(synced) <= 2, synced
    finally:
        if supervised.proc is not None:  # strace: stop the supervisor it runs, strace follows
            pid = supervised.proc.pid
            with open(f"/proc/{pid}/task/{pid}/children") as handle:
                for child in handle.read().split():
                    os.kill(int(child), signal.SIGTERM)
            supervised.proc.wait(timeout=60)
        supervised.close()


def recorded_pids(supervised: Supervised) -> set[int]:
    """The pids the supervisor's state file records as run or adopted (read only, beside the
    writer: the file is in WAL mode)."""
    path = supervised.state / "state.sqlite3"
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return {int(row[0]) for row in db.execute("SELECT pid FROM processes")}


def test_an_adopted_escapees_death_is_noticed_and_its_record_forgotten_at_once(
    supervised: Supervised,
) -> None:
    tag = f"mcphost-adopted-{uuid.uuid4().hex}"
    supervised.write_fleet(
        [{"id": "escaper", "command": [sys.executable, "-c", ESCAPER, f"{tag}-escaper"]}],
        **UNFENCED,
    )
    try:
        supervised.start()
        supervised.wait_running("escaper")
        escapees = supervised.workspace("escaper") / "escapee.pids"
        escapee = until(lambda: pids_in(escapees), 60, "the escapee")[0]
        until(lambda: escapee in recorded_pids(supervised), 60, "the escapee recorded")
        os.kill(escapee, signal.SIGKILL)
        exited = until(
            lambda: [
                e
                for e in supervised.events()
                if e.get("event") == "supervisor.adopted_exited" and e.get("pid") == escapee
            ],
            60,
            "the supervisor to notice the adopted escapee's death",
        )
        assert exited[0]["exit"] == "signal 9", exited
        until(lambda: escapee not in recorded_pids(supervised), 60, "the record forgotten")
        assert supervised.status()["escaper"]["state"] == "running"  # the agent is untouched
    finally:
        supervised.close()
        for pid in tagged(tag):
            os.kill(pid, signal.SIGKILL)
