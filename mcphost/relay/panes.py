"""Readiness and delivery into one tmux pane (reference §3.4): the gate, then paste and submit.

Owns: the readiness gate (`Gate` and its `wait`), the gate's reason codes and the outcome each
maps to (`OUTCOME_OF`; the outcome itself is `outcome.Delivery`, shared by every kind of member),
the gated paste-and-submit of a batch (`deliver`, the one the relay's
delivery workers and the tests both use), raww's ungated write (`raw_write`) and its size check
(`check_raw_text`, `RawTextTooLarge`: `agentmux.wire.RAWW_MAX_BYTES`). The tmux mechanics
(snapshot, paste, submit, pane state) are `tmux.TmuxServer`'s.

Readiness gate (`Gate.wait`): poll the pane (screen, cursor, liveness in one tmux call) every
`poll_ms`; once nothing changed for `quiet_ms`, the prompt regex (`re.search`, no flags: write
`(?ms)` as agentmux's presets do) must match the last `inspect_lines` non-empty lines joined
with "\\n", and the cursor column must equal `idle_column` when set. Outcomes: "ready", or a
reason code: `target_never_settled` (timeout, output never held still for the quiet window),
`target_not_ready` (timeout, it settled but never on a prompt), `target_unresponsive` (the
pane showed nothing at all by `prime_timeout_ms`), `delivery_target_unreachable` (session gone
or its process dead). A settled non-prompt frame is never a failure before the timeout.

Must never: use `send-keys` or call tmux but through `TmuxServer`, decide what is delivered
(the relay's `delivery.py` takes the batch), or import the behaviour's modules (import-linter).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mcphost.agentmux.wire import RAWW_MAX_BYTES, raww_text_too_large
from mcphost.relay.outcome import SUBMIT_FAILED, UNREACHABLE, Delivery
from mcphost.relay.tmux import NoSuchSession, TmuxError, TmuxServer

__all__ = [
    "NEVER_SETTLED", "NOT_READY", "OUTCOME_OF", "READY", "SUBMIT_FAILED", "UNREACHABLE",
    "UNRESPONSIVE", "Delivery", "Gate", "RawTextTooLarge", "check_raw_text", "deliver",
    "prompt_text", "raw_write",
]  # fmt: skip

READY = "ready"
NEVER_SETTLED = "target_never_settled"
NOT_READY = "target_not_ready"
UNRESPONSIVE = "target_unresponsive"


class RawTextTooLarge(TmuxError):
    """raww text over 32 KiB of UTF-8: the relay's `validation_invalid_params`."""

    def __init__(self, size: int) -> None:
        err = raww_text_too_large(size)
        super().__init__(err.code, err.message, err.details)


OUTCOME_OF = {
    NEVER_SETTLED: "timeout",
    NOT_READY: "timeout",
    UNRESPONSIVE: "timeout",
    UNREACHABLE: "not_submitted",
}


def check_raw_text(text: str) -> int:
    """The UTF-8 size of a raww text; RawTextTooLarge over 32 KiB (32768 bytes are fine)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > RAWW_MAX_BYTES:
        raise RawTextTooLarge(size)
    return size


@dataclass(frozen=True, slots=True)
class Gate:
    """A coder's readiness bounds (`prompt-regex`, `prompt-inspect-lines`, ...), in ms."""

    quiet_ms: int = 750
    prompt_regex: str | None = None
    inspect_lines: int = 1
    idle_column: int | None = None
    timeout_ms: int = 900_000
    prime_timeout_ms: int | None = None
    poll_ms: int = 50

    def __post_init__(self) -> None:
        if self.quiet_ms < 0 or self.timeout_ms < 0 or self.poll_ms <= 0:
            raise ValueError("quiet_ms and timeout_ms must be >= 0, poll_ms > 0")
        if self.inspect_lines < 1:
            raise ValueError("inspect_lines must be >= 1")
        if self.prime_timeout_ms is not None and self.prime_timeout_ms < 0:
            raise ValueError("prime_timeout_ms must be >= 0")
        if self.prompt_regex is not None:
            try:
                re.compile(self.prompt_regex)
            except re.error as exc:
                raise ValueError(f"prompt regex {self.prompt_regex!r}: {exc}") from None

    async def wait(self, server: TmuxServer, name: str) -> str:
        """Return "ready", or the reason code of a timeout or an unreachable target (module doc)."""
        pattern = None if self.prompt_regex is None else re.compile(self.prompt_regex)
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + self.timeout_ms / 1000
        prime = self.prime_timeout_ms
        prime_deadline = None if prime is None else start + prime / 1000
        last: tuple[tuple[str, ...], int, int] | None = None
        changed_at = start
        settled = False
        seen_output = False
        while True:
            try:
                lines, x, y, dead = await server.snapshot(name, self.inspect_lines)
            except NoSuchSession:
                return UNREACHABLE
            if dead:
                return UNREACHABLE
            now = loop.time()
            key = (tuple(lines), x, y)
            seen_output = seen_output or any(line.strip() for line in lines)
            if key != last:
                last, changed_at = key, now
            elif now - changed_at >= self.quiet_ms / 1000:
                settled = True
                text = prompt_text(lines, self.inspect_lines)
                prompt_ok = pattern is None or pattern.search(text)
                if prompt_ok and (self.idle_column is None or x == self.idle_column):
                    return READY
            if prime_deadline is not None and not seen_output and now >= prime_deadline:
                return UNRESPONSIVE
            if now >= deadline:
                return NOT_READY if settled else NEVER_SETTLED
            await asyncio.sleep(self.poll_ms / 1000)


def prompt_text(lines: Sequence[str], inspect_lines: int) -> str:
    """The last `inspect_lines` non-empty lines, joined with "\\n": what the regex sees."""
    filled = [line for line in lines if line.strip()]
    return "\n".join(filled[-inspect_lines:]) if inspect_lines > 0 else ""


async def deliver(server: TmuxServer, name: str, gate: Gate, take: Callable[[], str]) -> Delivery:
    """Gate, then `take()` the batch text (what is queued once the gate has settled, so
    messages that arrived while it waited join the batch; taken on failure too, the items sharing
    the outcome), then one bracketed paste and the separate "\\r" paste. The relay's delivery
    workers and the tests both deliver through here."""
    try:
        state, reason = await gate.wait(server, name), None
    except TmuxError as exc:
        state, reason = UNREACHABLE, exc.message
    text = take()
    if state != READY:
        return Delivery(OUTCOME_OF.get(state, "timeout"), state, reason)
    try:
        await server.paste(name, text, bracketed=True)
    except TmuxError as exc:
        return Delivery("not_submitted", UNREACHABLE, exc.message)
    try:
        await server.submit(name)
    except TmuxError as exc:
        return Delivery("submission_unknown", SUBMIT_FAILED, exc.message)
    return Delivery("delivered")


async def raw_write(server: TmuxServer, name: str, text: str, no_enter: bool = False) -> Delivery:
    """raww: no gate, no envelope; bracketed text, then "\\r" unless `no_enter`.

    Raises RawTextTooLarge (code `validation_invalid_params`) over 32 KiB of UTF-8, before any
    tmux call; the relay checks with `check_raw_text` when it accepts the request, too.
    """
    check_raw_text(text)
    try:
        if (await server.pane_state(name)).dead:
            return Delivery("not_submitted", UNREACHABLE, f"the process in {name!r} has exited")
    except NoSuchSession as exc:
        return Delivery("not_submitted", UNREACHABLE, exc.message)
    try:
        await server.paste(name, text, bracketed=True)
    except TmuxError as exc:
        return Delivery("not_submitted", UNREACHABLE, exc.message)
    if not no_enter:
        try:
            await server.submit(name)
        except TmuxError as exc:
            return Delivery("submission_unknown", SUBMIT_FAILED, exc.message)
    return Delivery("delivered")
