"""The agent runner: the pure policy parts (with hypothesis properties), then real agents.

Every scenario with real processes runs in a fresh interpreter (`isolated`, see confine/test_kernel.py):
it installs a SIGCHLD reaper that collects *every* child and makes itself a child subreaper, as
the supervisor does, which pytest's own process must not. Restart delays are 0.01 s; waits are on
conditions (a spawn was recorded, a state was reached), never on sleeps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import signal
import stat
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcphost.supervisor.agents import runner
from mcphost.supervisor.agents.logs import log_files, tail
from mcphost.supervisor.agents.runner import (
    AgentRunner,
    Collaborators,
    Intensity,
    backoff_delay,
    should_restart,
)
from mcphost.supervisor.agents.states import AgentState
from mcphost.supervisor.confine import kernel
from mcphost.supervisor.state import StateStore
from tests.supervisor.confine.test_kernel import isolated, state_of, until_async
from tests.supervisor.supervise_harness import ignores

# deep (make test-slow): restart policies and backoff of real processes.
pytestmark = pytest.mark.deep

# -- pure policy ---------------------------------------------------------------------------


def test_should_restart_per_policy() -> None:
    for code in (0, 1, -9, -15, None):
        assert should_restart("always", code, stopped_by_us=False)
        assert not should_restart("never", code, stopped_by_us=False)
        for policy in ("always", "on-failure", "never"):
            assert not should_restart(policy, code, stopped_by_us=True)
    assert not should_restart("on-failure", 0, stopped_by_us=False)
    for code in (1, 255, -9, -15, None):  # non-zero, killed by a signal, a failed spawn
        assert should_restart("on-failure", code, stopped_by_us=False)
    with pytest.raises(ValueError):
        should_restart("sometimes", 1, stopped_by_us=False)


@given(
    base=st.floats(min_value=1e-4, max_value=100.0),
    cap=st.floats(min_value=1e-4, max_value=1e4),
    k1=st.integers(min_value=0, max_value=5000),
    k2=st.integers(min_value=0, max_value=5000),
)
def test_backoff_is_monotone_capped_and_doubles(base: float, cap: float, k1: int, k2: int) -> None:
    lo, hi = sorted((k1, k2))
    assert backoff_delay(lo, base, cap) <= backoff_delay(hi, base, cap) <= cap
    assert backoff_delay(0, base, cap) == min(base, cap)
    if lo < 64 and base * 2 ** (lo + 1) <= cap:  # below the cap it doubles exactly
        assert backoff_delay(lo + 1, base, cap) == 2 * backoff_delay(lo, base, cap)
    assert backoff_delay(5000, base, cap) == cap


def test_intensity_is_exact_at_the_window_boundary() -> None:
    limit = Intensity(max_restarts=2, window=10.0)
    assert limit.allow(0.0) and limit.allow(1.0)
    assert not limit.allow(9.999)  # a third within [t, t + 10)
    assert limit.allow(10.0)  # the restart at 0.0 no longer counts at exactly 0.0 + 10
    assert not limit.allow(10.5)
    assert limit.allow(11.0)
    assert Intensity(max_restarts=0, window=1.0).allow(0.0) is False


@settings(deadline=None)
@given(
    max_restarts=st.integers(min_value=0, max_value=5),
    window=st.integers(min_value=1, max_value=20),
    gaps=st.lists(st.integers(min_value=0, max_value=15), max_size=40),
)
def test_intensity_matches_its_definition(max_restarts: int, window: int, gaps: list[int]) -> None:
    """Integer times make the boundary exact: a restart at t counts during [t, t + window)."""
    limit = Intensity(max_restarts, window)
    accepted: list[int] = []
    now = 0
    for gap in gaps:
        now += gap
        recent = [t for t in accepted if now - t < window]
        allowed = limit.allow(now)
        assert allowed == (len(recent) < max_restarts)
        if allowed:
            accepted.append(now)
    for t in accepted:  # never more than max_restarts within any window
        assert sum(1 for u in accepted if t <= u < t + window) <= max_restarts


# -- real agents ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StubPlan:
    agent_id: str = "agent-1"
    restart: str = "on-failure"
    restart_delay: float = 0.01
    restart_max_delay: float = 0.04
    max_restarts: int = 100
    restart_window: float = 60.0
    stop_grace: float = 0.5
    log_max_bytes: int = 1 << 20
    log_keep: int = 2
    user: str | None = None
    uid: int | None = None


@dataclass(frozen=True)
class StubHome:
    workspace: str
    logs: str


@dataclass
class Rig:
    """One runner with recording callbacks, on a store and a reaper of its own."""

    directory: str
    plan: StubPlan
    argv: list[str]
    store: StateStore = field(init=False)
    reaper: kernel.Reaper = field(init=False)
    runner: AgentRunner = field(init=False)
    spawns: list[tuple[int, int, int]] = field(default_factory=list)
    exits: list[int] = field(default_factory=list)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        kernel.set_child_subreaper()  # as the supervisor: left-behind processes come back here
        self.store = StateStore(os.path.join(self.directory, "state.sqlite3"))
        self.reaper = kernel.Reaper()
        self.reaper.install()
        workspace = os.path.join(self.directory, "workspace")
        os.makedirs(workspace, exist_ok=True)
        self.home = StubHome(workspace, os.path.join(self.directory, "logs"))
        runner.emit = lambda event, level="info", **f: self.events.append((event, f))
        self.runner = AgentRunner(self.plan, self.home, self.given())

    def given(self, **changes: Any) -> Collaborators:
        """What the rig's runner is given: its store and reaper, its recorders, its argv and
        the test's environment; `changes` replace some."""
        given = Collaborators(
            store=self.store,
            reaper=self.reaper,
            on_spawn=lambda r, pid, start, gen: self.spawns.append((pid, start, gen)),
            on_exit=lambda r, gen: self.exits.append(gen),
            argv=self.argv,
            env=dict(os.environ),
        )
        return dataclasses.replace(given, **changes)

    def named(self, event: str) -> list[dict[str, Any]]:
        return [f for e, f in self.events if e == event]

    async def state(self, state: AgentState) -> None:
        await until_async(lambda: self.runner.status().state == state, f"state {state}")

    async def close(self) -> None:
        await self.runner.aclose()
        self.reaper.uninstall()
        self.store.close()


def sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


async def _exit_1_restarts_with_backoff(directory: str) -> dict[str, Any]:
    rig = Rig(directory, StubPlan(), sh("exit 1"))
    await rig.runner.start()
    await until_async(lambda: len(rig.exits) >= 5, "five runs ended")
    await rig.runner.stop()
    status = rig.runner.status()
    await rig.close()
    generations = [gen for _, _, gen in rig.spawns]
    return {
        "generations": generations[:5],
        "exits": rig.exits[:5],
        "starttimes": all(start > 0 for _, start, _ in rig.spawns),
        "delays": [f["delay"] for f in rig.named("supervisor.agent_backoff")][:4],
        "state": status.state,
        "last_exit": status.last_exit,
        "restarts_counted": status.restarts == len(rig.spawns) - 1,
    }


def test_an_agent_that_exits_1_restarts_with_a_new_generation_and_backoff(tmp_path: Any) -> None:
    out = isolated(_exit_1_restarts_with_backoff, str(tmp_path))
    assert out == {
        "generations": [1, 2, 3, 4, 5],
        "exits": [1, 2, 3, 4, 5],
        "starttimes": True,
        "delays": [0.01, 0.02, 0.04, 0.04],  # doubling, capped at restart_max_delay
        "state": "stopped",
        "last_exit": "exit 1",
        "restarts_counted": True,
    }


async def _ends_per_policy(directory: str, restart: str, script: str) -> dict[str, Any]:
    rig = Rig(directory, StubPlan(restart=restart), sh(script))
    await rig.runner.start()
    if restart == "always":
        await until_async(lambda: len(rig.spawns) >= 3, "three spawns")
    else:
        await until_async(lambda: rig.runner._task is not None and rig.runner._task.done(), "end")
    status = rig.runner.status()
    await rig.close()
    return {
        "spawns": min(len(rig.spawns), 3),
        "state": status.state,
        "last_exit": status.last_exit,
    }


@pytest.mark.parametrize(
    ("restart", "script", "expected"),
    [
        ("on-failure", "exit 0", {"spawns": 1, "state": "stopped", "last_exit": "exit 0"}),
        ("never", "exit 1", {"spawns": 1, "state": "failed", "last_exit": "exit 1"}),
        ("never", "exit 0", {"spawns": 1, "state": "stopped", "last_exit": "exit 0"}),
        ("always", "exit 0", {"spawns": 3, "state": "running", "last_exit": "exit 0"}),
    ],
)
def test_the_restart_policy_decides(
    tmp_path: Any, restart: str, script: str, expected: dict[str, Any]
) -> None:
    out = isolated(_ends_per_policy, str(tmp_path), restart, script)
    if restart == "always":  # caught between runs or during one: either way it came back
        assert out["spawns"] == 3 and out["state"] in ("running", "backoff", "starting")
    else:
        assert out == expected


async def _intensity_fails_then_restart_recovers(directory: str) -> dict[str, Any]:
    flag = os.path.join(directory, "healthy")
    plan = StubPlan(max_restarts=2, restart_window=60.0)
    rig = Rig(directory, plan, sh(f'test -e "{flag}" && exec sleep 1000; exit 1'))
    await rig.runner.start()
    await rig.state(AgentState.FAILED)
    failed = rig.runner.status()
    spawns_when_failed = len(rig.spawns)
    open(flag, "w").close()
    await rig.runner.restart()
    running = rig.runner.status()
    alive = running.pid is not None and state_of(running.pid) not in (None, "Z")
    await rig.runner.stop()
    await rig.close()
    return {
        "spawns_when_failed": spawns_when_failed,
        "failed_reason": "more than 2 restarts within 60 s" in (failed.last_reason or ""),
        "failed_pid": failed.pid,
        "after_restart": (running.state, running.generation, alive),
        "failed_events": len(rig.named("supervisor.agent_failed")),
    }


def test_restart_intensity_fails_the_agent_until_an_explicit_restart(tmp_path: Any) -> None:
    out = isolated(_intensity_fails_then_restart_recovers, str(tmp_path))
    assert out == {
        "spawns_when_failed": 3,  # the first run and 2 restarts; a third restart is refused
        "failed_reason": True,
        "failed_pid": None,
        "after_restart": ("running", 4, True),
        "failed_events": 1,
    }


async def _crash_loop_under_doubling_backoff(directory: str) -> dict[str, Any]:
    # runs of 0.5 s, delays doubling from 0.05 s: six runs take 3 s of the agent's own time and
    # 4.55 s of the wall clock's (the delays 0.05 + 0.1 + 0.2 + 0.4 + 0.8 between them)
    plan = StubPlan(restart_delay=0.05, restart_max_delay=3.0, max_restarts=5, restart_window=3.4)
    rig = Rig(directory, plan, sh("sleep 0.5; exit 1"))
    await rig.runner.start()
    await until_async(
        lambda: rig.runner.status().state == AgentState.FAILED or len(rig.spawns) > 8,
        "failed, or restarted past the intensity",
    )
    status = rig.runner.status()
    await rig.close()
    return {
        "state": status.state,
        "spawns": len(rig.spawns),
        "reason": status.last_reason,
        "delays": [f["delay"] for f in rig.named("supervisor.agent_backoff")],
    }


def test_a_crash_loop_fails_although_the_backoff_spreads_it_past_the_window(
    tmp_path: Any,
) -> None:
    """Issue #34: an agent OOM-killed in a loop never reached `failed`: each run took a while
    to fill its memory, and with the doubling delays between runs no `restart_window` of the
    wall clock held a sixth failure (under the defaults, runs of 5 s: exits at 5, 11, 18, 27,
    40, 61 s ...), so it was restarted forever. The window counts the agent's own time, not the
    backoff's: the sixth failure within it fails the agent."""
    out = isolated(_crash_loop_under_doubling_backoff, str(tmp_path))
    assert out["state"] == "failed", out
    assert out["spawns"] == 6, out  # the first run and 5 restarts; the sixth is refused
    assert "more than 5 restarts within 3.4 s" in out["reason"], out
    assert out["delays"] == [0.05, 0.1, 0.2, 0.4, 0.8], out  # the backoff paced them all


# The agent: a grandchild in the same process group that ignores SIGTERM; both print their pid.
GROUP_AGENT = textwrap.dedent(
    """
    import os, signal, sys
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("grandchild", os.getpid(), flush=True)
        while True:
            signal.pause()
    print("agent", os.getpid(), flush=True)
    while True:
        signal.pause()
    """
)


async def _stop_kills_the_group(directory: str) -> dict[str, Any]:
    rig = Rig(directory, StubPlan(stop_grace=0.3), [sys.executable, "-I", "-S", "-c", GROUP_AGENT])
    await rig.runner.start()
    logs = rig.home.logs
    await until_async(lambda: b"grandchild" in tail(logs, 5) and b"agent" in tail(logs, 5), "pids")
    lines = [line for line in tail(logs, 5).splitlines() if not line.startswith(b"--- ")]
    pids = {line.split()[0]: int(line.split()[1]) for line in lines}
    status = rig.runner.status()
    await rig.runner.stop()
    after = rig.runner.status()
    restarted = len(rig.spawns)
    await rig.close()
    return {
        "agent_is_leader": pids[b"agent"] == status.pid,
        "agent": state_of(pids[b"agent"]),
        "grandchild": state_of(pids[b"grandchild"]),
        "killed": [f["pgid"] for f in rig.named("supervisor.agent_killed")] == [status.pid],
        "state": after.state,
        "last_exit": after.last_exit,
        "last_reason": after.last_reason,
        "spawns": restarted,
    }


def test_stop_ends_the_whole_group_killing_what_ignores_sigterm(tmp_path: Any) -> None:
    out = isolated(_stop_kills_the_group, str(tmp_path))
    assert out == {
        "agent_is_leader": True,
        "agent": None,
        "grandchild": None,  # ignored SIGTERM: SIGKILLed after the grace, then reaped
        "killed": True,
        "state": "stopped",
        "last_exit": "signal 15",
        "last_reason": "stopped by the supervisor",
        "spawns": 1,  # no restart after our own stop, though the policy is on-failure
    }


async def _first_spawn_is_announced_before_yielding(directory: str) -> dict[str, Any]:
    rig = Rig(directory, StubPlan(), ["/usr/bin/sleep", "1000"])
    seen: list[bool] = []
    ran: list[bool] = []
    rig.runner._on_spawn = lambda r, pid, start, gen: seen.append(bool(ran))
    asyncio.get_running_loop().call_soon(ran.append, True)
    await rig.runner.start()
    await rig.runner.stop()
    await rig.close()
    return {"loop_ran_before_on_spawn": seen}


def test_on_spawn_runs_before_the_loop_runs_anything_else(tmp_path: Any) -> None:
    assert isolated(_first_spawn_is_announced_before_yielding, str(tmp_path)) == {
        "loop_ran_before_on_spawn": [False]
    }


# A process group that ignores SIGTERM (inherited through exec): every stop of it lasts the
# whole `stop_grace`, a window in which another operation can come in -- deterministically.
STUBBORN = sh("trap '' TERM; exec sleep 1000")


def _alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if state_of(pid) not in (None, "Z")]


async def _restart_overlapping_a_close(directory: str) -> dict[str, Any]:
    """`ctl restart A` while a reload replaces A: the reload closes the runner during the
    restart's stop; the restart's start must then do nothing (issue #18: a hidden second A)."""
    rig = Rig(directory, StubPlan(stop_grace=0.3), STUBBORN)
    await rig.runner.start()
    pid = rig.spawns[0][0]
    await until_async(lambda: ignores(pid, signal.SIGTERM), "the agent to ignore SIGTERM")
    restart = asyncio.ensure_future(rig.runner.restart())
    await rig.state(AgentState.STOPPING)  # the restart is inside its stop now
    await rig.runner.aclose()  # the reload closing the replaced runner
    await restart
    out = {
        "spawns": len(rig.spawns),
        "alive": _alive([pid for pid, _, _ in rig.spawns]),
        "state": rig.runner.status().state,
    }
    await rig.runner.start()  # a closed runner never spawns again, whoever asks
    out["spawns_after_start"] = len(rig.spawns)
    await rig.close()
    return out


def test_a_restart_overlapping_a_close_spawns_nothing(tmp_path: Any) -> None:
    assert isolated(_restart_overlapping_a_close, str(tmp_path)) == {
        "spawns": 1,
        "alive": [],
        "state": "stopped",
        "spawns_after_start": 1,
    }


class SlowLaunch(AgentRunner):
    """A runner whose launch awaits after it spawned (as a tmux pane's does, waiting for the
    pane's process) until `go` is set. (A stop asked before the spawn spawns nothing at all:
    `_launch` checks after the generation's reservation.)"""

    go: asyncio.Event
    inside: asyncio.Event

    async def _launch(self) -> Any:
        run = await super()._launch()
        self.inside.set()
        await self.go.wait()
        return run


async def _stop_during_a_launch(directory: str) -> dict[str, Any]:
    rig = Rig(directory, StubPlan(stop_grace=0.3), STUBBORN)
    runner = SlowLaunch(rig.plan, rig.home, rig.given())
    runner.go, runner.inside = asyncio.Event(), asyncio.Event()
    starting = asyncio.ensure_future(runner.start())
    await runner.inside.wait()  # the start is inside its launch, which waits for `go`
    stopping = asyncio.ensure_future(runner.stop())
    await until_async(lambda: not runner._want, "the stop to be asked for")
    runner.go.set()  # the launch completes after the stop was asked for
    await starting
    await stopping
    out = {
        "spawns": len(rig.spawns),
        "alive": _alive([pid for pid, _, _ in rig.spawns]),
        "state": runner.status().state,
    }
    await runner.aclose()
    await rig.close()
    return out


def test_a_stop_asked_during_a_launch_ends_what_it_launched(tmp_path: Any) -> None:
    assert isolated(_stop_during_a_launch, str(tmp_path)) == {
        "spawns": 1,
        "alive": [],
        "state": "stopped",
    }


async def _spawn_failures(directory: str, program: str) -> dict[str, Any]:
    rig = Rig(directory, StubPlan(max_restarts=1), [program, "x"])
    await rig.runner.start()
    await rig.state(AgentState.FAILED)
    status = rig.runner.status()
    await rig.close()
    return {
        "reason": status.last_reason,
        "generation": status.generation,
        "spawns": len(rig.spawns),
        "last_exit": status.last_exit,
    }


def test_a_program_that_cannot_run_counts_as_a_failure(tmp_path: Any) -> None:
    missing = os.path.join(str(tmp_path), "no-such-agent")
    out = isolated(_spawn_failures, str(tmp_path), missing)
    assert out["reason"].startswith(f"cannot run {missing}: No such file or directory [ENOENT]")
    assert out["reason"].endswith("more than 1 restarts within 60 s")
    assert (out["generation"], out["spawns"], out["last_exit"]) == (2, 0, None)

    plain = os.path.join(str(tmp_path), "not-executable")
    with open(plain, "w") as f:
        f.write("#!/bin/sh\n")
    os.chmod(plain, 0o644)
    out = isolated(_spawn_failures, str(tmp_path), plain)
    assert out["reason"].startswith(f"cannot run {plain}: Permission denied [EACCES]")


async def _output_rotates(directory: str) -> dict[str, Any]:
    script = 'i=0; while [ $i -lt 40 ]; do echo "line $i of the agent"; i=$((i+1)); done'
    plan = StubPlan(restart="never", log_max_bytes=100, log_keep=2)
    rig = Rig(directory, plan, sh(script))
    await rig.runner.start()
    logs = rig.home.logs
    await until_async(lambda: tail(logs, 1) == b"line 39 of the agent\n", "the last line logged")
    files = log_files(logs)
    out = {
        "names": [os.path.basename(p) for p in files],
        "sizes_ok": all(os.path.getsize(p) <= 100 for p in files),
        "modes": {stat.S_IMODE(os.stat(p).st_mode) for p in files},
        "tail": tail(logs, 2),
    }
    await rig.close()
    return out


def test_output_lands_in_the_rotating_log(tmp_path: Any) -> None:
    assert isolated(_output_rotates, str(tmp_path)) == {
        "names": ["agent.log", "agent.log.1", "agent.log.2"],
        "sizes_ok": True,
        "modes": {0o600},
        "tail": b"line 38 of the agent\nline 39 of the agent\n",
    }


async def _generations_across_supervisors(directory: str) -> list[int]:
    seen = []
    for _ in range(2):  # two "supervisor runs" on the same state file
        rig = Rig(directory, StubPlan(restart="never"), sh("exit 0"))
        await rig.runner.start()
        await until_async(lambda r=rig: bool(r.exits), "the run ended")  # type: ignore[misc]
        await rig.runner.restart()
        await until_async(lambda r=rig: len(r.exits) == 2, "the second run ended")  # type: ignore[misc]
        seen += [gen for _, _, gen in rig.spawns]
        await rig.close()
    return seen


def test_generations_keep_increasing_across_a_new_store(tmp_path: Any) -> None:
    assert isolated(_generations_across_supervisors, str(tmp_path)) == [1, 2, 3, 4]


async def _runs_as_user(directory: str) -> dict[str, Any]:
    os.chmod(directory, 0o755)
    rig = Rig(directory, StubPlan(restart="never", user="nobody"), ["/usr/bin/id", "-u"])
    await rig.runner.start()
    await until_async(lambda: bool(rig.exits), "the run ended")
    await until_async(lambda: tail(rig.home.logs, 1) != b"", "output logged")
    out = {"uid": tail(rig.home.logs, 1).strip(), "exit": rig.runner.status().last_exit}
    await rig.close()
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="switching user needs root")
def test_an_agent_runs_as_its_plans_user(tmp_path: Any) -> None:
    assert isolated(_runs_as_user, str(tmp_path)) == {"uid": b"65534", "exit": "exit 0"}


async def _separated_runs(directory: str) -> bytes:
    rig = Rig(directory, StubPlan(restart="never"), sh("echo output of the run"))
    await rig.runner.start()
    await until_async(lambda: len(rig.exits) == 1, "the first run ended")
    await rig.runner.restart()
    await until_async(lambda: len(rig.exits) == 2, "the second run ended")
    await until_async(lambda: tail(rig.home.logs, 1) == b"output of the run\n", "output logged")
    text = tail(rig.home.logs, 10)
    await rig.close()
    return text


def test_each_spawn_starts_with_a_separator_naming_its_generation(tmp_path: Any) -> None:
    """As a tmux agent's pane is framed in its log, a process agent's runs are told apart: a
    line with the agent, the generation and the UTC time comes before each run's output."""
    lines = isolated(_separated_runs, str(tmp_path)).decode().splitlines()
    stamp = r"\(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\)"
    assert len(lines) == 4, lines
    for index, generation in ((0, 1), (2, 2)):
        assert re.fullmatch(
            rf"--- agent-1, generation {generation}, spawned {stamp} ---", lines[index]
        )
        assert lines[index + 1] == "output of the run"
