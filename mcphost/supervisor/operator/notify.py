"""systemd's service notification protocol (sd_notify), for `Type=notify` units.

Owns: the one datagram socket to `$NOTIFY_SOCKET` (a path, or an abstract socket named with a
leading `@`) and the messages the supervisor sends on it: `READY=1` with a `STATUS=` line once
the control socket listens and the first reconcile has started every agent, `RELOADING=1` with
`MONOTONIC_USEC=` when a reload starts and `READY=1` after it, `STOPPING=1` when a stop starts.
`Notifier.take` removes `NOTIFY_SOCKET` from the environment it is given (the supervisor's own,
before anything is spawned): no agent ever inherits it.

Written by hand on the stdlib: the protocol is one `sendto` of `KEY=VALUE` lines. The
python-systemd binding is a C extension needing libsystemd's headers to build; `sdnotify` on
PyPI (pure Python) has had no release since 2017 and sends without reporting errors.

Must never: raise (a notification that cannot be sent is logged once as
`supervisor.notify_failed`, and the supervisor runs on), or block (the socket is non-blocking).
"""

from __future__ import annotations

import socket
import time
from collections.abc import MutableMapping

from mcphost import events

VARIABLE = "NOTIFY_SOCKET"


def address_of(value: str) -> str:
    """The `sendto` address of a `$NOTIFY_SOCKET` value: `@name` is the abstract `\\0name`."""
    return "\0" + value[1:] if value.startswith("@") else value


def message(**fields: str | int) -> bytes:
    """The datagram of `fields`: one `KEY=VALUE` line each (newlines in a value become spaces,
    as a line is one field)."""
    lines = (f"{key}={str(value).replace(chr(10), ' ')}" for key, value in fields.items())
    return "\n".join(lines).encode()


class Notifier:
    """Where notifications go: `address` (None: not run by systemd's notify; every send is a
    no-op)."""

    def __init__(self, address: str | None) -> None:
        self.address = address
        self._failed = False

    @classmethod
    def take(cls, environ: MutableMapping[str, str]) -> Notifier:
        """A notifier for `environ`'s `NOTIFY_SOCKET`, removed from it."""
        value = environ.pop(VARIABLE, "")
        return cls(address_of(value) if value else None)

    def send(self, **fields: str | int) -> bool:
        """Send `fields` as one datagram; True when sent."""
        if self.address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.setblocking(False)
                sock.sendto(message(**fields), self.address)
        except OSError as exc:
            if not self._failed:  # systemd gone or the socket wrong: say so once
                self._failed = True
                events.emit(
                    "supervisor.notify_failed",
                    "warning",
                    socket=self.address.replace("\0", "@"),
                    error=str(exc),
                    fix="check NOTIFY_SOCKET (set by systemd for Type=notify units)",
                )
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.send(READY=1, STATUS=status)

    def reloading(self) -> bool:
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000  # systemd's clock, in µs
        return self.send(RELOADING=1, MONOTONIC_USEC=now)

    def stopping(self) -> bool:
        return self.send(STOPPING=1, STATUS="stopping")
