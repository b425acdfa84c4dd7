"""Identifiers and timestamps: monotonic ULIDs, prefixed ids, RFC 3339 UTC times.

Owns: id and time formatting. Pure apart from the clock and `os.urandom`.
Must never: produce an id that does not sort by creation time within this process.
"""

from __future__ import annotations

import os
import re
import threading
import time
from datetime import UTC, datetime

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
ULID_RE = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")

_lock = threading.Lock()
_last_ms = 0
_last_rand = 0


def ulid() -> str:
    """A 26-character Crockford ULID; strictly increasing within this process."""
    global _last_ms, _last_rand
    with _lock:
        ms = int(time.time() * 1000)
        if ms <= _last_ms:
            ms = _last_ms
            rand = _last_rand + 1
        else:
            rand = int.from_bytes(os.urandom(10), "big") >> 1  # room to increment
        _last_ms, _last_rand = ms, rand
    value = (ms << 80) | (rand & ((1 << 80) - 1))
    out = []
    for _ in range(26):
        out.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(out))


def is_ulid(text: str) -> bool:
    return bool(ULID_RE.fullmatch(text))


def now() -> datetime:
    return datetime.now(UTC)


def rfc3339(moment: datetime) -> str:
    return (
        moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    )


def stamp() -> str:
    return rfc3339(now())
