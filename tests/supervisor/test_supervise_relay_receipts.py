"""Black-box: the relay tells the sender what happened to its send (issue #19 part 4).

A real `mcphost supervise` hosts the bundle `party` in real tmux: A (an echo agent, policy
`lead`), B (an echo agent) and C (a clock whose screen never holds still, so the readiness gate
never opens for it). The operator's `policies.toml`, which alone defines `lead`, is in
`$XDG_CONFIG_HOME/agentmux` (no `AGENTMUX_CONFIGURATION_DIRECTORY`): if the relay did not read
that layer, every request of A would be refused `validation_unknown_policy`.

- A sends to B while B is stopped (`ctl stop B`): the call is refused at admission with
  agentmux's `delivery_target_fail_stopped` (-32603 through the relay tools), details
  `{"target_session": "B@party"}`; nothing is queued.
- A sends to C: `queued`; C is then stopped before its gate ever opened, so the delivery ends
  `not_submitted` / `delivery_target_unreachable`; A's own pane then receives the
  terminal-outcome receipt from `relay@RELAY`, naming the message, C and the outcome.

Conditions only (`until`), no sleeps.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcphost.testing.devcenter import DevCenter
from tests.supervisor.agents.test_relayhost import POLICIES, drive, echo_agent, payload
from tests.supervisor.supervise_harness import Supervised, inline
from tests.supervisor.test_supervise_relay_send_bounds import CLOCK, pane
from tests.waiting import until

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


@pytest.fixture(scope="module")
def party(tmp_path_factory: pytest.TempPathFactory, center: DevCenter) -> Iterator[Supervised]:
    base = tmp_path_factory.mktemp("receipts")
    sv = Supervised(base, center)
    xdg = Path(tempfile.mkdtemp(prefix="mcphost-xdg-"))
    (xdg / "agentmux").mkdir()
    (xdg / "agentmux" / "policies.toml").write_text(POLICIES)
    sv.extra_env["XDG_CONFIG_HOME"] = str(xdg)
    sv.extra_env["AGENTMUX_CONFIGURATION_DIRECTORY"] = ""  # blank: names no layer
    agents = [
        {"id": "A", "command": echo_agent("A"), "policy": "lead"},
        {"id": "B", "command": echo_agent("B")},
        {"id": "C", "command": inline(CLOCK)},
    ]
    sv.write_fleet(agents, bundle="party", runner="tmux", restart="always")
    try:
        sv.start()
        for agent in ("A", "B", "C"):
            sv.wait_running(agent)
        yield sv
    finally:
        sv.close()
        shutil.rmtree(xdg, ignore_errors=True)
        shutil.rmtree(sv.state, ignore_errors=True)


def stop(sv: Supervised, agent: str) -> None:
    sv.ctl("stop", agent)
    until(lambda: sv.status()[agent]["state"] == "stopped", 60, f"{agent} to be stopped")


def test_a_send_to_a_stopped_member_is_refused_at_admission(
    party: Supervised, tmp_path: Path
) -> None:
    sv = party
    stop(sv, "B")
    [refused] = drive(sv, [{"tool": "send", "args": {"targets": ["B"], "message": "hi"}}])
    assert refused.get("isError") is True, refused
    error = refused["error"]
    assert error["code"] == -32603, error
    assert error["data"] == {
        "code": "delivery_target_fail_stopped",
        "message": "target session B@party is stopped and accepts no messages; nothing of this "
        "request was queued: start it again (ctl start, or updown up) and send then",
        "details": {"target_session": "B@party"},
    }, error
    assert error["message"] == error["data"]["message"]


def test_a_non_delivered_send_comes_back_to_the_sender_as_a_receipt(
    party: Supervised, tmp_path: Path
) -> None:
    sv = party
    [sent] = drive(sv, [{"tool": "send", "args": {"targets": ["C"], "message": "tick?"}}])
    [result] = payload(sent)["results"]
    assert (result["target_session"], result["outcome"]) == ("C@party", "queued"), sent
    lost = result["message_id"]
    stop(sv, "C")  # before C's screen ever held still: the delivery cannot happen

    def receipt() -> str | None:
        screen = pane(sv, "A")
        return screen if lost in screen and "was not delivered" in screen else None

    screen = until(receipt, 60, "A's pane to show the receipt")
    assert "--- agentmux terminal-outcome receipt ---" in screen, screen
    assert "From: relay <session:relay@RELAY>" in screen, screen
    assert "To: A@party <session:A@party>" in screen, screen
    assert (
        f"Your message {lost} to C@party was not delivered (failed). "
        "reason_code=delivery_target_unreachable"
    ) in screen, screen
    assert sv.status()["A"]["state"] == "running"
