"""A real `SessionHub` in its own process, for tests/supervisor/serving/test_sessions.py.

Serves `HostSurface`s over a Unix socket, all on one shared admin client, against the center
named in the JSON config (argv[1]). Identity is decided from the kernel's word like the real
supervisor's, with a test rule instead of ancestry: the peer's pid (SO_PEERCRED) names a
process whose initial environment (`/proc/<pid>/environ`) holds
`MCPHOST_TEST_AS=<agent_id>:<generation>`; the test process itself (this process's parent) is
`config["parent_as"]`. Anything else is refused with `not_in_fleet`.

Commands on stdin, one per line, each answered on stdout: `count <agent_id>`,
`close <agent_id> <below_generation>` (close_where), `surfaces` (how many were built, how many
share the one client), `quit` (aclose, then exit 0). `ready` is printed once listening.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from mcphost.admin.client import AdminClient
from mcphost.admin.pinning import parse_pins
from mcphost.admin.target import parse_target
from mcphost.binding import AgentBinding
from mcphost.host.server import HostSurface
from mcphost.peer import PeerCred
from mcphost.supervisor.refusals import Refused
from mcphost.supervisor.serving.sessions import Attached, SessionHub
from mcphost.surface import Surface

MARKER = "MCPHOST_TEST_AS"


def identity_of(pid: int, parent_as: str | None) -> str | None:
    if pid == os.getppid():
        return parent_as
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for item in environ.split(b"\0"):
        key, _, value = item.partition(b"=")
        if key.decode() == MARKER:
            return value.decode()
    return None


async def main(config: dict[str, Any]) -> None:
    shared = AdminClient(
        parse_target(config["admin_url"]),
        token=Path(config["token_file"]).read_text().strip(),
        pins=parse_pins(config.get("pins", "")) if config.get("pins") else (),
    )
    roots: dict[str, str] = config["roots"]
    built: list[HostSurface] = []

    def identify(cred: PeerCred) -> Attached:
        found = identity_of(cred.pid, config.get("parent_as"))
        if cred.uid != os.getuid() or found is None or found.split(":")[0] not in roots:
            raise Refused("not_in_fleet", f"process {cred.pid} is not in this test's fleet")
        agent_id, _, generation = found.partition(":")
        return Attached(agent_id=agent_id, generation=int(generation))

    def surface_for(attached: Attached) -> Surface:
        binding = AgentBinding(
            agent_id=attached.agent_id,
            target=parse_target(config["admin_url"]),
            agent_root=roots[attached.agent_id],
            generation=attached.generation,
            tier_tools=True,
        )
        surface = HostSurface(binding, admin=shared)
        built.append(surface)
        return surface

    hub = SessionHub(
        config["socket"], identify=identify, surface_for=surface_for, mode=config["mode"]
    )
    await hub.start()
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] == "count":
            answer = f"count {hub.count(words[1])}"
        elif words[0] == "close":
            agent_id, below = words[1], int(words[2])
            n = hub.close_where(
                lambda a, agent_id=agent_id, below=below: (
                    a.agent_id == agent_id and a.generation < below
                )
            )
            answer = f"closed {n}"
        elif words[0] == "surfaces":
            answer = f"surfaces {len(built)} {sum(s.admin is shared for s in built)}"
        else:
            answer = f"unknown {words[0]}"
        print(answer, flush=True)
    await hub.aclose()
    await shared.aclose()
    print("bye", flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
