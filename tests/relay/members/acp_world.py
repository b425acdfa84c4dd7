"""The harness of the ACP member's tests (test_acp.py; tests/relaytools/test_relaytools_acp.py
drives the relay tools over it): the real `RelayBehaviour` with the bundle `mixed` of the real
configuration tree (mcphost/testing/realrelay.py) hosted by the real `TmuxHost`: `lead` a tmux
stand-in with the `operator` policy, `agent` the stand-in ACP agent
(mcphost/testing/acp_agent.py, hosted as `AcpProcess`: a real process over real pipes, its
history in a file so a restarted one loads its session); `hosted(helper=True)` adds a second
ACP member, `helper`, and `relay_toml` writes relay.toml first.

`World` calls the relay as a decoded frame's body reaches `handle`, and waits by polling what
the relay shows (a look entry, pending choices) with `tests.waiting.eventually`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mcphost.agentmux.wire import RelayError, Request, parse_principal
from mcphost.relay.behaviour import RelayBehaviour
from mcphost.testing.realrelay import AcpProcess, TmuxHost, config_tree
from tests.waiting import eventually

AGENT = "agent@mixed"
HELPER = "helper@mixed"
LEAD = "lead@mixed"
OPTIONS = [
    {"option_id": "allow", "name": "Allow once", "kind": "allow_once"},
    {"option_id": "reject", "name": "Reject", "kind": "reject_once"},
]


@dataclass
class World:
    config: Path
    state: Path
    host: TmuxHost
    relay: RelayBehaviour

    async def call(
        self, pid: str, operation: str, namespace: str | None = None, **body: Any
    ) -> dict[str, Any]:
        request = Request("r1", namespace, operation, {"operation": operation, **body})
        return await self.relay.handle(parse_principal(pid), request)

    async def refused(
        self, pid: str, operation: str, namespace: str | None = None, **body: Any
    ) -> RelayError:
        with pytest.raises(RelayError) as caught:
            await self.call(pid, operation, namespace, **body)
        return caught.value

    def process(self, member: str = "agent") -> AcpProcess:
        return self.host.acp[("mixed", member)]

    async def send(self, text: str, target: str = AGENT) -> str:
        """Send `text` as lead; the message id (queued)."""
        sent = await self.call(LEAD, "send", message=text, targets=[target])
        (result,) = sent["results"]
        assert (result["target_session"], result["outcome"]) == (target, "queued")
        message_id: str = result["message_id"]
        return message_id

    async def look(self, target: str = AGENT, **body: Any) -> dict[str, Any]:
        return await self.call(LEAD, "look", target_session=target, **body)

    async def shows(
        self, needle: str, kind: str | None = None, target: str = AGENT
    ) -> list[dict[str, Any]]:
        """The target's whole buffer once a line of an entry (of `kind`) contains `needle`."""

        async def found() -> list[dict[str, Any]] | None:
            entries: list[dict[str, Any]] = (await self.look(target, lines=1000))[
                "snapshot_entries"
            ]
            hit = any(
                needle in line
                for entry in entries
                if kind is None or entry["kind"] == kind
                for line in lines(entry)
            )
            return entries if hit else None

        result: list[dict[str, Any]] = await eventually(found, f"{needle!r} in {target}'s look")
        return result

    async def pending(self, count: int = 1) -> list[dict[str, Any]]:
        """The bundle's pending choices once there are `count` of them."""

        async def listed() -> list[dict[str, Any]] | None:
            pending: list[dict[str, Any]] = (await self.call(LEAD, "choices_list"))[
                "pending_requests"
            ]
            return pending if len(pending) == count else None

        result: list[dict[str, Any]] = await eventually(listed, f"{count} pending choice(s)")
        return result

    async def pick(self, choice: str, outcome: str, option_id: str | None = None) -> Any:
        body: dict[str, Any] = {"choice_request_id": choice, "outcome": outcome}
        if option_id is not None:
            body["option_id"] = option_id
        return await self.call(LEAD, "choices_pick", **body)

    def records(self, event: str) -> list[dict[str, Any]]:
        """The relay.log records of `event`, oldest first (their details)."""
        path = self.state / "inscriptions" / "relay.log"
        records = [json.loads(line) for line in path.read_text().splitlines()]
        return [r["details"] for r in records if r["event"] == event]

    def policies(self, default_choose: str) -> None:
        """policies.toml's `default` policy (agent's, helper's) with `choose` = this value."""
        path = self.config / "policies.toml"
        text = path.read_text()
        start = text.index('id = "default"')
        end = text.index("[[policies]]", start)
        block = text[start:end]
        kept = "".join(line + "\n" for line in block.splitlines() if not line.startswith("choose"))
        path.write_text(text[:start] + kept + f'choose = "{default_choose}"\n\n' + text[end:])


def lines(entry: dict[str, Any]) -> list[str]:
    return list(entry.get("lines", ()))


def kinds(entries: list[dict[str, Any]]) -> list[str]:
    return [entry["kind"] for entry in entries]


def turn(*lines_: str) -> str:
    return "\n".join(lines_)


@asynccontextmanager
async def hosted(root: Path, *, helper: bool = False, relay_toml: str = "") -> AsyncIterator[World]:
    """The relay with `mixed` up (lead's `up`); `helper`: a second ACP member in it."""
    config, state = config_tree(root)
    if helper:
        with (config / "bundles" / "mixed.toml").open("a") as bundle:
            bundle.write(f'[[sessions]]\nid = "helper"\ndirectory = "{root}"\ncoder = "acpish"\n')
    if relay_toml:
        (config / "relay.toml").write_text(relay_toml)
    host = TmuxHost(state)
    relay = RelayBehaviour([config], state, host, quiet_ms=150, poll_ms=20, environ={})
    world = World(config, state, host, relay)
    try:
        up = await world.call(LEAD, "up")
        assert up["bundles"] == [{"bundle_name": "mixed", "outcome": "hosted"}]
        yield world
    finally:
        await relay.aclose()
        for member in list(host.acp.values()):
            await member.stop()
        for server in list(host.servers.values()):
            for name in await server.sessions():
                await server.kill_session(name)
            await server.kill_server()
