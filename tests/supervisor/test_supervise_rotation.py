"""Black-box: token rotation without downtime, through a real `mcphost supervise` whose `[center]
token_file` is the reference center's own token file, a stand-in agent (`loop_agent.py`) with
four sessions calling `get_my_work` in a loop, and the devcenter's rotation
(`POST /_devcenter/workers/<worker>/token`). No call is lost and the agent keeps its PID and
generation: with a reload inside the overlap, and with no reload at all (a 401 re-reads the
token file once per rotation, single-flight). Prints the calls in flight and the calls lost.
"""

from __future__ import annotations

import time

import pytest

from mcphost.testing.devcenter import DevCenter
from tests.supervisor.supervise_harness import Supervised
from tests.supervisor.test_supervise_center import (
    AGENT,
    center,
    events,
    ok_after,
    stop_loop,
    sv,
    write_fleet,
)
from tests.waiting import until

# deep (make test-slow): token rotations with calls in flight.
pytestmark = pytest.mark.deep

__all__ = ["center", "sv"]  # the fixtures


def rotation(sv: Supervised, center: DevCenter, *, reload: bool) -> None:
    sv.token_file = center.token_path()  # the file the center rotates
    write_fleet(sv, sessions=4, token_file=str(sv.token_file))
    sv.start()
    before = sv.wait_running(AGENT)
    until(lambda: ok_after(sv, 0, 40), 60, "calls before the rotation")
    old = center.token
    rotated_at = time.time()
    center.rotate_token(overlap_seconds=3 if reload else 0)
    if reload:
        sv.ctl("reload")
    until(
        lambda: (
            center.request(
                "GET", "/admin/worker/agents", headers={"Authorization": f"Bearer {old}"}
            ).status
            == 401
        ),
        60,
        "the old token to be refused",
    )
    refused_at = time.time()
    until(lambda: ok_after(sv, refused_at, 40), 60, "calls after the old token is refused")
    done = stop_loop(sv)
    during = [c for c in done if rotated_at <= c["at"] <= refused_at]
    lost = [c for c in done if not c["ok"]]
    print(
        f"rotation ({'reload' if reload else '401 re-read'}): {len(done)} calls, "
        f"{len(during)} during the overlap, {len(lost)} lost"
    )
    assert not lost, lost[:3]
    after = sv.status()[AGENT]
    assert (after["pid"], after["generation"]) == (before["pid"], before["generation"])
    rereads = events(sv, "supervisor.token_reread")
    if reload:
        assert any("token" in e.get("changed", []) for e in events(sv, "supervisor.center_changed"))
    else:
        assert len(rereads) == 1, rereads  # once per rotation, not once per refused call
    assert sv.center_health()["state"] == "ok"


def test_rotation_with_a_reload_inside_the_overlap_loses_no_call(
    sv: Supervised, center: DevCenter
) -> None:
    rotation(sv, center, reload=True)


def test_rotation_without_a_reload_rereads_the_token_once_and_loses_no_call(
    sv: Supervised, center: DevCenter
) -> None:
    rotation(sv, center, reload=False)
