"""The supervisor's link to the center: the worker token, the access every session's calls use,
and the names an operator of the supervisor reads in failures.

Owns: `CenterLink`, the one holder of the fleet's `[center]` in force and of the worker token
read from its `token_file`. It builds the shared, pooled `AdminClient` whose `AdminAccess`
(target, pins, token) every session reads per call, so `apply` (a reload that changed
`[center]`, or only the token file's content) reaches the next call of every session at once:
no session is rebuilt, no agent restarted. After a 401, `on_unauthorized` re-reads the token
file once per rotation (single-flight: one reader at a time, and only when the file changed since
it was last read; a call storm that all hit the same stale token waits for that one read and
retries with its result). `for_operator`: a failure with the standalone host's `AC_MCP_*` names
(which do not exist in supervised mode) replaced by the fleet keys (`[center] fingerprint`, ...).
`Center`: the link with what start-up opens on it (startup.py), held whole for the supervisor's
life: the shared admin client, the runtime socket's client, the center's health (health.py),
probed through that client and poked by every failure of it that says something about the
center and by a `[center]` a reload changed; at most `CENTER_CALLS_PER_AGENT` calls of one
agent in flight on either client.

Must never: log, show or hand the token to anything but the `AdminClient`; read a file other
than `[center] token_file`.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from mcphost import events
from mcphost.errors import ToolFailure

if TYPE_CHECKING:
    from mcphost.admin.client import AdminAccess, AdminClient
    from mcphost.supervisor.plan import CenterConfig

# Exchanges one agent may have in flight on the shared admin (and runtime) client, of its 64:
# the rest of its calls wait their turn, round-robin with other agents' (mcphost.admin.slots).
CENTER_CALLS_PER_AGENT = 16

# the standalone host's variables -> the fleet key that does the same in supervised mode
FLEET_KEYS = {
    "AC_MCP_SERVER_FINGERPRINT": "[center] fingerprint",
    "AC_MCP_ADMIN_URL": "[center] admin_url",
    "AC_MCP_RUNTIME_SOCKET": "[center] runtime_socket",
    "AC_MCP_WORKER_TOKEN_FILE": "[center] token_file",
    "AC_MCP_WORKER_TOKEN": "[center] token_file",
}
_NAMES = re.compile("|".join(sorted(FLEET_KEYS, key=len, reverse=True)))

Stamp = tuple[int, int, int, int]  # what identifies one version of the token file


def for_operator(failure: ToolFailure) -> ToolFailure:
    """`failure` with every `AC_MCP_*` name in its message replaced by its fleet key."""
    message = _NAMES.sub(lambda m: FLEET_KEYS[m.group(0)], failure.message)
    if message == failure.message:
        return failure
    return type(failure)(failure.code, message, failure.details, status=failure.status)


def _stamp(path: str) -> Stamp | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size)


def read_token(path: str) -> tuple[str, Stamp | None]:
    """The token in `path` and the file's stamp; `BindingError` (naming what is wrong, never
    the content) when it cannot be used."""
    from mcphost.binding import _read_token_file

    stamp = _stamp(path)
    return _read_token_file(path), stamp


class CenterLink:
    """The `[center]` in force, its token, and the shared client built from them."""

    def __init__(self, center: CenterConfig, token: str, stamp: Stamp | None) -> None:
        self.center = center
        self._token = token
        self._stamp = stamp
        self._lock = asyncio.Lock()
        self.admin: AdminClient | None = None

    def access(self) -> AdminAccess:
        from mcphost.admin.client import AdminAccess

        return AdminAccess(self.center.admin_url, self.center.pins, self._token)

    def client(
        self,
        *,
        call_timeout: float,
        on_failure: Callable[[ToolFailure], ToolFailure],
        per_lane: int | None = None,
    ) -> AdminClient:
        """The one pooled, pinned client every session shares (built once); `per_lane`: the
        calls one agent may have in flight on it (`mcphost.admin.slots`)."""
        from mcphost.admin.client import AdminClient

        access = self.access()
        self.admin = AdminClient(
            access.target,
            token=access.token,
            pins=access.pins,
            call_timeout=call_timeout,
            on_unauthorized=self.on_unauthorized,
            on_failure=on_failure,
            per_lane=per_lane,
        )
        return self.admin

    def apply(self, center: CenterConfig, token: str, stamp: Stamp | None) -> list[str]:
        """Make `center` and `token` the ones in force for the next call of every session;
        which of admin_url, fingerprint and the token changed (for the event log)."""
        changed = [
            name
            for name, differs in (
                ("admin_url", center.admin_url != self.center.admin_url),
                ("fingerprint", center.pins != self.center.pins),
                ("token_file", center.token_file != self.center.token_file),
                ("token", token != self._token),
            )
            if differs
        ]
        self.center, self._token, self._stamp = center, token, stamp
        if self.admin is not None:
            self.admin.rebind(self.access())
        return changed

    async def on_unauthorized(self, refused: str) -> bool:
        """A call was refused (401) with `refused`: whether a fresh token is now in place."""
        from mcphost.binding import BindingError

        async with self._lock:  # single-flight: the first reads, the rest see its result
            if self._token != refused:
                return True
            path = self.center.token_file
            if _stamp(path) == self._stamp:
                return False  # the file has not changed since it was read: nothing fresher
            try:
                token, stamp = await asyncio.to_thread(read_token, path)
            except BindingError as exc:
                events.emit(
                    "supervisor.token_unreadable",
                    level="error",
                    file=path,
                    problem=exc.problem,
                    expected=exc.expected,
                )
                return False
            self._stamp = stamp
            if token == refused:
                return False
            self._token = token
            if self.admin is not None:
                self.admin.rebind(self.access())
            events.emit("supervisor.token_reread", file=path, reason="401 from the center")
            return True


class Center:
    """The center as every session reaches it (module doc): `link`, `admin` (the shared client
    `link` built), `runtime` (None: no `[center] runtime_socket` at start; a reload that sets one
    opens none) and `health`, whose loop (`health.run()`) the supervisor runs as its own task."""

    def __init__(self, link: CenterLink, *, call_timeout: float) -> None:
        from mcphost.admin.client import AdminClient
        from mcphost.admin.target import AdminTarget
        from mcphost.supervisor.center.health import CenterHealth

        self.link = link
        self.admin = link.client(
            call_timeout=call_timeout, on_failure=self._failure, per_lane=CENTER_CALLS_PER_AGENT
        )
        self.health = CenterHealth(self.admin)
        socket = link.center.runtime_socket
        self.runtime: AdminClient | None = None
        if socket:
            self.runtime = AdminClient(
                AdminTarget(kind="unix", path=socket), per_lane=CENTER_CALLS_PER_AGENT
            )

    def _failure(self, failure: ToolFailure) -> ToolFailure:
        """Every failure of the shared client: named in fleet keys (what an operator of the
        supervisor can change), and a probe of the center when it says something about it."""
        from mcphost.supervisor.center.health import worth_a_probe

        if worth_a_probe(failure):
            self.health.poke()
        return for_operator(failure)

    def apply(self, center: CenterConfig, token: str, stamp: Stamp | None) -> list[str]:
        """`CenterLink.apply`, the runtime client moved to a changed `runtime_socket`, and a
        probe when anything changed; what changed (for the event log)."""
        old_runtime = self.link.center.runtime_socket
        changed = self.link.apply(center, token, stamp)
        runtime = self.runtime
        if runtime is not None and center.runtime_socket and center.runtime_socket != old_runtime:
            from mcphost.admin.client import AdminAccess
            from mcphost.admin.target import AdminTarget

            runtime.rebind(AdminAccess(AdminTarget(kind="unix", path=center.runtime_socket)))
            changed.append("runtime_socket")
        if changed:
            self.health.poke()
        return changed

    async def aclose(self) -> None:
        """Close both clients (the admin client first)."""
        await self.admin.aclose()
        if self.runtime is not None:
            await self.runtime.aclose()
