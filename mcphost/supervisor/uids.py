"""Each agent's own uid: the range a root supervisor hands them from, and who gets which.

Owns: `UidRange` (the fleet's `[identity] uids`, "FIRST-LAST", default `DEFAULT_RANGE`), its
grammar (`parse_range`), the one rule of who gets which uid (`allocate`, pure: an agent keeps the
uid the state recorded for it; a new one gets the first free uid from a candidate derived from
its id, so the same id lands on the same uid in an empty state too), and the checks against the
machine's user database (`in_user_db`, `users_in_range`).

Why: under a root supervisor an agent without `user =` used to run as uid 0 outside its fence,
and a uid-0 process in a nested user namespace reaches every file and cgroup that uid 0 owns
(shared/reference/isolation.md, "Agents' own uids"). So, as systemd's `DynamicUser=` does, every
such agent runs as a uid (and gid) of its own that no other process on the machine has: the
kernel's permissions become a second wall behind the fence (`/etc/shadow`, the host's cgroups,
another agent's home all refuse it), and a connection's owner uid names the agent. Unlike
`DynamicUser=`, the uid is stable for an agent id and recorded in the state (state.py), so the
files of its home keep their owner across restarts and supervisor restarts; it is released when
the agent leaves the fleet (reconcile.py).

The default range, 0x70000000-0x7000FFFF, lies in the block systemd's "Users, Groups, UIDs and
GIDs on systemd Systems" leaves unused (0x70000000-0x7FFDFFFF): above the container ranges
nspawn picks from, below the foreign range, far from `/etc/subuid`'s usual 100000 + 65536 n
blocks and from the 16-bit ranges of system and human users. A range holding a user of the
user database is refused (`users_in_range`, `plan.check_users`), and a uid the database names
is never handed out (`allocate` skips it), whatever NSS module answers.

Must never: hand out 0, a uid outside the range, or one uid to two agents; read anything but the
user and group databases (the caller passes the recorded uids in and persists the result).
"""

from __future__ import annotations

import grp
import hashlib
import pwd
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

RANGE_EXPECTED = (
    'a range of uids "FIRST-LAST" (whole numbers, 1 <= FIRST <= LAST < 2147483648, at least as '
    "many uids as agents), none of them a user of this machine"
)


@dataclass(frozen=True, slots=True)
class UidRange:
    """The uids a root supervisor gives its agents, both ends included."""

    first: int
    last: int

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.first <= uid <= self.last

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


DEFAULT_RANGE = UidRange(0x70000000, 0x7000FFFF)  # 1879048192-1879113727, see the module doc
UID_MAX = 2**31 - 1  # a uid that fits a signed int everywhere (and is not (uid_t) -1)


class UidsExhausted(ValueError):
    """More agents than free uids in the range."""


def parse_range(text: str) -> UidRange:
    """`"FIRST-LAST"` as a `UidRange`; ValueError (saying what is wrong) otherwise (pure)."""
    first_text, sep, last_text = text.strip().partition("-")
    if not sep or not first_text.strip().isdigit() or not last_text.strip().isdigit():
        raise ValueError("is not FIRST-LAST")
    first, last = int(first_text), int(last_text)
    if first < 1:
        raise ValueError("includes uid 0 (root)")
    if last < first:
        raise ValueError("ends before it starts")
    if last > UID_MAX:
        raise ValueError(f"goes past {UID_MAX}")
    return UidRange(first, last)


def candidate(agent_id: str, uids: UidRange) -> int:
    """Where `agent_id`'s search for a free uid starts: the same for the same id (pure)."""
    digest = hashlib.sha256(agent_id.encode()).digest()
    return uids.first + int.from_bytes(digest[:8], "big") % uids.size


def in_user_db(uid: int) -> bool:
    """Does the user or group database name `uid` (as a uid, or as a gid: an agent's gid is
    its uid)?"""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
            return True
        except KeyError:
            continue
    return False


def users_in_range(uids: UidRange) -> list[str]:
    """The users and groups of the (enumerable) database whose id lies in `uids`."""
    found = [f"user {e.pw_name} ({e.pw_uid})" for e in pwd.getpwall() if e.pw_uid in uids]
    found += [f"group {e.gr_name} ({e.gr_gid})" for e in grp.getgrall() if e.gr_gid in uids]
    return found


def allocate(
    agent_ids: Iterable[str],
    recorded: Mapping[str, int],
    uids: UidRange,
    *,
    taken: Callable[[int], bool] = in_user_db,
) -> dict[str, int]:
    """The uid of each of `agent_ids` (pure but for `taken`): the one `recorded` for it while it
    is still in the range and no user's; otherwise the first uid from its `candidate` on
    (wrapping around) that no other agent holds and `taken` does not name. The uids `recorded`
    for agents outside `agent_ids` are free again. UidsExhausted when the range is full."""
    wanted = list(dict.fromkeys(agent_ids))
    out: dict[str, int] = {}
    for agent_id in wanted:
        uid = recorded.get(agent_id)
        if uid is not None and uid in uids and not taken(uid):
            out[agent_id] = uid
    held = set(out.values())
    for agent_id in wanted:
        if agent_id in out:
            continue
        start = candidate(agent_id, uids)
        for step in range(uids.size):
            uid = uids.first + (start - uids.first + step) % uids.size
            if uid not in held and not taken(uid):
                out[agent_id] = uid
                held.add(uid)
                break
        else:
            raise UidsExhausted(
                f"[identity] uids = {str(uids)!r} has no free uid left for agent {agent_id!r} "
                f"({len(wanted)} agents): give a wider range"
            )
    return out
