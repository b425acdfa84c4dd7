"""Black-box: one agent cannot spend another's share of a real `mcphost supervise`.

One real supervisor (module scope) runs two holding agents against the real reference center.
agent-1 is greedy: `mcphost/testing/greedy_agent.py`, run as agent-1 through `mcphost ctl
exec`, opens its 32 center sessions and floods them, or keeps 128 slow center calls in flight.
agent-2 is an ordinary MCP client (the official SDK through the real pump, also through `ctl
exec`). Proven here:
- memory: agent-1 flooding 32 sessions with 64 KiB requests without reading makes the
  supervisor stop reading agent-1 once agent-1's byte budget is spent (it reads nothing more,
  burns no CPU), its RSS stays within `RSS_BOUND_KIB` of where it started, far below what was
  sent, and agent-2's calls keep answering meanwhile;
- center calls: with agent-1 keeping 128 calls to a slow route in flight (the center holds each
  for ten minutes), the center sees exactly agent-1's cap of them, never more, and agent-2's
  instant call is answered while every one of agent-1's is still pending.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from mcphost.supervisor.center.link import CENTER_CALLS_PER_AGENT
from mcphost.supervisor.serving.sessions import AGENT_HELD_BYTES
from mcphost.supervisor.serving.surfaces import MAX_SESSIONS_PER_AGENT
from mcphost.testing.devcenter import DevCenter
from tests.supervisor.serving.test_sessions import activity, asleep, reset_peak, status_kib
from tests.supervisor.supervise_harness import Supervised
from tests.waiting import until

# deep (make test-slow): one agent's flood and slow calls against a supervisor.
pytestmark = [pytest.mark.deep, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
ATTACH = str(ROOT / "mcphost" / "attach.py")
GREEDY = str(ROOT / "mcphost" / "testing" / "greedy_agent.py")
HOLD = [sys.executable, "-c", "import signal; signal.pause()"]
FLOOD_PER_SESSION = 24 * 1024 * 1024  # 32 sessions: 768 MiB sent, about 12 times the budget
# The supervisor's RSS growth while agent-1 floods: its budget of request bytes, parsed once
# more for the SDK, plus a socket read per session: a small multiple of the budget, and a
# fraction of the 768 MiB a supervisor without the budget takes in.
RSS_BOUND_KIB = 4 * AGENT_HELD_BYTES // 1024
# "Reads nothing more" over one second: less than one 256 KiB socket read of the flood, and at
# most this many CPU ticks (1/100 s each) for the supervisor's own periodic work.
QUIET_READ = 64 * 1024
QUIET_TICKS = 5
SLOW_CALLS = 128
SLOW_MS = 600_000  # the center holds each of agent-1's calls for ten minutes


@pytest.fixture(scope="module")
def sv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervised]:
    base = tmp_path_factory.mktemp("shares")
    with DevCenter.start(base / "center") as center:
        running = Supervised(base, center)
        # no call may time out while the center holds it: in flight means in flight
        running.extra_env["MCPHOST_CALL_TIMEOUT_SECONDS"] = "3600"
        running.write_fleet(
            [{"id": "agent-1", "command": HOLD}, {"id": "agent-2", "command": HOLD}]
        )
        try:
            running.start()
            running.wait_running("agent-1")
            running.wait_running("agent-2")
            yield running
        finally:
            running.close()


def ctl_exec(sv: Supervised, agent: str, *argv: str) -> list[str]:
    return [
        sys.executable, "-m", "mcphost", "ctl", "--state", str(sv.state), "exec", agent, "--",
        *argv,
    ]  # fmt: skip


class Greedy:
    """agent-1's greedy client, its stdout lines collected as they come."""

    def __init__(self, sv: Supervised, *args: str) -> None:
        sock = str(sv.state / "run" / "center.sock")
        self.proc = subprocess.Popen(
            ctl_exec(sv, "agent-1", sys.executable, "-I", GREEDY, sock, *args),
            stdout=subprocess.PIPE,
            env=sv.env(),
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.decode().strip())

    def said(self, prefix: str) -> list[str]:
        return [line for line in list(self.lines) if line.startswith(prefix)]

    def close(self) -> None:
        self.proc.kill()  # ctl's connection closes: the supervisor ends the command
        self.proc.wait()


@pytest.fixture
def greedy(sv: Supervised) -> Iterator[list[Greedy]]:
    started: list[Greedy] = []
    yield started
    for one in started:
        one.close()
    until(lambda: sv.status()["agent-1"]["sessions"] == 0, 120, "agent-1's sessions to end")


def agent_2(sv: Supervised) -> StdioServerParameters:
    argv = ctl_exec(
        sv, "agent-2", sys.executable, "-I", "-S", ATTACH, str(sv.state / "run" / "center.sock")
    )
    return StdioServerParameters(command=argv[0], args=argv[1:], env=sv.env())


@pytest.mark.anyio
async def test_one_agent_flooding_its_sessions_cannot_grow_the_supervisor(
    sv: Supervised, greedy: list[Greedy]
) -> None:
    assert sv.proc is not None
    pid = sv.proc.pid
    async with Client(agent_2(sv), mode="legacy") as other:
        for _ in range(20):  # warm-up: the SDK, the HTTP stack and the allocator see calls
            assert not (await other.call_tool("get_my_work", {})).is_error
        baseline = status_kib(pid, "VmRSS")
        reset_peak(pid)
        flood = Greedy(sv, str(MAX_SESSIONS_PER_AGENT), "flood", str(FLOOD_PER_SESSION))
        greedy.append(flood)
        until(lambda: flood.said("ready") or flood.proc.poll() is not None, 120, "the sessions")
        assert flood.said("ready"), flood.lines
        assert sv.status()["agent-1"]["sessions"] == MAX_SESSIONS_PER_AGENT
        # the supervisor stops reading agent-1: over whole seconds it reads less than one of
        # the flood's socket reads and burns next to no CPU (its own periodic work -- the scan
        # for adopted processes, the center's health probe -- reads a few small /proc files);
        # a second counts only if it ends with the supervisor asleep (not merely starved of
        # CPU on a loaded machine, which would read nothing either)
        last = activity(pid)
        quiet = 0
        while quiet < 3:
            for _ in range(10):
                await anyio.sleep(0.1)
                grown = status_kib(pid, "VmRSS") - baseline
                assert grown <= RSS_BOUND_KIB, f"agent-1 grew the supervisor by {grown // 1024} MiB"
            sample = activity(pid)
            read, ticks = sample[0] - last[0], sample[1] - last[1]
            held = read < QUIET_READ and ticks <= QUIET_TICKS and asleep(pid)
            quiet = quiet + 1 if held else 0
            last = sample
        # agent-2 is served meanwhile, on the same shared client
        for _ in range(5):
            answer = await other.call_tool("get_my_work", {})
            assert not answer.is_error, answer
        peak = status_kib(pid, "VmHWM") - baseline
        assert peak <= RSS_BOUND_KIB, f"peak growth {peak // 1024} MiB"
        sent = len(flood.said("sent"))
        assert sent < MAX_SESSIONS_PER_AGENT, "the flood was never held up"


@pytest.mark.anyio
async def test_one_agent_keeping_slow_calls_in_flight_cannot_starve_another(
    sv: Supervised, greedy: list[Greedy]
) -> None:
    center: DevCenter = sv.center
    route = "/admin/agent-tools/get_task"

    def at_center() -> int:
        return sum(1 for e in center.requests(1000) if e["route"] == route)

    before = at_center()
    with center.faults(delay_ms={"get_task": SLOW_MS}):
        slow = Greedy(sv, "2", "calls", str(SLOW_CALLS))
        greedy.append(slow)
        until(lambda: slow.said("sent") or slow.proc.poll() is not None, 120, "the slow calls")
        assert slow.said("sent"), slow.lines
        until(
            lambda: at_center() - before >= CENTER_CALLS_PER_AGENT,
            120,
            "agent-1's calls to reach the center",
        )
        async with Client(agent_2(sv), mode="legacy") as other:
            with anyio.fail_after(120):  # only a starved call gets near this
                answer = await other.call_tool("get_my_work", {})
            assert not answer.is_error, answer
            assert "tasks" in json.loads(answer.content[0].text)
        assert slow.said("answer") == [], "agent-2 was answered while agent-1's all pend"
        assert at_center() - before == CENTER_CALLS_PER_AGENT, (
            "agent-1 had more than its cap in flight at the center"
        )
