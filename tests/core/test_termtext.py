"""`mcphost.termtext`: an event record as one readable line (the supervisor's stderr on a terminal,
`ctl logs --supervisor` there), and `neutralise`, which makes untrusted text inert for a terminal.
Pure: the time zone is given (UTC here)."""

from __future__ import annotations

import json
import re
from datetime import UTC

from hypothesis import given
from hypothesis import strategies as st

from mcphost.termtext import event_line, neutralise, readable, value_text
from tests.thorough import examples

TS = 1_765_143_602.25  # 2025-12-07 21:40:02.25 UTC
# What may never reach a terminal from a log line: C0 (but TAB), DEL, C1, a lone surrogate; and
# no LF either (one record, one line)
FORBIDDEN = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\ud800-\udfff]")


def test_a_record_reads_time_level_event_agent_then_its_fields() -> None:
    record = {
        "ts": TS,
        "level": "info",
        "event": "agent.started",
        "agent_id": "alpha",
        "generation": 3,
        "pid": 1234,
    }
    assert event_line(record, UTC) == "21:40:02 info  agent.started  alpha generation=3 pid=1234"


def test_a_record_without_an_agent_and_the_values_of_every_kind() -> None:
    record = {
        "ts": TS,
        "level": "warning",
        "event": "supervisor.started",
        "fleet": "/etc/mcphost/fleet.toml",
        "page": "http://127.0.0.1:8080/",
        "agents": 3,
        "delay": 0.25,
        "restarted": True,
        "url": None,
        "added": ["a", "b"],
        "message": "two words",
        "empty": "",
    }
    assert event_line(record, UTC) == (
        "21:40:02 warning supervisor.started fleet=/etc/mcphost/fleet.toml"
        " page=http://127.0.0.1:8080/ agents=3 delay=0.25 restarted=true url=null"
        ' added=["a","b"] message="two words" empty=""'
    )


def test_a_value_cannot_fake_a_field_or_a_line() -> None:
    """A space, `=`, a quote or a newline in a value quotes it: the fields a reader sees are the
    record's, and one record is one line."""
    line = event_line(
        {"ts": TS, "level": "info", "event": "x", "reason": "ok pid=1\n21:40:03 error forged"},
        UTC,
    )
    assert line == '21:40:02 info  x reason="ok pid=1\\n21:40:03 error forged"'
    assert "\n" not in line


def test_escape_sequences_anywhere_are_shown_not_acted_on() -> None:
    """An OSC 52 clipboard write, a screen clear, a CSI as one C1 byte, a carriage return and a
    bell, in a value, a key, the event and the agent: all shown visibly."""
    hostile = "\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[2J\x9b31m\r\x7f"
    line = event_line(
        {
            "ts": TS,
            "level": "error\x1b[0m",
            "event": "log" + hostile,
            "agent_id": "a" + hostile,
            "key" + hostile: hostile,
            "message": hostile,
        },
        UTC,
    )
    assert not FORBIDDEN.search(line), line
    assert "\\u001b]52;c;ZWNobyBwd25lZA==\\u0007" in line  # JSON-quoted value: its escapes
    assert "<U+009B>31m" in line and "^?" in line
    assert line.startswith("21:40:02 error^[[0m log^[]52;c;")


def test_a_record_without_a_time_or_with_a_bad_one_still_makes_a_line() -> None:
    assert event_line({"event": "x"}, UTC) == "--:--:-- -     x"
    assert event_line({"ts": "noon", "level": "info", "event": "x"}, UTC).startswith("--:--:--")
    assert event_line({"ts": 1e300, "level": "info", "event": "x"}, UTC).startswith("--:--:--")


@given(
    st.dictionaries(
        st.text(max_size=12),
        st.one_of(st.text(), st.integers(), st.floats(), st.none(), st.lists(st.text())),
        max_size=6,
    ),
    st.text(),
    st.text(),
)
@examples(500, 100)
def test_no_record_puts_a_control_character_or_a_newline_on_the_terminal(
    fields: dict[str, object], event: str, agent: str
) -> None:
    record = {"ts": TS, "level": "info", "event": event, "agent_id": agent, **fields}
    line = event_line(record, UTC)
    assert not FORBIDDEN.search(line), line


@given(st.text())
@examples(500, 100)
def test_a_bare_value_is_the_value_and_a_quoted_one_reads_back_as_json(text: str) -> None:
    """Only DEL, C1 and lone surrogates (which JSON leaves as they are) are changed further."""
    shown = value_text(text)
    if not shown.startswith('"'):
        assert shown == text and text and not re.search(r"[\s\"'=\\]", text)
    elif not re.search(r"[\x7f-\x9f\ud800-\udfff]", text):
        assert json.loads(shown) == text


def test_neutralise_keeps_newline_and_tab_and_is_idempotent() -> None:
    text = "a\tb\nc\x1b[201~d\x00\x9b\ud800"
    once = neutralise(text)
    assert once == "a\tb\nc^[[201~d^@<U+009B>\ufffd"
    assert neutralise(once) == once


def test_readable_turns_a_stream_of_json_lines_split_anywhere_into_lines() -> None:
    """`ctl logs --supervisor` on a terminal: the journal's lines arrive in chunks cut anywhere;
    a line that is not an event object (a torn first line, a stranger's) is shown neutralised."""
    record = {"ts": TS, "level": "info", "event": "agent.started", "agent_id": "alpha"}
    stream = json.dumps(record) + "\n" + "not json \x1b[2J\n" + json.dumps(record)
    chunks = [stream[i : i + 7] for i in range(0, len(stream), 7)]
    assert list(readable(chunks, UTC)) == [
        "21:40:02 info  agent.started  alpha\n",
        "not json ^[[2J\n",
        "21:40:02 info  agent.started  alpha\n",  # the last line had no newline
    ]
    assert list(readable(["[1, 2]\n", "\r\n"], UTC)) == ["[1, 2]\n", "^M\n"]
