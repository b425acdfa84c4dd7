"""Text for a terminal: untrusted text made inert, and an event record as a line for people.

Owns: `neutralise` (every control character but LF and TAB shown visibly: C0 as `^@`..`^_`,
ESC as `^[`, DEL as `^?`, C1 as `<U+0080>`..`<U+009F>`, a lone surrogate as U+FFFD), the one
function that makes text safe for a terminal or a tmux pane (the relay's `send` and `look`
use it through relay/envelope.py), and `event_line`, the readable form of one event record
(events.py's JSON object: `ts`, `level`, `event`, then its fields), as `mcphost supervise`
writes it to a terminal and `mcphost ctl logs --supervisor` prints it there (`readable`: a stream
of JSON lines, as the journal keeps them, turned into such lines):

    21:40:02 info  agent.started  alpha gen=3 pid=1234

the local time (`HH:MM:SS`), the level, the event, the agent (`agent_id`) when the record names
one, then every other field as `key=value` in the record's order. A string value is written
bare when it is one plain word, else JSON-quoted (so a space, `=`, a quote or a newline inside it
cannot fake another field or another line); other values as compact JSON.

Why hand-written: a logging library's console renderer (structlog's, rich's) would be a new
dependency for one line's layout, and neither neutralises C1 controls. Everything here is pure
(the time zone is a parameter) and standard-library only: `mcphost ctl` imports it and must
start fast (no logging, no pydantic).
Must never: let a record's bytes reach the terminal as anything but visible text (an escape
sequence, a carriage return or a newline in any field, key or event name is shown, never acted
on), or drop a field (a person reading the line sees what the JSON holds, `ts` as a time).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, tzinfo
from typing import Any

# Every control but LF (0x0a) and TAB (0x09): C0, DEL, C1; and lone surrogates (not text).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
# A value written bare: no space, quote, `=`, backslash or control; anything else is quoted.
_BARE = re.compile(r"[^\s\"'=\\\x00-\x1f\x7f-\x9f\ud800-\udfff]+")
LEVEL_WIDTH = 5  # "info ", "error", "debug"; "warning" and "critical" run over by a few
_FIRST = ("ts", "level", "event", "agent_id")  # the head of the line, not repeated as k=v


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return "^" + chr(code + 0x40)  # ESC -> ^[, 0x1c -> ^\, NUL -> ^@
    if code == 0x7F:
        return "^?"
    if code <= 0x9F:
        return f"<U+{code:04X}>"
    return "\ufffd"


def neutralise(text: str) -> str:
    """`text` with every control character but LF and TAB shown visibly (module docstring).

    Idempotent: its output holds no control character, so a second pass changes nothing.
    """
    return _CONTROL.sub(_visible, text)


def _word(text: str) -> str:
    """A head word (event, level, agent): one visible word on one line."""
    return neutralise(text.replace("\n", "^J").replace("\t", "^I")) or "-"


def value_text(value: Any) -> str:
    """One field's value as the line shows it: a plain word bare, else JSON (module doc)."""
    if isinstance(value, str):
        if _BARE.fullmatch(value):
            return value
        text = json.dumps(value, ensure_ascii=False)
    elif isinstance(value, bool) or value is None or isinstance(value, int):
        text = json.dumps(value)
    elif isinstance(value, float):
        text = f"{value:g}" if value == value and abs(value) != float("inf") else str(value)
    else:
        text = json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))
    # json.dumps escapes C0 and the newline; DEL, C1 and lone surrogates it leaves as they are
    return neutralise(text)


def clock(ts: Any, tz: tzinfo | None = None) -> str:
    """`ts` (epoch seconds) as `HH:MM:SS` in `tz` (None: the local zone); `--:--:--` when it is
    not a time."""
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        return "--:--:--"
    try:
        return datetime.fromtimestamp(ts, tz).strftime("%H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return "--:--:--"


def event_line(record: Mapping[str, Any], tz: tzinfo | None = None) -> str:
    """One event record as one readable line, without its newline (module doc)."""
    level = _word(str(record.get("level", "")))
    parts = [
        clock(record.get("ts"), tz),
        f"{level:<{LEVEL_WIDTH}}",
        _word(str(record.get("event", ""))),
    ]
    agent = record.get("agent_id")
    if isinstance(agent, str):
        parts[-1] += " "  # two spaces between the event and the agent, as between level and event
        parts.append(_word(agent))
    for key, value in record.items():
        if key in _FIRST and (key != "agent_id" or isinstance(value, str)):
            continue
        name = str(key)
        name = name if _BARE.fullmatch(name) else neutralise(json.dumps(name, ensure_ascii=False))
        parts.append(f"{name}={value_text(value)}")
    return " ".join(parts)


def readable(chunks: Iterable[str], tz: tzinfo | None = None) -> Iterator[str]:
    """A stream of event lines (JSON, one object a line, in chunks split anywhere) as readable
    lines, each with its newline; a line that is not an event object is shown neutralised, as
    it is. A last line without its newline is shown at the end."""
    held = ""
    for chunk in chunks:
        *lines, held = (held + chunk).split("\n")
        for line in lines:
            yield _readable_line(line, tz) + "\n"
    if held:
        yield _readable_line(held, tz) + "\n"


def _readable_line(line: str, tz: tzinfo | None) -> str:
    try:
        record = json.loads(line)
    except ValueError:
        record = None
    if isinstance(record, dict):
        return event_line(record, tz)
    return neutralise(line)
