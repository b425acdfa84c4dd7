"""Black-box: `mcphost ctl logs` does not hand an agent's terminal escapes to the operator's
terminal (issue #18, item 15).

An agent under a real `mcphost supervise` prints an OSC 52 clipboard write and a screen clear
(`ESC [2J`). `ctl logs` on a real terminal (a pty, `pty.openpty`) shows them escaped (`^[`),
and `--raw` there writes them as they are; through a pipe the text is as the agent wrote it,
and `--escape` escapes it there too.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys

from tests.supervisor.supervise_harness import Supervised, inline
from tests.waiting import until

OSC52 = "\x1b]52;c;ZXZpbA==\x07"  # set the clipboard to "evil"
CLEAR = "\x1b[2J"
AGENT = (
    "import sys, time\n"
    f"sys.stdout.write('before' + {OSC52!r} + {CLEAR!r} + 'after\\n')\n"
    "sys.stdout.flush()\n"
    "time.sleep(3600)\n"
)


def through_a_terminal(sv: Supervised, *flags: str) -> bytes:
    """What `ctl logs A` writes to a pty (its stdout is a terminal)."""
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mcphost", "ctl", "--state", str(sv.state), "logs", "A",
             *flags],
            stdin=subprocess.DEVNULL, stdout=terminal, stderr=subprocess.PIPE, env=sv.env(),
        )  # fmt: skip
        os.close(terminal)
        terminal = -1
        out = b""
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the terminal's last writer closed it
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else None
        return out
    finally:
        os.close(controller)
        if terminal >= 0:
            os.close(terminal)


def test_ctl_logs_escapes_an_agents_control_characters_on_a_terminal_only(
    supervised: Supervised,
) -> None:
    sv = supervised
    sv.write_fleet([{"id": "A", "command": inline(AGENT)}])
    sv.start()
    until(lambda: "after" in sv.ctl("logs", "A").stdout, 60, "A's output in its log")

    shown = through_a_terminal(sv)
    assert b"before^[]52;c;ZXZpbA==^G^[[2Jafter" in shown, shown
    assert b"\x1b" not in shown and b"\x07" not in shown, shown

    raw = through_a_terminal(sv, "--raw")
    assert f"before{OSC52}{CLEAR}after".encode() in raw, raw

    piped = sv.ctl("logs", "A").stdout
    assert f"before{OSC52}{CLEAR}after\n" in piped, piped

    forced = sv.ctl("logs", "A", "--escape").stdout
    assert "before^[]52;c;ZXZpbA==^G^[[2Jafter\n" in forced, forced
    assert "\x1b" not in forced and "\x07" not in forced, forced
