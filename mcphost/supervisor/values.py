"""The fleet file's value types, one home each (as supervisord's `datatypes.py`): what a value may
be, how it is written, and the one message that says so (`*_EXPECTED`, which the fleet file's
loader shows and its model carries as the key's description).

- Listen addresses (`[page] listen`, `[metrics] listen`): `parse_listen` -> `Listen`, with one
  accepted form for both keys (`LISTEN_EXPECTED`): a loopback IP literal (`127.0.0.0/8`, `[::1]`:
  an IPv6 one bracketed) or `localhost` (taken as 127.0.0.1, never resolved: what a name
  resolves to is not the fleet file's to say) with a port from 0 to 65535 (0: a free one, which
  the listener names when it starts), or a Unix socket `unix:/absolute/path` (at most 107
  bytes). Anything else, a non-loopback address above all, is refused: the operator's HTTP
  endpoints have no authentication.
- Which `Host` a listener answers (`Listen.answers`), the one guard against DNS rebinding of
  every HTTP listener of the supervisor (operator/loopback.py applies it to the page and
  `/metrics` alike): on TCP the listener's own address as `str(Listen)` spells it, or
  `localhost` at its port; on a Unix socket any (no browser reaches one).
- Sizes and counts (an agent's cgroup limits, `memory_max`, `pids_max`, `cpu_weight`):
  `parse_size` (bytes, or "512M", "2GiB": powers of 1024), `parse_count`, `UNLIMITED` ("max"),
  and `SIZE_EXPECTED`, `COUNT_EXPECTED`, `WEIGHT_EXPECTED`; and the one way a size is shown to a
  person (`format_size`: "64 MiB", or "64M" in a table's narrow cell), wherever one is: an exit
  reason, `ctl status`, the fleet page.

- The open connections of one listener per owner uid (`Bounds`: how many at once in all and per
  uid; pure bookkeeping), shared by every loopback listener (operator/loopback.py's page and
  `/metrics`, serving/streamable.py's MCP over HTTP).

- What a reload does with a changed key (`Reload`, with what each means, `RELOAD_MEANS`): every
  key of the fleet model declares one (`fleet.reload_of`); the reload's reply, its dry run and
  docs/fleet-keys.md all read that one declaration.

The fleet's durations (`restart_window`, `poll_seconds`...) are numbers of seconds that the
fleet file's model bounds itself; nothing here parses them.

Pure, the standard library only, and below every other module of the supervisor (the lowest
floor of its layers contract): the plan, the loader, the listener and the cgroups all import it.
Must never: accept a listen address beyond the loopback, resolve a name, or answer a `Host`
that is not the listener's own on TCP.
"""

from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass
from typing import Literal

# -- listen addresses ----------------------------------------------------------------------------

LISTEN_EXPECTED = (
    'a loopback address and port ("127.0.0.1:8765", "[::1]:8765", "localhost:8765": 127.0.0.0/8 '
    'or ::1; port 0-65535, 0: a free one) or a Unix socket ("unix:/absolute/path.sock", at most '
    "107 bytes); never a non-loopback address: the endpoint has no authentication"
)
_SUN_PATH_MAX = 107  # mcphost.unixsock.SUN_PATH_MAX (values.py imports none of the sockets)
_LOCALHOST = "localhost"


@dataclass(frozen=True, slots=True)
class Listen:
    """Where an operator's HTTP endpoint listens: a loopback `host` (an IP literal) and `port`,
    or a Unix socket `path` (then host and port are None). `str()` spells it as the fleet file
    may: `127.0.0.1:8765`, `[::1]:8765`, `unix:/run/x.sock`."""

    host: str | None = None
    port: int | None = None
    path: str | None = None

    def __str__(self) -> str:
        if self.path is not None:
            return f"unix:{self.path}"
        return (
            f"[{self.host}]:{self.port}" if ":" in (self.host or "") else f"{self.host}:{self.port}"
        )

    def answers(self, host: str | None) -> bool:
        """Whether a request whose `Host` header is `host` (None: none sent) is answered at
        this address, the bound one (its real port): on TCP only its own address or
        `localhost` at its port, in any case (a page elsewhere whose name was rebound to the
        loopback sends its own name, and is refused); on a Unix socket any."""
        if self.path is not None:
            return True
        return (host or "").lower() in (str(self), f"{_LOCALHOST}:{self.port}")


def parse_listen(text: str) -> Listen:
    """`[page] listen` and `[metrics] listen` as a `Listen` (the module's head says what is
    accepted); ValueError(`LISTEN_EXPECTED`) for anything else."""
    if text.startswith("unix:"):
        path = text[len("unix:") :]
        if (
            not path.startswith("/")
            or "\0" in path
            or path.endswith("/")
            or len(os.fsencode(path)) > _SUN_PATH_MAX
        ):
            raise ValueError(LISTEN_EXPECTED)
        return Listen(path=os.path.normpath(path))
    import ipaddress  # here: the supervisor's start-up pays for it only with an address

    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:  # an IPv6 literal must be bracketed
        raise ValueError(LISTEN_EXPECTED)
    elif host == _LOCALHOST:
        host = "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(LISTEN_EXPECTED) from None
    if not (sep and port.isascii() and port.isdigit() and int(port) <= 65535):
        raise ValueError(LISTEN_EXPECTED)
    if not address.is_loopback:
        raise ValueError(LISTEN_EXPECTED)
    return Listen(host=str(address), port=int(port))


# -- sizes and counts ----------------------------------------------------------------------------

UNLIMITED: Literal["max"] = "max"
SIZE_EXPECTED = (
    'a number of bytes (an integer, or "512M", "2G": K, M, G, T are powers of 1024) or "max"'
)
COUNT_EXPECTED = 'a whole number of processes (at least 16) or "max"'
WEIGHT_EXPECTED = "a whole number from 1 to 10000 (100: an equal share)"
_SIZE = re.compile(r"(\d+)\s*([KMGT]?)(i?B?)?", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(raw: object) -> int | Literal["max"]:
    """`memory_max` as written: bytes (int), "512M" / "2GiB" (powers of 1024), or "max".
    ValueError when it is none of these or below 1 MiB."""
    if isinstance(raw, str) and raw.strip().lower() == UNLIMITED:
        return UNLIMITED
    if isinstance(raw, bool):
        raise ValueError(SIZE_EXPECTED)
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, str) and (match := _SIZE.fullmatch(raw.strip())):
        value = int(match.group(1)) * _UNITS[match.group(2).upper()]
    else:
        raise ValueError(SIZE_EXPECTED)
    if value < 1 << 20:
        raise ValueError(SIZE_EXPECTED + ", at least 1M")
    return value


def parse_count(raw: object) -> int | Literal["max"]:
    """`pids_max` as written: a whole number >= 16, or "max". ValueError otherwise."""
    if isinstance(raw, str) and raw.strip().lower() == UNLIMITED:
        return UNLIMITED
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 16:
        raise ValueError(COUNT_EXPECTED)
    return raw


_SHOWN_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_size(value: int | float, *, short: bool = False) -> str:
    """A number of bytes for a person, in powers of 1024: "64 MiB", "1.5 GiB", "512 B"; one
    decimal below 10 units unless whole ("2 GiB"), none above. `short`: a table's cell, the
    unit's letter alone ("64M", "1.5G", "512B"). The JSON keeps bytes: this is for reading."""
    number = float(value)
    unit = _SHOWN_UNITS[0]
    for unit in _SHOWN_UNITS:
        if abs(number) < 1024 or unit == _SHOWN_UNITS[-1]:
            break
        number /= 1024
    if unit == "B" or number == int(number) or abs(number) >= 10:
        shown = str(int(number))
    else:
        shown = one_decimal(number)
    return f"{shown}{unit[0]}" if short else f"{shown} {unit}"


def one_decimal(number: float) -> str:
    """`number` with one decimal, as JavaScript's `toFixed(1)` writes it (the exact binary value
    rounded, a tie away from zero), so the fleet page's server and its script agree."""
    from decimal import ROUND_HALF_UP, Decimal  # here: only a size that is shown pays for it

    return str(Decimal(number).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


# -- what a reload does with a changed key -------------------------------------------------------


class Reload(enum.StrEnum):
    """What a reload does with a changed key of the fleet file (declared per key in the fleet
    model: `fleet.reload_of`)."""

    LIVE = "live"
    REFENCES = "live_refences"
    RESTARTS_AGENT = "restarts_agent"
    STARTS_STOPS = "starts_stops"
    RESTART_SUPERVISOR = "restart_supervisor"
    REFUSED = "refused"


RELOAD_MEANS: dict[Reload, str] = {
    Reload.LIVE: "applied in place by the reload; no agent restarts",
    Reload.REFENCES: (
        "applied in place by the reload (the next center call uses it); when it moves a path "
        "the fence hides, every running fenced agent restarts (a new generation) into a fence "
        "that hides the new one"
    ),
    Reload.RESTARTS_AGENT: "applied by the reload: each agent whose plan it changes restarts "
    "(a new generation); the others keep running",
    Reload.STARTS_STOPS: "an agent added to the file starts, one taken out stops",
    Reload.RESTART_SUPERVISOR: "not applied by a reload, which names it: restart the "
    "supervisor to apply it",
    Reload.REFUSED: "a reload that changes it is refused whole (`reload_failed`, nothing "
    "applied): restart the supervisor to change it",
}


# Why a listener closed a connection at once, past one of its `Bounds`.
LISTENER_FULL = "listener_full"
PEER_FULL = "peer_full"


class Bounds:
    """The open connections of one listener, per owner uid (pure bookkeeping)."""

    def __init__(self, total: int, per_peer: int) -> None:
        self.total = total
        self.per_peer = per_peer
        self.open = 0
        self.by_uid: dict[int, int] = {}

    def full(self) -> bool:
        return self.open >= self.total

    def admit(self, uid: int) -> str | None:
        """Count one more connection of `uid`; the refusal's reason (and nothing counted) when
        a bound is reached."""
        if self.full():
            return LISTENER_FULL
        if self.by_uid.get(uid, 0) >= self.per_peer:
            return PEER_FULL
        self.open += 1
        self.by_uid[uid] = self.by_uid.get(uid, 0) + 1
        return None

    def release(self, uid: int) -> None:
        self.open -= 1
        left = self.by_uid[uid] - 1
        if left:
            self.by_uid[uid] = left
        else:
            del self.by_uid[uid]
