"""The identity registry: which processes the kernel may vouch for as which agent (one rule).

Owns: the identity roots, `(pid, starttime)` of every process the supervisor started as an agent
(its spawn, or a `ctl exec` command) -> `(agent_id, generation)`, their registration and
forgetting (`spawned`, `add`, `discard`, `ended`, `forget`), and the one vouch rule that the
session hub (the supervisor's `identify`), the relay (`RelayHost.socket_trust`) and exec use:
a peer is agent A only if the kernel says the connecting process descends from one of A's roots
(`peer.find_root` over `SO_PEERCRED`'s pid, stopping at this process: we are the child subreaper,
so an escaped or orphaned process's ancestry ends here and fails closed), its uid is the
agent's, and it is still the same process after the walk (pidfd or start time). The generation
is the one of the root the ancestry reached.

Must never: take an identity from anything a process can choose (its environment, arguments or
claims on the wire), keep a root of an agent past `forget`, or vouch for the supervisor itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from mcphost import peer, procfs
from mcphost.supervisor import refusals as R
from mcphost.supervisor.refusals import Refused

Root = tuple[int, int]  # (pid, starttime): a pid alone is reused


class Identities:
    """The roots of every agent's process trees, and the vouch rule over them (module doc)."""

    def __init__(self) -> None:
        self.roots: dict[Root, tuple[str, int]] = {}
        self._of: dict[str, set[Root]] = {}  # per agent: its roots, to forget them at once

    def spawned(self, agent_id: str, root: Root, generation: int) -> None:
        """The agent's new process: its only root from now on (the older ones are forgotten)."""
        self.forget(agent_id)
        self.add(agent_id, root, generation)

    def add(self, agent_id: str, root: Root, generation: int) -> None:
        """One more root of the agent (a `ctl exec` command, at the agent's current generation)."""
        self.roots[root] = (agent_id, generation)
        self._of.setdefault(agent_id, set()).add(root)

    def discard(self, agent_id: str, root: Root, generation: int) -> None:
        """Forget `root` if it is still the agent's at `generation` (an exec'd command exited)."""
        if self.roots.get(root) == (agent_id, generation):
            del self.roots[root]
            self._of.get(agent_id, set()).discard(root)

    def ended(self, agent_id: str, generation: int) -> None:
        """Forget the agent's roots of `generation` (its process exited)."""
        for root in [
            r for r in self._of.get(agent_id, ()) if self.roots.get(r, ("", -1))[1] == generation
        ]:
            self.discard(agent_id, root, generation)

    def forget(self, agent_id: str) -> None:
        """Forget every root of the agent (a new spawn, or it left the fleet)."""
        for root in self._of.pop(agent_id, set()):
            self.roots.pop(root, None)

    def of(self, agent_id: str) -> set[Root]:
        return set(self._of.get(agent_id, ()))

    def vouch(self, cred: peer.PeerCred, uid_of: Callable[[str], int | None]) -> tuple[str, int]:
        """`(agent_id, generation)` of the peer `cred`, as the kernel vouches for it; `Refused`
        (`not_in_fleet`, `agent_not_running`, `uid_mismatch`, `peer_gone`) otherwise.
        `uid_of(agent_id)`: the uid the agent runs as, None when it is no longer in the fleet."""
        hit = peer.find_root(cred.pid, self.roots, stop={os.getpid()})
        if hit is None:
            raise Refused.row(R.NOT_IN_FLEET, pid=cred.pid)
        agent_id, generation = hit
        uid = uid_of(agent_id)
        if uid is None:
            raise Refused.row(R.AGENT_GONE, agent=agent_id)
        if cred.uid != uid:
            raise Refused.row(
                R.UID_MISMATCH, pid=cred.pid, uid=cred.uid, agent=agent_id, agent_uid=uid
            )
        stat = procfs.read_stat(cred.pid)
        if stat is None or not peer.still_same(cred, stat):
            raise Refused.row(R.PEER_GONE, pid=cred.pid)
        return agent_id, generation
