"""Black-box: what `mcphost supervise` and `mcphost supervise --check` say at load about what the
fleet's agents will reach (mcphost/supervisor/reach.py), through the real processes.

- A state directory too long for its sockets: one stderr line naming it and the limit, exit 2,
  from `--check` and from `supervise` alike, and nothing created; the longest one allowed runs
  an agent that attaches to both surfaces.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from mcphost.testing.devcenter import DevCenter
from mcphost.unixsock import SUN_PATH_MAX
from tests.supervisor.supervise_harness import STATE_DIRS, Supervised, standin
from tests.waiting import until

# <state>/run/center.sock: the longest socket reached by its path as it is
LONGEST_SUFFIX = len("/run/center.sock")


def state_of_length(length: int) -> Path:
    """A path of exactly `length` bytes (not created) in a fresh directory under /tmp, removed
    when the test process ends."""
    base = Path(tempfile.mkdtemp(prefix="mcphost-len-"))
    STATE_DIRS.append(base)
    pad = length - len(str(base)) - 1
    assert pad > 0, (base, length)
    return base / ("s" * pad)


def check(sv: Supervised) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*sv.argv(), "--check"], capture_output=True, text=True, env=sv.env(), timeout=120
    )


def test_a_state_directory_too_long_for_its_sockets_is_refused_in_one_line(
    supervised: Supervised,
) -> None:
    limit = SUN_PATH_MAX - LONGEST_SUFFIX
    supervised.state = state_of_length(limit + 1)
    supervised.write_fleet([{"id": "agent-1", "command": standin("--hold")}])
    for done in (check(supervised), supervised.run_to_exit()):
        assert done.returncode == 2, (done.returncode, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert str(supervised.state) in lines[0] and "--state" in lines[0], lines[0]
        assert f"at most {limit} bytes" in lines[0] and f"{SUN_PATH_MAX} bytes" in lines[0]
        assert "Traceback" not in done.stderr and "Unclosed" not in done.stderr
        assert done.stdout == ""
        assert not supervised.state.exists()  # nothing was created


def test_the_longest_state_directory_allowed_runs_an_agent_on_both_surfaces(
    supervised: Supervised, center: DevCenter
) -> None:
    supervised.state = state_of_length(SUN_PATH_MAX - LONGEST_SUFFIX)
    supervised.write_fleet([{"id": "agent-1", "bundle": "long", "command": standin("--hold")}])
    done = check(supervised)
    assert "--state" not in done.stderr, done.stderr
    supervised.start()
    supervised.wait_running("agent-1")
    calls = until(
        lambda: len(supervised.calls("agent-1")) >= 2 and supervised.calls("agent-1"),
        60,
        "a call on each surface",
    )
    assert {call["server"] for call in calls} == {"agent-center", "agentmux"}, calls
    assert all(call["ok"] for call in calls), calls
    assert len(os.fsencode(supervised.state / "run" / "center.sock")) == SUN_PATH_MAX
