"""A delivery's terminal outcome (reference §3.4), whatever kind of member it went to.

Owns: `Delivery` (`delivered`, `timeout`, `not_submitted`, `submission_unknown`, `failed`, with
a reason code and a reason) and the reason codes every kind of member shares: `UNREACHABLE`
(`delivery_target_unreachable`), `SUBMIT_FAILED` (`delivery_submit_failed`).

Must never: import anything of the relay (the member kinds, the pane delivery and the relay's
delivery workers all stand above it) or do I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

UNREACHABLE = "delivery_target_unreachable"
SUBMIT_FAILED = "delivery_submit_failed"


@dataclass(frozen=True, slots=True)
class Delivery:
    """A terminal outcome (§3.4): `delivered`, `timeout`, `not_submitted`, `submission_unknown`,
    `failed`."""

    outcome: str
    reason_code: str | None = None
    reason: str | None = None
