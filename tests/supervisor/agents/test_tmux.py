"""Black-box: a tmux agent's pane as `mcphost ctl logs` shows it, through a real supervisor.

A pane that died on an error: the error is in the last lines of `ctl logs` (the blank screen
between it and tmux's "Pane is dead" line is dropped), and a line longer than the pane is one
line, never cut mid-word at the pane's width.
"""

from __future__ import annotations

import shutil

import pytest

from tests.supervisor.supervise_harness import Supervised, inline
from tests.waiting import until

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

ERROR = "Error: " + " ".join(f"word{n}" for n in range(40))  # far wider than the 80-column pane
FAIL = f"import sys\nprint({ERROR!r}, flush=True)\nsys.exit(3)\n"


def test_a_dead_pane_s_error_shows_in_the_last_lines_unwrapped(supervised: Supervised) -> None:
    supervised.write_fleet(
        [{"id": "pane", "runner": "tmux", "command": inline(FAIL)}], restart="never"
    )
    supervised.start()
    until(lambda: supervised.status()["pane"]["state"] == "failed", 60, "the pane's agent failed")
    logs = until(
        lambda: "Pane is dead" in (out := supervised.ctl("logs", "pane", "-n", "3").stdout) and out,
        60,
        "the pane's last screen in the log",
    )
    lines = logs.splitlines()
    assert ERROR in lines, logs
    assert lines[-1].startswith("Pane is dead") and lines[-2] == ERROR, logs
