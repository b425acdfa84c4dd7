"""Black-box: the page and `/metrics` refuse the agents' own uids (loopback.py), on a real
`mcphost supervise` process, as a hostile agent meets them.

One fleet with `[page]` and `[metrics]` on loopback TCP ports runs `hostile`, an agent as the
user `nobody` (fenced by default) that opens half-sent requests to both ports
(`mcphost/testing/flood_agent.py`), and `w`, a stand-in. Every connection the agent opens is closed
by the supervisor (it holds none of them), the refusals are logged as
`supervisor.listener_refused` with reason `agent_peer` and nobody's uid, a bounded number of
lines, while the operator (this test, root) is still answered on both ports; `/metrics` answers
its own address only (a rebound `Host` gets 403). test_supervise_listeners_flood.py (deep) is the
heavy version: ~3,000 connections per port by an agent of the supervisor's own uid.

Conditions only (`until`), no sleeps.
"""

from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from mcphost.supervisor.operator.loopback import LOG_EVERY_SECONDS
from tests.supervisor.supervise_harness import Supervised
from tests.supervisor.test_supervise_user import ROOT, nobody, run_as
from tests.waiting import until

LISTENERS = ("page", "metrics")
REASONS = 4  # agent_peer, peer_unknown, listener_full, peer_full


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def flooding(sv: Supervised, count: int, *ports: int) -> list[str]:
    """The hostile agent's command: `count` half-sent requests to each port."""
    script = str(Path(sv.standin_script).parent / "flood_agent.py")
    return [sv.python, "-I", script, "{workspace}/flood.json", str(count), *map(str, ports)]


def with_listeners(sv: Supervised, page: int, metrics: int) -> None:
    with sv.fleet.open("a") as fleet:
        fleet.write(f'\n[page]\nlisten = "127.0.0.1:{page}"\n')
        fleet.write(f'\n[metrics]\nlisten = "127.0.0.1:{metrics}"\n')


def report(sv: Supervised, agent: str) -> dict[str, Any] | None:
    """What the flooding agent wrote last (None: nothing yet); its figures by port (int)."""
    try:
        raw = json.loads((sv.workspace(agent) / "flood.json").read_text())
    except (OSError, ValueError):
        return None
    return {
        key: {int(port): n for port, n in value.items()} if isinstance(value, dict) else value
        for key, value in raw.items()
    }


def held(pid: int, ports: tuple[int, ...]) -> int:
    """Connections (not listeners) on `ports` whose socket process `pid` holds open."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            port = int(fields[1].rpartition(":")[2], 16)
            if fields[9] in inodes and port in ports and fields[3] != "0A":  # 0A: LISTEN
                count += 1
    return count


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def get(port: int, path: str, host: str | None = None) -> int:
    """The status of `GET path` at the port, asked by this process (root)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if host is not None:
        request.add_header("Host", host)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def refused(sv: Supervised) -> list[dict[str, Any]]:
    return [e for e in sv.events(this_run=True) if e.get("event") == "supervisor.listener_refused"]


def within_log_bound(lines: list[dict[str, Any]]) -> bool:
    """At most one line per listener and reason in each `LOG_EVERY_SECONDS` of the span the
    lines cover (by their own timestamps), and the first."""
    span = max(e["ts"] for e in lines) - min(e["ts"] for e in lines)
    return len(lines) <= len(LISTENERS) * REASONS * (2 + int(span // LOG_EVERY_SECONDS))


@pytest.mark.skipif(not ROOT or nobody() is None, reason="needs root and the user nobody")
def test_an_agents_own_uid_is_refused_on_the_page_and_metrics_while_the_operator_is_served(
    supervised: Supervised,
) -> None:
    user = nobody()
    assert user is not None
    run_as(supervised, user)
    page, metrics = free_port(), free_port()
    supervised.write_fleet(
        [
            {
                "id": "hostile",
                "user": "nobody",
                "command": flooding(supervised, 300, page, metrics),
            },
            {"id": "w", "command": supervised.standin("--hold")},
        ]
    )
    with_listeners(supervised, page, metrics)
    supervised.start()
    assert supervised.proc is not None
    pid = supervised.proc.pid

    def all_closed() -> dict[str, Any] | None:
        got = report(supervised, "hostile")
        if got and got["done"] and got["opened"] == got["closed"]:
            return got
        return None

    flood = until(all_closed, 120, "every connection of the agent closed by the supervisor")
    for port in (page, metrics):  # every one tried; "failed": reset before its bytes went
        assert flood["opened"][port] + flood["failed"][port] == 300 and flood["opened"][port], flood
    assert held(pid, (page, metrics)) == 0
    # the operator, root, is served on both while the agent is refused
    assert get(page, "/api/fleet") == 200
    assert get(metrics, "/metrics") == 200
    assert get(metrics, "/metrics", host=f"rebound.example:{metrics}") == 403
    assert get(page, "/", host=f"rebound.example:{page}") == 403
    lines = until(
        lambda: (
            {e["listener"] for e in refused(supervised)} == set(LISTENERS) and refused(supervised)
        ),
        60,
        "the refusals logged for both listeners",
    )
    assert {(e["reason"], e["uid"]) for e in lines} == {("agent_peer", user.pw_uid)}
    assert within_log_bound(lines), lines  # not one line per connection
