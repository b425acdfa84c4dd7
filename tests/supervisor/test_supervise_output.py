"""Black-box: what a real `mcphost supervise` writes for people and for machines (issue 34).

On a terminal (its stderr a pseudo-terminal) it writes readable lines (local time, level, event,
agent, `key=value`); to a pipe, JSON lines; `--log-format` overrides either way. Its first line
(`supervisor.started`) names the fleet file, the state directory, the control socket, the page's
URL, the metrics URL and the number of agents, in both forms; its journal
(`<state>/logs/supervisor.log`) is JSON whatever the flag. `mcphost ctl logs --supervisor`
prints that journal readably on a terminal, as JSON lines to a pipe or with `--json`.
"""

from __future__ import annotations

import json
import os
import pty
import re
import resource
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mcphost.testing.devcenter import DevCenter
from tests.supervisor.supervise_harness import Supervised
from tests.waiting import until

# `HH:MM:SS level event ...`: the readable line
TEXT_LINE = re.compile(r"^\d\d:\d\d:\d\d (debug|info |warning|error|critical) \S")
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _fleet(sv: Supervised) -> None:
    sv.write_fleet([{"id": "alpha", "command": sv.standin()}])
    with sv.fleet.open("a") as fleet:
        fleet.write('\n[page]\nlisten = "127.0.0.1:0"\n\n[metrics]\nlisten = "127.0.0.1:0"\n')


class Output:
    """A supervisor's stderr as it arrives, through a pseudo-terminal or a pipe."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.text = ""
        os.set_blocking(fd, False)

    def read(self) -> str:
        try:
            while chunk := os.read(self.fd, 65536):
                self.text += chunk.decode(errors="replace")
        except BlockingIOError:
            pass
        except OSError:  # EIO: the terminal's other side closed
            pass
        return self.text

    def wait(self, done: Callable[[str], bool], what: str) -> str:
        return until(lambda: done(self.read()) and self.text, 60, what)

    def lines(self) -> list[str]:
        return [ESCAPE.sub("", line) for line in self.read().replace("\r\n", "\n").splitlines()]


def _as_from_a_shell() -> None:
    """A soft descriptor limit below the hard one, as a login shell's (the supervisor raises it
    at start: that must not put a line before its first)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))


@pytest.fixture
def started(
    request: pytest.FixtureRequest, tmp_path: Path, center: DevCenter
) -> Iterator[tuple[Supervised, Output]]:
    """`mcphost supervise` with its stderr on a pseudo-terminal ("tty") or a pipe ("pipe"),
    and the flags given (`request.param`: (where, flags)), running until the test ends."""
    where, flags = request.param
    sv = Supervised(tmp_path, center)
    sv.extra_env["MCPHOST_LOG_LEVEL"] = "info"  # an operator's default (the harness: debug)
    _fleet(sv)
    if where == "tty":
        leader, follower = pty.openpty()
    else:
        leader, follower = os.pipe()
    try:
        sv.proc = subprocess.Popen(
            [*sv.argv(), *flags],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=follower,
            env=sv.env(),
            preexec_fn=_as_from_a_shell,
        )
        os.close(follower)
        out = Output(leader)
        out.wait(lambda text: "supervisor.ready" in text, "the supervisor ready")
        yield sv, out
    finally:
        sv.close()
        os.close(leader)


def _started_line(lines: list[str]) -> str:
    (line,) = [line for line in lines if "supervisor.started" in line]
    return line


@pytest.mark.parametrize(
    "started", [("tty", []), ("pipe", ["--log-format", "text"])], indirect=True, ids=str
)
def test_on_a_terminal_or_asked_it_writes_readable_lines_first_where_everything_is(
    started: tuple[Supervised, Output],
) -> None:
    sv, out = started
    lines = [line for line in out.lines() if line]
    assert lines and all(TEXT_LINE.match(line) for line in lines), lines
    assert not any(line.lstrip().startswith("{") for line in lines), lines
    started_line = _started_line(lines)
    # the first line, but for a warning that the machine gives no limits (found: a debug line)
    head = [line for line in lines if not re.search(r" warning supervisor\.limits ", line)]
    assert head[0] == started_line, lines
    pattern = (
        r"^\d\d:\d\d:\d\d info  supervisor\.started "
        rf"fleet={re.escape(str(sv.fleet))} state={re.escape(str(sv.state))} "
        rf"control={re.escape(str(sv.state))}/control\.sock "
        r"page=http://127\.0\.0\.1:(\d+)/ metrics=http://127\.0\.0\.1:(\d+)/metrics "
        r"agents=1 pid=\d+$"
    )
    match = re.match(pattern, started_line)
    assert match, started_line
    # the addresses it names answer: the page and the metrics endpoint are there
    page, metrics = (int(port) for port in match.groups())
    assert page != 0 and metrics != 0
    # an agent's line names the agent after the event
    spawned = [line for line in lines if "supervisor.agent_spawned" in line]
    assert spawned and re.search(r"supervisor\.agent_spawned  alpha pid=\d+", spawned[0]), lines
    # the journal stays JSON, with the same first event and its fields
    journal = (sv.state / "logs" / "supervisor.log").read_text().splitlines()
    records = [json.loads(line) for line in journal]
    (first_record,) = [r for r in records if r["event"] == "supervisor.started"]
    assert first_record["page"] == f"http://127.0.0.1:{page}/", first_record
    assert first_record["metrics"] == f"http://127.0.0.1:{metrics}/metrics", first_record


@pytest.mark.parametrize(
    "started", [("pipe", []), ("tty", ["--log-format", "json"])], indirect=True, ids=str
)
def test_to_a_pipe_or_asked_it_writes_json_lines_first_where_everything_is(
    started: tuple[Supervised, Output],
) -> None:
    sv, out = started
    lines = [line for line in out.lines() if line]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    first = next(r for r in records if r["event"] != "supervisor.limits")  # as above
    assert first["event"] == "supervisor.started", records
    assert isinstance(first["ts"], float) and first["level"] == "info"
    assert first["fleet"] == str(sv.fleet) and first["state"] == str(sv.state)
    assert first["control"] == str(sv.state / "control.sock")
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", first["page"]), first
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", first["metrics"]), first
    assert first["agents"] == 1 and first["pid"] == sv.proc.pid  # type: ignore[union-attr]


def _ctl_logs_on_a_terminal(sv: Supervised, *flags: str) -> list[str]:
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcphost", "ctl", "--state", str(sv.state), "logs",
         "--supervisor", "-n", "1000", *flags],
        stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.PIPE, env=sv.env(),
    )  # fmt: skip
    os.close(follower)
    try:
        out = Output(leader)
        until(lambda: out.read() is not None and proc.poll() is not None, 60, "ctl logs to end")
        out.read()
        assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
        return [line for line in out.lines() if line]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)


@pytest.mark.parametrize("started", [("pipe", [])], indirect=True, ids=str)
def test_ctl_logs_supervisor_reads_on_a_terminal_and_gives_json_when_asked(
    started: tuple[Supervised, Output],
) -> None:
    sv, _ = started
    text = _ctl_logs_on_a_terminal(sv)
    assert text and all(TEXT_LINE.match(line) for line in text), text
    assert _started_line(text).startswith(tuple(f"{h:02d}:" for h in range(24)))
    assert f"control={sv.state}/control.sock" in _started_line(text)
    for raw in (
        _ctl_logs_on_a_terminal(sv, "--json"),
        sv.ctl("logs", "--supervisor", "-n", "1000").stdout.splitlines(),  # a pipe
    ):
        names = [json.loads(line)["event"] for line in raw]  # every line is one JSON object
        assert next(n for n in names if n != "supervisor.limits") == "supervisor.started", raw
    text_to_pipe = sv.ctl("logs", "--supervisor", "--log-format", "text").stdout.splitlines()
    assert text_to_pipe and all(TEXT_LINE.match(line) for line in text_to_pipe), text_to_pipe
    agent = sv.ctl("logs", "alpha", "--json", check=False)
    assert agent.returncode == 2 and "for --supervisor" in agent.stderr, agent.stderr
