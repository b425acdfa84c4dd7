"""Unit tests of what the supervisor works out at load about what its agents will reach
(mcphost/supervisor/reach.py): the state directory's room for its sockets."""

from __future__ import annotations

import os

from mcphost.supervisor import reach
from mcphost.unixsock import SUN_PATH_MAX, fits

ROOM = SUN_PATH_MAX - len("/run/center.sock")  # the longest socket reached by its path


def test_the_state_directory_may_be_as_long_as_its_longest_socket_allows() -> None:
    at_limit = "/" + "s" * (ROOM - 1)
    assert len(at_limit) == ROOM
    assert reach.state_problem(at_limit) is None
    assert all(fits(path) for path in reach.socket_paths(at_limit))
    longest = max(reach.socket_paths(at_limit), key=len)
    assert longest == f"{at_limit}/run/center.sock" and len(longest) == SUN_PATH_MAX


def test_one_byte_more_names_the_limit_and_the_socket() -> None:
    too_long = "/" + "s" * ROOM
    problem = reach.state_problem(too_long)
    assert problem is not None
    assert f"at most {ROOM} bytes (it has {ROOM + 1})" in problem
    assert f"<state>/run/center.sock fits the {SUN_PATH_MAX} bytes" in problem
    assert f"(it would have {SUN_PATH_MAX + 1})" in problem


def test_bytes_count_not_characters() -> None:
    state = "/" + "é" * (ROOM // 2 + 1)  # two bytes each
    assert len(state) <= ROOM < len(os.fsencode(state))
    assert reach.state_problem(state) is not None


def test_an_empty_or_relative_state_is_refused() -> None:
    for state in ("", "relative/state"):
        assert reach.state_problem(state) == "an absolute path: the supervisor's state directory"


def test_the_sockets_the_supervisor_binds_are_the_ones_checked() -> None:
    points = reach.attach_points("/var/lib/mcphost")
    assert set(reach.socket_paths("/var/lib/mcphost")) == {
        "/var/lib/mcphost/control.sock",
        points.center_socket,
        points.relay_socket,
    }
