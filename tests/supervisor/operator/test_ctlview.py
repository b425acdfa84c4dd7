"""What `mcphost ctl` prints (ctlview.py), pure: the status table and its cells, fitted to a
terminal's width, the order of `--sort`, the one-line answers, and an agent's log text escaped
for a terminal (hypothesis: no control character but LF and TAB reaches it, however a follow
chunks the text). The command that prints them is tests/supervisor/operator/test_ctl.py's.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcphost.supervisor.operator.ctlview import (
    COLUMNS,
    describe_result,
    escape_controls,
    escaped,
    human_duration,
    sort_agents,
    status_table,
)

# -- the status table ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (-5, "0s"), (45.9, "45s"), (192, "3m12s"), (3600, "1h00m"), (7500, "2h05m"),
     (273600, "3d04h")],
)  # fmt: skip
def test_human_duration(seconds: float, text: str) -> None:
    assert human_duration(seconds) == text


def test_status_table_of_nothing_and_of_odd_values() -> None:
    assert status_table([], 0).splitlines() == ["  ".join(COLUMNS)]
    row = status_table([{"agent_id": "a", "state": "stopped", "started_at": 5}], 100)
    assert row.splitlines()[1].split() == ["a", "stopped", *["-"] * (len(COLUMNS) - 2)]
    reason_only = status_table([{"agent_id": "a", "last_reason": "its home could not be"}], 0)
    assert reason_only.splitlines()[1].split()[:8] == ["a", *["-"] * 7]
    assert reason_only.splitlines()[1].endswith("  its home could not be")
    assert describe_result("stop", "a", None) == "stop: done"
    assert describe_result("start", "a", {"agent_id": "a", "already": "running"}) == (
        "a: already running"
    )


@pytest.mark.parametrize(
    "level", ["bwrap+landlock7", "bwrap", "bwrap (no nesting)", "none"]
)  # fmt: skip
def test_status_table_shows_each_agents_fence_level_within_80_columns(level: str) -> None:
    """The FENCE column is the agent's `sandbox` (its fence level, probe.py `Support.level()`,
    or `none`); a usual fleet's rows, 7-digit pids included, stay within 80 columns."""
    now = 1000.0
    rows = [
        {"agent_id": f"agent-{n}", "state": "running", "pid": 4194304, "generation": 12,
         "restarts": 11, "started_at": now - 7500, "sessions": 2, "sandbox": level}
        for n in range(1, 4)
    ]  # fmt: skip
    rows.append({"agent_id": "agent-9", "state": "failed", "sandbox": None, "last_reason": "x"})
    lines = status_table(rows, now, width=80).splitlines()
    fence = lines[0].index("FENCE")
    assert [line[fence:].split("  ")[0] for line in lines[1:4]] == [level] * 3, lines
    assert lines[4][fence:].startswith("- "), lines  # never started: no fence yet
    assert max(len(line) for line in lines) <= 80, lines


def _usage_row(n: int, mem: int, cpu: float, **extra: object) -> dict[str, object]:
    usage = {
        "memory_current_bytes": mem, "memory_peak_bytes": mem * 2, "cpu_seconds": cpu,
        "processes": 12, "center_calls": 1234, "center_errors": 3, "relay_queue_depth": 0,
    }  # fmt: skip
    return {
        "agent_id": f"agent-{n}", "state": "running", "pid": 4194304, "generation": 12,
        "restarts": 11, "started_at": 0.0, "sessions": 2, "sandbox": "bwrap (no nesting)",
        "last_exit": "signal 9", "last_reason": "killed by SIGKILL", "usage": usage, **extra,
    }  # fmt: skip


def test_status_table_with_usage_fits_80_columns_and_keeps_mem_cpu_procs() -> None:
    rows = [_usage_row(n, 123_456_789 * n, 1234.5 * n) for n in range(1, 4)]
    rows.append({"agent_id": "a-long-agent-name-of-forty-characters-xx", "state": "failed"})
    wide = status_table(rows, 7500.0).splitlines()
    assert wide[0].split() == list(COLUMNS) and max(len(line) for line in wide) > 80
    assert wide[1].split()[7:13] == ["117M", "235M", "20m34s", "12", "1234/3", "0"]
    lines = status_table(rows, 7500.0, width=80).splitlines()
    assert max(len(line) for line in lines) <= 80, lines
    header = lines[0].split()
    assert {"AGENT", "STATE", "MEM", "CPU", "PROCS", "EXIT"} <= set(header), header
    cells = dict(zip(header, lines[3].split(), strict=False))
    assert (cells["MEM"], cells["CPU"], cells["PROCS"]) == ("353M", "1h01m", "12"), lines
    assert lines[4].startswith("a-long-agent-na~ "), lines  # a long name is cut, marked `~`
    # a wider terminal shows more of the same columns, in the same order
    wider = status_table(rows, 7500.0, width=120).splitlines()
    assert max(len(line) for line in wider) <= 120
    assert len(wider[0].split()) > len(header)


def _fleet_row(n: int, state: str, **usage: object) -> dict[str, object]:
    """A row as a supervisor with cgroup limits sends it: the default limits on every agent,
    the same fence, the limit hits counted (`ctl status --json`)."""
    row = _usage_row(n, (50 + n) << 20, 3.0 * n, state=state, sandbox="bwrap+landlock7", pid=n)
    row["limits"] = {"memory_max": 64 << 20, "pids_max": 512, "cpu_weight": 100}
    row["usage"] = {**row["usage"], "oom_kills": 0, "pids_limit_hits": 0, **usage}  # type: ignore[dict-item]
    return row


def test_narrow_table_drops_the_columns_that_repeat_before_it_cuts_state() -> None:
    """Issue #34: at 80 columns the table cut STATE (`running, ~`) and kept FENCE, the same on
    every row. Now the columns whose cell repeats on every row go first, said once below the
    table; STATE is whole at 80 columns; at 200 every column is there."""
    rows = [
        _fleet_row(1, "running, acp busy"),
        _fleet_row(2, "backoff", oom_kills=7),
        _fleet_row(3, "running", pids_limit_hits=819),
    ]
    lines = status_table(rows, 100.0, width=80).splitlines()
    assert max(len(line) for line in lines) <= 80, lines
    header = lines[0].split()
    assert "FENCE" not in header and "MEMMAX" not in header and "PIDMAX" not in header, lines
    assert [line[lines[0].index("STATE") :].split("  ")[0] for line in lines[1:4]] == [
        "running, acp busy",
        "backoff",
        "running",
    ], lines  # STATE whole: nothing cut
    assert all("~" not in line.split("signal")[0] for line in lines[1:4]), lines
    oom, hits = lines[0].index("OOM"), lines[0].index("PIDHIT")
    assert [line[oom:].split()[0] for line in lines[1:4]] == ["0", "7", "0"], lines
    assert [line[hits:].split()[0] for line in lines[1:4]] == ["0", "0", "819"], lines
    below = " ".join(lines[4:])
    assert below.startswith("same on every row: "), lines
    assert "FENCE bwrap+landlock7" in below and "MEMMAX 64M" in below, lines
    assert "PIDMAX 512" in below, lines
    # at 200 columns: every column, the limits on each row, nothing said below
    wide = status_table(rows, 100.0, width=200).splitlines()
    assert wide[0].split() == list(COLUMNS) and len(wide) == 4, wide
    row = dict(zip(COLUMNS, wide[2].split(), strict=False))
    assert (row["MEMMAX"], row["PIDMAX"], row["OOM"], row["PIDHIT"]) == ("64M", "512", "7", "0")
    # one row: nothing repeats (there is nothing to compare), and no limits: `max`
    alone = {**_fleet_row(1, "running"), "limits": {"memory_max": None, "pids_max": None}}
    one = status_table([alone], 100.0, width=200).splitlines()
    assert dict(zip(COLUMNS, one[1].split(), strict=False))["MEMMAX"] == "max", one


def test_sort_by_cpu_or_mem_puts_the_largest_first_and_the_unknown_last() -> None:
    rows = [
        _usage_row(1, 300, 1.0),
        _usage_row(2, 100, 9.0),
        {"agent_id": "x"},
        _usage_row(3, 200, 5.0),
    ]
    assert [r["agent_id"] for r in sort_agents(rows, "cpu")] == [
        "agent-2",
        "agent-3",
        "agent-1",
        "x",
    ]
    assert [r["agent_id"] for r in sort_agents(rows, "mem")] == [
        "agent-1",
        "agent-3",
        "agent-2",
        "x",
    ]
    assert sort_agents(rows, None) == rows


def test_status_table_shows_a_fenced_current_generation() -> None:
    fence = {"code": "stale_generation", "generation": 3, "center_generation": 7, "at": 1.0}
    fenced = {"agent_id": "a", "state": "running", "generation": 3, "fenced": fence}
    replaced = {**fenced, "generation": 8}  # the fence is history once a newer spawn runs
    lines = status_table([fenced, replaced], 100).splitlines()
    assert lines[1].split()[:4] == ["a", "running,", "fenced", "(stale_generation)"]
    assert lines[2].split()[:2] == ["a", "running"] and "fenced" not in lines[2]


def test_status_table_says_when_an_agent_shares_the_supervisors_uid() -> None:
    """FENCE ends "(shared uid)" for an agent that runs as the supervisor's uid (an
    unprivileged supervisor's, `user = "root"`); an agent of its own uid or of a `user` shows
    the level alone."""
    rows = [
        {"agent_id": f"agent-{n}", "state": "running", "pid": 42, "generation": 1,
         "restarts": 0, "started_at": 990.0, "sessions": 2, "sandbox": "bwrap",
         "identity": identity}
        for n, identity in enumerate(("own", "user", "shared"))
    ]  # fmt: skip
    lines = status_table(rows, 1000.0, width=120).splitlines()
    fence = lines[0].index("FENCE")
    cells = [line[fence:].split("  ")[0] for line in lines[1:]]
    assert cells == ["bwrap", "bwrap", "bwrap (shared uid)"], lines


# -- escaping an agent's output for a terminal -----------------------------------------------------


def _is_control(ch: str) -> bool:
    code = ord(ch)
    return code < 0x20 or 0x7F <= code < 0xA0


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8")), st.lists(st.integers(0, 64)))
def test_escaped_output_holds_no_control_character_but_lf_and_tab(
    text: str, cuts: list[int]
) -> None:
    escaped_text = escape_controls(text)
    assert not [ch for ch in escaped_text if _is_control(ch) and ch not in "\n\t"]
    assert escaped_text.count("\n") == text.count("\n") and escaped_text.count("\t") == text.count(
        "\t"
    )
    # chunked as a follow delivers it: the same text, a CRLF split between chunks included
    chunks, rest = [], text
    for cut in cuts:
        chunks.append(rest[:cut])
        rest = rest[cut:]
    chunks.append(rest)
    assert "".join(escaped(chunks)) == escaped_text


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b]52;c;ZXZpbA==\x07", "^[]52;c;ZXZpbA==^G"),  # OSC 52: a clipboard write
        ("\x1b[2J\x1b[H", "^[[2J^[[H"),  # clear the screen, cursor home
        ("a\r\nb\rc\x7f\x00", "a\nb^Mc^?^@"),  # CRLF is a line end; a lone CR is not
        ("\x9b31m\x85", "M-^[31mM-^E"),  # C1: CSI, NEL
        ("tab\there\n", "tab\there\n"),
        ("héllo ✓", "héllo ✓"),
    ],
)
def test_escape_controls(raw: str, shown: str) -> None:
    assert escape_controls(raw) == shown
