"""Black-box: systemd's notify protocol (`Type=notify`), through a real `mcphost supervise`
whose `NOTIFY_SOCKET` is a real AF_UNIX datagram socket this test binds, as systemd does.

What contrib/systemd/mcphost-supervisor.service and docs/operations.md promise: `READY=1` (with
a `STATUS=` line naming the agents) comes only once the control socket answers and every agent
was started; a reload (SIGHUP, systemd's ExecReload) sends `RELOADING=1` with `MONOTONIC_USEC=`,
then `READY=1`; a stop sends `STOPPING=1`; no agent sees `NOTIFY_SOCKET` in its environment.
"""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.supervisor.supervise_harness import Supervised, inner, standin
from tests.waiting import until


class Systemd:
    """The manager's end of NOTIFY_SOCKET: a bound datagram socket, its messages as dicts."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.setblocking(False)

    def receive(self) -> dict[str, str] | None:
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return None
        return dict(line.split("=", 1) for line in data.decode().splitlines())

    def next(self, what: str) -> dict[str, str]:
        return until(self.receive, 60, what)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(params=["path", "abstract"])
def systemd(request: pytest.FixtureRequest) -> Iterator[tuple[Systemd, str]]:
    if request.param == "path":
        where = tempfile.mkdtemp(prefix="mcphost-notify-")
        address = value = os.path.join(where, "notify")
    else:
        name = f"mcphost-notify-{os.getpid()}-{time.monotonic_ns()}"
        address, value = "\0" + name, "@" + name
    manager = Systemd(address)
    try:
        yield manager, value
    finally:
        manager.close()


def test_ready_reloading_and_stopping_reach_notify_socket(
    supervised: Supervised, systemd: tuple[Systemd, str]
) -> None:
    manager, value = systemd
    supervised.extra_env["NOTIFY_SOCKET"] = value
    agents = [{"id": f"agent-{n}", "command": standin("--hold")} for n in (1, 2)]
    supervised.write_fleet(agents)
    supervised.start()
    ready = manager.next("READY=1")
    # sent once the control socket answers and every agent was started
    rows = supervised.status()
    assert ready["READY"] == "1", ready
    assert sorted(rows) == ["agent-1", "agent-2"] and all(r["pid"] for r in rows.values()), rows
    control = str(supervised.state / "control.sock")
    assert ready["STATUS"].startswith(f"2 agents; control {control}"), ready
    # agents never see NOTIFY_SOCKET (the supervisor took it out of its environment)
    for agent_id in rows:
        pid = supervised.wait_running(agent_id)["pid"]
        for each in {pid, inner(pid)}:
            environ = Path(f"/proc/{each}/environ").read_bytes().split(b"\0")
            assert not [v for v in environ if v.startswith(b"NOTIFY_SOCKET=")], (agent_id, each)
    # a reload, as systemd's ExecReload asks: RELOADING=1 at its start, READY=1 after it
    supervised.write_fleet([*agents, {"id": "agent-3", "command": standin("--hold")}])
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert supervised.proc is not None
    supervised.proc.send_signal(signal.SIGHUP)
    reloading = manager.next("RELOADING=1")
    assert reloading["RELOADING"] == "1" and int(reloading["MONOTONIC_USEC"]) >= before, reloading
    again = manager.next("READY=1 after the reload")
    assert again["READY"] == "1" and again["STATUS"].startswith("3 agents; "), again
    assert "agent-3" in supervised.status()
    # a stop: STOPPING=1 first
    assert supervised.terminate() == 0
    stopping = manager.next("STOPPING=1")
    assert stopping["STOPPING"] == "1", stopping
    assert manager.receive() is None  # nothing after it


def test_a_notify_socket_that_is_gone_is_said_once_and_the_supervisor_runs_on(
    supervised: Supervised, tmp_path: Path
) -> None:
    supervised.extra_env["NOTIFY_SOCKET"] = str(tmp_path / "no-such-socket")
    supervised.write_fleet([{"id": "agent-1", "command": standin("--hold")}])
    supervised.start()
    supervised.wait_running("agent-1")
    supervised.ctl("reload")  # RELOADING=1 and READY=1 fail too: still one line
    failed = [e for e in supervised.events() if e.get("event") == "supervisor.notify_failed"]
    assert len(failed) == 1 and failed[0]["level"] == "warning", failed
    assert failed[0]["socket"] == str(tmp_path / "no-such-socket") and failed[0]["fix"], failed
    assert supervised.terminate() == 0
