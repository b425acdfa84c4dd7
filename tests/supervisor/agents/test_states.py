"""An agent's states (mcphost/supervisor/agents/states.py): their spelling (`ctl status`) and the
rules read from them (active, ended, running)."""

from __future__ import annotations

from mcphost.supervisor.agents.states import AgentState, AgentStatus


def test_the_states_are_spelled_as_ctl_status_shows_them() -> None:
    assert [str(s) for s in AgentState] == [
        "starting", "running", "backoff", "failed", "stopping", "stopped",
    ]  # fmt: skip


def test_active_is_run_or_will_run_by_itself_and_ended_is_nothing_will() -> None:
    active = {s for s in AgentState if s.active}
    ended = {s for s in AgentState if s.ended}
    assert active == {AgentState.STARTING, AgentState.RUNNING, AgentState.BACKOFF}
    assert ended == {AgentState.STOPPED, AgentState.FAILED}
    assert AgentState.STOPPING not in active | ended  # on its way: neither yet


def test_running_is_the_running_state_with_a_process() -> None:
    def status(state: AgentState, pid: int | None) -> AgentStatus:
        return AgentStatus("a", state, pid, 1, 0, None, None, None)

    assert status(AgentState.RUNNING, 42).running
    assert not status(AgentState.RUNNING, None).running
    assert not status(AgentState.STARTING, 42).running
