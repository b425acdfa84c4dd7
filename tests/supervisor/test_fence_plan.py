"""Unit tests of the fence's pure plan (mcphost/supervisor/fence.py `plan`) and its probe."""

from __future__ import annotations

import pytest

from mcphost.supervisor import fence
from mcphost.supervisor.fence import FencePlan, Support, plan

STATE = "/var/lib/mcphost"
HOME = f"{STATE}/agents/a1"
SOCKETS = (f"{STATE}/run/center.sock", f"{STATE}/run/relay.sock")


def test_the_state_is_covered_and_only_the_home_and_attach_sockets_come_back() -> None:
    got = plan(
        state_dir=STATE, home=HOME, sockets=SOCKETS, secrets=("/etc/mcphost/token", "/etc/f.toml")
    )
    assert set(got.covers) == {"/tmp", "/var/tmp", STATE, "/dev/shm"}
    assert set(got.keeps) == {HOME, *SOCKETS}
    assert got.blanks == ("/etc/mcphost/token", "/etc/f.toml")  # outside every cover
    assert got.writable[:4] == (HOME, "/tmp", "/var/tmp", "/dev/shm")
    assert "/dev/null" in got.writable and STATE not in got.writable


def test_a_state_under_tmp_is_hidden_by_the_private_tmp_and_secrets_there_need_no_blank() -> None:
    state = "/tmp/sv"
    got = plan(
        state_dir=state,
        home=f"{state}/agents/a1",
        sockets=(f"{state}/run/center.sock",),
        secrets=("/tmp/base/token", f"{state}/token"),
        given=("/tmp/homes/claude", f"{state}/agents/other"),  # the latter: not the agent's
    )
    assert got.covers == ("/tmp", "/dev/shm", "/var/tmp")
    assert set(got.keeps) == {f"{state}/agents/a1", f"{state}/run/center.sock", "/tmp/homes/claude"}
    assert got.blanks == ()
    assert f"{state}/agents/other" not in got.writable
    assert "/tmp/homes/claude" in got.writable


def test_a_secret_inside_a_kept_tree_is_blanked_and_hidden_dirs_are_private() -> None:
    got = plan(
        state_dir=STATE,
        home=HOME,
        sockets=(),
        secrets=(f"{HOME}/token",),
        hidden=("/run/user/1000",),
    )
    assert got.blanks == (f"{HOME}/token",)
    assert "/run/user/1000" in got.covers and "/run/user/1000" in got.writable


def test_a_home_outside_the_state_is_refused() -> None:
    with pytest.raises(ValueError):
        plan(state_dir=STATE, home="/home/a", sockets=(), secrets=())
    with pytest.raises(ValueError):
        plan(state_dir=STATE, home=STATE, sockets=(), secrets=())


def test_the_plan_round_trips_through_the_gate_message() -> None:
    got = plan(state_dir=STATE, home=HOME, sockets=SOCKETS, secrets=("/t",))
    assert FencePlan.from_json(got.to_json()) == got
    message = fence.Fence(got, 7).message()
    assert message.endswith(b"\n") and b"/t" in message


def test_what_is_missing_is_named() -> None:
    assert Support(7, True).missing() is None
    assert "Landlock ABI >= 6" in (Support(4, True).missing() or "")
    assert "namespaces (EPERM)" in (Support(7, False, "EPERM").missing() or "")
    assert Support(0, False, "x").describe().startswith("unavailable:")


def test_the_supervisors_own_programs_come_back_read_only_where_a_cover_hides_them() -> None:
    # a checkout (and its venv) under /tmp, as a clean clone in CI is: the agent's pump and
    # interpreter must stay reachable behind its private /tmp, and never writable
    got = plan(
        state_dir=STATE,
        home=HOME,
        sockets=SOCKETS,
        secrets=(),
        runtime=("/tmp/cc/.venv", "/usr", "/tmp/cc", STATE, f"{STATE}/agents"),
    )
    assert "/tmp/cc" in got.keeps and "/tmp/cc/.venv" not in got.keeps  # the outermost only
    assert "/usr" not in got.keeps  # nothing covers it
    assert STATE not in got.keeps and f"{STATE}/agents" not in got.keeps  # never the state
    assert got.readonly == ("/tmp/cc",)  # the private /tmp is writable: the tree is bound read-only
    assert HOME not in got.readonly
    assert fence.FencePlan.from_json(got.to_json()) == got
