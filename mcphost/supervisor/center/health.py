"""Whether the supervisor's center works, as `mcphost ctl status` shows it.

Owns: `CenterHealth` (the last probe's outcome: `state` "ok" or a stable code, a one-line
`message` with the remedy naming the fleet key, `checked_at`, `fleet_key`; the probe loop: at
start, every `OK_INTERVAL` while ok, every `RETRY_INTERVAL` while not, and at once when a
session's call failed on the way to the center or a reload changed `[center]`), `diagnose` (the
table from a failure to its state and `[center]` remedy). `--check`'s one-shot view is
preflight.py, over this table and the link's token.

The probe is `mcphost check`'s (`mcphost.host.check.probe`) through the supervisor's own shared
client, with the worker-level read `GET /admin/worker/agents`: it speaks for no agent, so it
fences no generation.

Must never: show the token, name an `AC_MCP_*` variable (supervised mode has none), or let a
probe's own failure trigger another probe.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mcphost import events
from mcphost.errors import AdminFailure, CenterRefusal, ToolFailure

if TYPE_CHECKING:
    from mcphost.admin.client import AdminClient

OK_INTERVAL = 30.0  # seconds between probes while the center answers
RETRY_INTERVAL = 5.0  # ... while it does not
MIN_SPACING = 1.0  # never two probes closer than this
PROBE_ROUTE = "/admin/worker/agents"
RELOAD = "then `mcphost ctl reload`"


@dataclass(frozen=True, slots=True)
class Diagnosis:
    state: str  # "ok" or a stable code
    fleet_key: str | None  # the [center] key that fixes it
    remedy: str


ADMIN_URL = "[center] admin_url"
_TABLE: dict[str, Diagnosis] = {
    "admin_pin_mismatch": Diagnosis(
        "pin_mismatch",
        "fingerprint",
        "the center's certificate matches none of the pins in [center] fingerprint (it rotated, "
        "or the connection is intercepted): verify its fingerprint out of band and put it in "
        f"[center] fingerprint (a list allows an overlap), {RELOAD}",
    ),
    "admin_tls_error": Diagnosis(
        "tls_error",
        "admin_url",
        "the TLS handshake with [center] admin_url failed or its pinned certificate is not "
        f"valid now: check that [center] admin_url is the center's TLS port and this machine's "
        f"clock, {RELOAD}",
    ),
    "admin_unavailable": Diagnosis(
        "admin_unreachable",
        "admin_url",
        "nothing answers at [center] admin_url: check that the center runs and that "
        f"[center] admin_url is its address, {RELOAD} if you changed it",
    ),
    "admin_timeout": Diagnosis(
        "admin_timeout",
        "admin_url",
        "the center at [center] admin_url did not answer in time: check that it runs and is "
        f"not overloaded, and that [center] admin_url is its address, {RELOAD} if you changed it",
    ),
    "admin_redirect_refused": Diagnosis(
        "admin_redirect",
        "admin_url",
        "[center] admin_url answers with a redirect, which is never followed: point it at the "
        f"address that answers directly, {RELOAD}",
    ),
    "token_unreadable": Diagnosis(
        "token_unreadable",
        "token_file",
        "[center] token_file cannot be read as a worker token: put the worker's token there "
        f"(one line, 0600, owned by the supervisor's user), {RELOAD}",
    ),
}
_UNAUTHORIZED = Diagnosis(
    "admin_unauthorized",
    "token_file",
    "the center refuses the token in [center] token_file: put this worker's current token "
    f"there (one line, 0600), {RELOAD} (a refused call also re-reads it once)",
)


def diagnose(failure: ToolFailure, url: str | None = None) -> Diagnosis:
    """The state and `[center]` remedy for a failure of the probe; a remedy about
    `[center] admin_url` names `url`, the address tried, when it is given."""
    if failure.code.startswith("auth_"):
        return _UNAUTHORIZED
    known = _TABLE.get(failure.code)
    if known is not None and url is not None and known.fleet_key == "admin_url":
        named = known.remedy.replace(ADMIN_URL, f"{ADMIN_URL} ({url})", 1)
        return Diagnosis(known.state, known.fleet_key, named)
    if known is not None:
        return known
    return Diagnosis(
        failure.code,
        None,
        f"the center answered {failure.code}: {failure.message}"[:400],
    )


def worth_a_probe(failure: ToolFailure) -> bool:
    """Whether a session's failed call says something about the center itself (the way to it,
    or its refusal of the worker's token), rather than about the request."""
    if not isinstance(failure, AdminFailure):
        return False
    return not isinstance(failure, CenterRefusal) or failure.code.startswith("auth_")


class CenterHealth:
    """The center's state as last probed, and the loop that keeps it current."""

    def __init__(self, client: AdminClient) -> None:
        self.client = client
        self.state = "unknown"
        self.message = "not checked yet"
        self.fleet_key: str | None = None
        self.checked_at: float | None = None
        self._wake = asyncio.Event()
        self._probing = False

    def as_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "message": self.message,
            "checked_at": self.checked_at,
            "fleet_key": self.fleet_key and f"[center] {self.fleet_key}",
        }

    def poke(self) -> None:
        """Probe now (a call failed on the way to the center, or `[center]` changed)."""
        if not self._probing:
            self._wake.set()

    def record(self, failure: ToolFailure | None, ms: float | None = None) -> None:
        before = self.state
        if failure is None:
            self.state, self.fleet_key = "ok", None
            self.message = f"the center answered ({ms} ms)"
        else:
            found = diagnose(failure, str(self.client.target))
            self.state, self.fleet_key, self.message = found.state, found.fleet_key, found.remedy
        self.checked_at = time.time()
        if self.state != before:
            events.emit(
                "supervisor.center_health",
                level="info" if self.state == "ok" else "error",
                state=self.state,
                message=self.message,
                fleet_key=self.fleet_key,
            )

    async def check(self) -> None:
        from mcphost.admin.client import AdminRequest
        from mcphost.host.check import probe

        self._probing = True
        try:
            result = await probe(self.client, AdminRequest("GET", PROBE_ROUTE))
        finally:
            self._probing = False
        if result["ok"]:
            self.record(None, result["ms"])
        else:
            self.record(ToolFailure(result["error"], result["message"], result["details"]))

    async def run(self) -> None:
        while True:
            self._wake.clear()
            await self.check()
            await asyncio.sleep(MIN_SPACING)
            interval = OK_INTERVAL if self.state == "ok" else RETRY_INTERVAL
            try:
                async with asyncio.timeout(max(0.0, interval - MIN_SPACING)):
                    await self._wake.wait()
            except TimeoutError:
                pass
