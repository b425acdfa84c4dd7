"""The pane envelope of agentmux's `send` (reference §3.4), and the batching of envelopes.

Owns: the exact bytes an agent sees in its pane for one message, and the grouping of contiguous
envelopes queued to one target into one injected prompt. Everything here is pure: no clock, no
UUID generation, no I/O (the caller passes the message id and the creation time).

The layout (LF line endings, one trailing newline; `<hex>` is the message id without hyphens):

    --agentmux-<hex>
    Message-Id: <message id, hyphenated>
    Date: <created_at, RFC 3339, UTC, milliseconds, "Z">
    From: <display name> <session:<canonical id>>
    To: <display name> <session:<canonical id>>
    Cc: <addr>, <addr>                      (only when the message has co-recipients)
    Subject: <subject>                      (only when set and non-empty)

    --agentmux-<hex>
    Content-Type: text/plain; charset=utf-8

    <body>
    --agentmux-<hex>--

Decisions where the reference is silent (pinned by tests/relay/test_envelope.py):
- A display name falls back to the canonical id; `"` in it becomes `'`. A header value is one
  line: CR and LF in display names and the subject become a space.
- The body keeps its text with CRLF and CR turned into LF; a newline is added before the
  closing boundary only when the body does not already end with one.
- Text, never keys (`neutralise`): the pane receives the envelope as one bracketed paste, and
  tmux does not filter a bracketed-paste end (`ESC [ 2 0 1 ~`) inside it, so whatever followed
  one would arrive as typed keys; and a C0 control acts on a pane in cooked mode even inside a
  paste (`^C`, `^\\`, `^Z`, `^U`, `^D`). So every header value and the body show each control
  visibly instead: C0 and DEL in caret notation (ESC is `^[`, 0x1c is `^\\`, DEL is `^?`), the
  C1 controls U+0080..U+009F as `<U+009B>`, a lone surrogate as U+FFFD. Only newline and tab
  stay. The rendered envelope therefore holds no byte below 0x20 but LF and TAB, no DEL, no C1
  code point, and never the end-of-paste marker (it needs an ESC or a U+009B). `neutralise`
  lives one floor down (mcphost/termtext.py: the supervisor's readable log lines use it too).
- `Date` is `YYYY-MM-DDTHH:MM:SS.mmmZ` (the time converted to UTC); a naive datetime is refused.
- Token estimate (`characters_0_point_3`, the default profile): `ceil(chars * 3 / 10)` in exact
  integer arithmetic (so 10 chars are 3 tokens, not the 4 of IEEE `10 * 0.3`), plus
  `lines // 12`; chars are code points and lines count like Rust's `str::lines` (a final
  newline does not open a line). The `whitespace` profile counts whitespace-separated words,
  plus the same `lines // 12`.
- A batch takes envelopes from the head while the joined text (envelopes separated by one blank
  line, i.e. joined with "\\n" since each ends with a newline) stays within the limit; the head is
  always taken, even alone over the limit: an envelope is never split.

The terminal-outcome receipt (reference §3.4; agentmux's wording): when a queued message ends
any way but `delivered`, the relay sends its coder-backed sender an ordinary envelope from the
relay principal `relay@RELAY` (display name `relay`) to the sender, no Cc, no Subject, whose
body is one line (`receipt_body`):

    Your message <message id> to <target id> was not delivered (<word>). reason_code=<code>: <reason>

`<word>` is `dropped on relay shutdown` for a message dropped at shutdown, else `failed`; the
` reason_code=...` part is there when the outcome has a reason code, the `: <reason>` part when
it has a reason. In the pane the receipt's envelope follows one marker line,
`--- agentmux terminal-outcome receipt ---` (`render_receipt`), so an agent tells a relay notice
from a peer's message at a glance.

Must never: reorder envelopes, split one, read the clock or the environment, let a control
character other than LF or TAB into the rendered text, or put machine metadata in the pane (it goes to the `relay.send.envelope.metadata` inscription, not here).

Why hand-written: `email.mime` folds long headers, quotes display names, writes CRLF or its
own boundary and a top-level Content-Type; the reference fixes a layout none of those produce.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from mcphost.termtext import neutralise as neutralise  # the relay's name for it (look, delivery)

DEFAULT_MAX_TOKENS = 4096
TOKENIZER_PROFILES = ("characters_0_point_3", "whitespace")
TEXT_PART_TYPE = "text/plain; charset=utf-8"
BOUNDARY_PREFIX = "agentmux-"
RELAY_PRINCIPAL = "relay@RELAY"  # the sender of a terminal-outcome receipt
RELAY_DISPLAY_NAME = "relay"
RECEIPT_MARKER = "--- agentmux terminal-outcome receipt ---"
DROPPED_ON_SHUTDOWN = "dropped_on_shutdown"


@dataclass(frozen=True, slots=True)
class Address:
    """One party of a message: its canonical id (`alpha@party`) and optional display name."""

    canonical_id: str
    display_name: str | None = None

    def render(self) -> str:
        """`Alice <session:alpha@party>`; the display name falls back to the canonical id."""
        name = self.display_name if self.display_name else self.canonical_id
        return f"{_field(name.replace(chr(34), chr(39)))} <session:{_field(self.canonical_id)}>"


@dataclass(frozen=True, slots=True)
class Envelope:
    """What one target receives for one message (each target of a send gets its own)."""

    message_id: uuid.UUID
    created_at: datetime
    sender: Address
    target: Address
    body: str
    cc: Sequence[Address] = field(default_factory=tuple)
    subject: str | None = None


def boundary(message_id: uuid.UUID) -> str:
    """The MIME boundary of a message: `agentmux-<id hex without hyphens>`."""
    return BOUNDARY_PREFIX + message_id.hex


def rfc3339(moment: datetime) -> str:
    """`2025-01-02T03:04:05.678Z`: UTC, millisecond precision. Naive datetimes are refused."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("created_at must be timezone-aware")
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def render(envelope: Envelope) -> str:
    """The envelope's exact text (see the module docstring)."""
    mark = "--" + boundary(envelope.message_id)
    lines = [
        mark,
        f"Message-Id: {envelope.message_id}",
        f"Date: {rfc3339(envelope.created_at)}",
        f"From: {envelope.sender.render()}",
        f"To: {envelope.target.render()}",
    ]
    if envelope.cc:
        lines.append("Cc: " + ", ".join(address.render() for address in envelope.cc))
    if envelope.subject:
        lines.append(f"Subject: {_field(envelope.subject)}")
    lines += ["", mark, f"Content-Type: {TEXT_PART_TYPE}", ""]
    body = neutralise(envelope.body.replace("\r\n", "\n").replace("\r", "\n"))
    if not body.endswith("\n"):
        body += "\n"
    return "\n".join(lines) + "\n" + body + mark + "--\n"


def receipt_body(
    message_id: str,
    target: str,
    outcome: str,
    reason_code: str | None = None,
    reason: str | None = None,
) -> str:
    """The one-line body of the receipt for a queued message that was not delivered."""
    dropped = DROPPED_ON_SHUTDOWN in (outcome, reason_code)
    word = "dropped on relay shutdown" if dropped else "failed"
    body = f"Your message {message_id} to {target} was not delivered ({word})."
    if reason_code is not None:
        body += f" reason_code={reason_code}"
    if reason is not None:
        body += f": {reason}"
    return body


def receipt(message_id: uuid.UUID, created_at: datetime, sender: Address, body: str) -> Envelope:
    """The receipt's envelope: from `relay@RELAY` to the original sender, nobody in Cc."""
    return Envelope(
        message_id, created_at, Address(RELAY_PRINCIPAL, RELAY_DISPLAY_NAME), sender, body
    )


def render_receipt(envelope: Envelope) -> str:
    """A receipt as the pane gets it: the marker line, then the envelope."""
    return RECEIPT_MARKER + "\n" + render(envelope)


def count_lines(text: str) -> int:
    """Lines as Rust's `str::lines` counts them: a final newline does not open another line."""
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def estimate_tokens(text: str, profile: str = "characters_0_point_3") -> int:
    """The token estimate that bounds a batch (see the module docstring)."""
    extra = count_lines(text) // 12
    if profile == "characters_0_point_3":
        return (len(text) * 3 + 9) // 10 + extra
    if profile == "whitespace":
        return len(text.split()) + extra
    raise ValueError(f"unknown tokenizer profile {profile!r}; expected one of {TOKENIZER_PROFILES}")


def join_batch(envelopes: Sequence[str]) -> str:
    """Envelopes (each ending with a newline) as one prompt, separated by one blank line."""
    return "\n".join(envelopes)


def take_batch(
    pending: Sequence[str],
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    profile: str = "characters_0_point_3",
) -> int:
    """How many envelopes from the head of `pending` go into the next injected prompt.

    `pending` holds only contiguous envelopes to one target (the caller stops at a raww
    barrier). 0 only when `pending` is empty; otherwise at least 1.
    """
    if not pending:
        return 0
    taken = 1
    while taken < len(pending):
        if estimate_tokens(join_batch(pending[: taken + 1]), profile) > max_tokens:
            break
        taken += 1
    return taken


def _one_line(value: str) -> str:
    return value.replace("\r\n", " ").replace("\r", " ").replace("\n", " ")


def _field(value: str) -> str:
    """A header value: one line, no control but TAB."""
    return neutralise(_one_line(value))
