"""The supervisor's side of the relay (issue 13): it hosts the fleet's bundles and serves the wire.

Owns: the relay root `<state>/relay` (0700) and what is under it:

```
<state>/relay/                  0700, the relay state root (AGENTMUX_STATE_DIRECTORY)
  relay.sock                    0600, the relay wire (RelayServer)
  config/                       0700, the generated configuration files (rewritten per reload,
                                before anything is stopped; written by agentmux's bundle-file
                                writer, `agentmux.bundlefile`, so any string of a command
                                round-trips), for file readers; the relay reads the same
                                models from memory
    bundles/<bundle>.toml         agentmux's: members = the fleet's tmux and ACP agents with
                                  that bundle
    coders.toml                   agentmux's: one coder per such agent ("fleet-<agent id>"):
                                  tmux, or an ACP stdio coder for a `runner = "acp"` agent
    mcphost/members.toml          mcphost's side file, which agentmux never reads: the
                                  `runner = "process"` agents of each bundle (at their place
                                  among its members) and their process coders
  identity/principals.json      the PSK store (RelayBehaviour / principals.py)
  inscriptions/relay.log        the relay's records (relay/inscriptions.py), beside the relay
                                tools' inscriptions/bundles/<b>/sessions/<s>/mcp.log
  bundles/<bundle>/tmux.sock    the bundle's tmux server (tmux.py; relative when too long)
  bundles/<bundle>/sessions/<session>/identity.psk   a session PSK written to `config`
```

The fleet's bundles reach the relay as an in-memory layer (`bundles()`: `fleet_bundle` per
bundle, rebuilt by `configure`, which writes the generated files from the same models), read
before the operator's file layers from the supervisor's environment by agentmux's precedence
(`AGENTMUX_CONFIGURATION_DIRECTORY`, else `$XDG_CONFIG_HOME/agentmux`, else
`~/.config/agentmux`: `agentmux.layers.configuration_roots`, the relay tools' own resolution;
first layer wins per file, bundles are a union by id): the fleet is the authority on bundles and
their members, the operator's layers give `policies.toml`, `users.toml` and `relay.toml` (and
bundles the fleet does not name, with the operator's own `coders.toml`). Member `directory` =
the agent's workspace; session id = agent id; `policy` = the agent's `policy` key (absent: the
policies file's default, else the built-in). The generated TOML stays, written from the same
models, for whoever reads files: the relay tools' layout resolution (their bundle's members, in
process too: `configuration_roots` = generated, then the operator's), a standalone
`mcphost relay-tools` or agentmux's CLI pointed at `<state>/relay/config` (which reads its own
two files as they are: the process members, which agentmux cannot express, are only in the side
file, which mcphost's reader merges: `agentmux.bundlefile`). The relay itself never reads it.

The hosting: one `TmuxServer` per bundle (`tmux_server`), given to each `TmuxRunner`;
`BundleHost` for `RelayBehaviour`: `up` / `down` start / stop the bundle's agents through
their runners, each under the agent's lock (`Agents.agent_held`, the one ctl and the
supervisor's reconciliation hold) and looked up only then, so never a runner a reload
discarded; `member_endpoint` (look / send / raww / choices) and `member_state` are asked of the
member's runner, whatever its kind: `AgentRunner.endpoint` (a tmux member's `TmuxEndpoint`, its
bundle's server and its session; an ACP member's runner, whose live `AcpSession` the relay
drives) and `AgentRunner.ready` (its process runs; an ACP member's session also takes turns).
This module imports no kind of runner, nor they it (import-linter: the runners stand on one
floor below it). The relay wire: `RelayServer(<root>/relay.sock)` with the behaviour's `authenticate`,
`handle` and `admit`, started once the fleet has a bundle, unless the operator's environment names
an `AGENTMUX_STATE_DIRECTORY` (an external relay, e.g. upstream agentmux: then the supervisor
hosts tmux agents but serves no relay, and the relay tools use that state root's socket as
before).

No loopback (issue #20): the supervisor's own relay tools never use the socket of the relay it
serves. `tools_stream` gives an agent's relay tools an `InProcessStream` onto
`RelayServer.local_session("<agent>@<bundle>")`: the request (the operation's model) goes
straight to the behaviour under the principal the kernel established when the session attached (no JSON line,
no hello, no second identity check); the supervisor shares one per agent generation among that
agent's MCP sessions, and it holds the identity claim as a connection would. The socket is for
external clients only.

Identity (`socket_trust`): a `socket-trust` hello for `<agent>@<bundle>` is vouched for only when
the kernel says so: the supervisor's identity registry vouches for the peer as that agent
(the one rule of identity.py: it descends from the agent's root, runs as the agent's uid,
and is still the process the kernel named), and the agent is in the fleet with that bundle.
The supervisor itself is no agent (its agents' relay tools reach the relay in process and
never say hello to its socket). Everything else must present a PSK.

Must never: start a process other than through a runner, decide identity from anything the peer
says beyond the principal it claims, or write outside `<state>/relay`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from mcphost import events, fsutil, peer
from mcphost.agentmux.bundlefile import (
    AcpCoder,
    Bundle,
    Coder,
    ProcessCoder,
    Session,
    TmuxCoder,
    layer_toml,
)
from mcphost.agentmux.layers import configuration_roots
from mcphost.agentmux.wire import RelayError, parse_principal
from mcphost.relay import tmux as tm
from mcphost.relay.reasons import STARTUP_FAILED
from mcphost.supervisor.agents.homes import agent_argv, home_paths
from mcphost.supervisor.agents.runner import AgentRunner
from mcphost.supervisor.agents.states import AgentState
from mcphost.supervisor.identity import Identities
from mcphost.supervisor.plan import AgentPlan, Fleet
from mcphost.supervisor.refusals import Refused

if TYPE_CHECKING:
    from mcphost.relay.behaviour import MemberHealth, RelayBehaviour
    from mcphost.relay.members import Endpoint
    from mcphost.relay.server import RelayServer
    from mcphost.relaytools.layout import Layout
    from mcphost.relaytools.stream import Stream

RELAY_DIR = "relay"
CONFIG_DIR = "config"
SOCKET = "relay.sock"
CODER_PREFIX = "fleet-"
MEMBER_RUNNERS = ("tmux", "acp")  # the runners whose agents are the relay's bundle members


class SlotLike(Protocol):
    """What the relay reads of a supervisor slot."""

    @property
    def plan(self) -> AgentPlan: ...
    @property
    def runner(self) -> AgentRunner: ...
    @property
    def uid(self) -> int: ...


class Agents(Protocol):
    """The supervisor as the relay sees it: the fleet's slots, the identity registry, and each
    agent's lock (held around every start / stop, as ctl and reconciliation hold it)."""

    @property
    def slots(self) -> Mapping[str, SlotLike]: ...
    @property
    def identities(self) -> Identities: ...
    def agent_held(self, agent_id: str) -> contextlib.AbstractAsyncContextManager[None]: ...


def operator_layers(env: Mapping[str, str]) -> tuple[Path, ...]:
    """The operator's layers, by agentmux's precedence (the relay tools' own resolution)."""
    return configuration_roots((), env)


GENERATED = "# generated by mcphost supervise from the fleet file\n"


def fleet_bundle(
    bundle_id: str, members: Sequence[tuple[AgentPlan, str, Sequence[str]]], path: Path
) -> Bundle:
    """The bundle of (plan, workspace, argv) members, in fleet order: the one model the relay
    reads from memory and `_write_layer` writes to `path` (its tmux and ACP members; its coders
    to `coders.toml`, its process members to the side file) for file readers, so the two cannot
    disagree. Each member's coder is `fleet-<agent id>`, of the
    agent's runner: an ACP stdio coder, a process coder (a member that speaks through its relay
    tools but to which nothing can be delivered: listed as what it is, refused as a target), or
    a tmux coder (readiness: the output held still). The command is for information: the
    runner starts the agent, the relay never does."""
    sessions: list[Session] = []
    coders: dict[str, Coder] = {}
    for plan, workspace, argv in members:
        coder = _coder(CODER_PREFIX + plan.agent_id, plan, argv)
        coders[coder.id] = coder
        sessions.append(
            Session(
                id=plan.agent_id,
                directory=workspace,
                kind="coder",
                transport=coder.transport,
                policy=plan.policy,
                coder=coder.id,
            )
        )
    return Bundle(id=bundle_id, path=path, sessions=tuple(sessions), coders=coders)


def _coder(coder_id: str, plan: AgentPlan, argv: Sequence[str]) -> Coder:
    """The coder of `plan`'s runner (`fleet_bundle`)."""
    if plan.runner == "acp":
        acp = AcpCoder(channel="stdio", command=shlex.join(argv) or "-")
        return Coder(id=coder_id, transport="acp", acp=acp)
    command = shlex.join(argv) or plan.agent_id
    if plan.runner == "process":
        return Coder(id=coder_id, transport="process", process=ProcessCoder(command))
    return Coder(id=coder_id, transport="tmux", tmux=TmuxCoder(initial_command=command))


def _private_dir(path: Path) -> None:
    try:
        fsutil.private_dir(path, parents=True)
    except fsutil.NotPrivate:
        raise RelayError(
            "security_foreign_owned", f"{path} is not a directory owned by the supervisor's user"
        ) from None


class RelayHost:
    """The relay root, the bundles' tmux servers, `BundleHost`, and the relay socket."""

    def __init__(
        self,
        state_dir: str,
        env: Mapping[str, str],
        agents: Agents,
        *,
        watch: tm.Watch | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.root = Path(state_dir, RELAY_DIR)
        self.config = self.root / CONFIG_DIR
        self.env = dict(env)
        self.agents = agents
        self.external = bool(self.env.get("AGENTMUX_STATE_DIRECTORY", "").strip())
        self.layers = operator_layers(self.env)
        self._watch = watch
        self.servers: dict[str, tm.TmuxServer] = {}
        self.fleet_bundles: dict[str, Bundle] = {}  # the relay's in-memory layer
        self.behaviour: RelayBehaviour | None = None
        self.server: RelayServer | None = None
        self._swept = False

    # -- layout -------------------------------------------------------------------------------
    @property
    def configuration_roots(self) -> tuple[Path, ...]:
        return (self.config, *self.layers)

    @property
    def serving(self) -> bool:
        return self.server is not None

    def tools_env(self, base: Mapping[str, str]) -> dict[str, str]:
        """The environment the in-process relay tools resolve their layout from: our roots when
        we serve the relay, the operator's otherwise."""
        env = dict(base)
        if self.serving:
            env["AGENTMUX_STATE_DIRECTORY"] = str(self.root)
            env["AGENTMUX_CONFIGURATION_DIRECTORY"] = ":".join(
                str(r) for r in self.configuration_roots
            )
        return env

    def tmux_server(self, bundle: str) -> tm.TmuxServer:
        server = self.servers.get(bundle)
        if server is None:
            runtime = self.root / "bundles" / bundle
            program = tm.program(self.env)  # without tmux: each spawn fails, naming it
            server = self.servers[bundle] = tm.TmuxServer(runtime, tmux=program, watch=self._watch)
        return server

    # -- the fleet ----------------------------------------------------------------------------
    async def configure(self, fleet: Fleet) -> None:
        """Build the fleet's bundles (`fleet_bundle`) and write them as the generated layer,
        sweep what an earlier supervisor left in tmux (once), and start serving once a bundle
        exists."""
        members: dict[str, list[tuple[AgentPlan, str, list[str]]]] = {}
        for plan in fleet.agents:
            if plan.bundle is not None:
                workspace = home_paths(self.state_dir, plan.agent_id, plan.client).workspace
                members.setdefault(plan.bundle, []).append((plan, workspace, self._argv(plan)))
        if not members and not self.root.exists():
            return
        bundles = {
            bundle: fleet_bundle(bundle, of, self.config / "bundles" / f"{bundle}.toml")
            for bundle, of in members.items()
        }
        await asyncio.to_thread(self._write_layer, bundles)  # fsyncs: off the loop
        self.fleet_bundles = bundles
        if not self._swept:
            self._swept = True
            await self._sweep()
        if bundles and not self.serving and not self.external:
            await self._serve()

    def _write_layer(self, bundles: Mapping[str, Bundle]) -> None:
        """The generated layer (`layer_toml`: agentmux's files and mcphost's side file), written
        from the models the relay reads in memory; a bundle gone from the fleet is gone from
        it."""
        _private_dir(self.root)
        _private_dir(self.config)
        for relative, text in layer_toml(bundles.values(), GENERATED).items():
            _private_dir((self.config / relative).parent)
            fsutil.write_atomic(self.config / relative, text)
        for entry in os.listdir(self.config / "bundles"):
            if entry.endswith(".toml") and entry[: -len(".toml")] not in bundles:
                with contextlib.suppress(OSError):
                    os.unlink(self.config / "bundles" / entry)

    def _argv(self, plan: AgentPlan) -> list[str]:
        """The agent's argv, for the coder's `initial-command` (informational: the runner
        starts the agent, the relay never does)."""
        try:
            return agent_argv(plan, home_paths(self.state_dir, plan.agent_id, plan.client))
        except ValueError:
            return [plan.agent_id]

    async def _sweep(self) -> None:
        """Kill the owned sessions and tmux servers a crashed supervisor left behind."""
        directory = self.root / "bundles"
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            return
        for name in names:
            if not (directory / name / tm.TMUX_SOCKET).exists():
                continue
            server = self.tmux_server(name)
            try:
                sessions = await server.sessions()
                for session, owned in sessions.items():
                    if owned:
                        await server.kill_session(session, grace=2.0)
                await server.kill_server()
                events.emit("supervisor.relay_swept", bundle=name, sessions=len(sessions))
            except tm.TmuxError as exc:
                events.emit(
                    "supervisor.relay_sweep_failed", level="warning", bundle=name, error=exc.message
                )

    async def _serve(self) -> None:
        from mcphost.relay.behaviour import RelayBehaviour
        from mcphost.relay.server import RelayServer

        behaviour = RelayBehaviour(
            self.layers,  # the fleet's bundles come from memory (`bundles`), not the files
            self.root,
            self,
            socket_trust=self.socket_trust,
            bundles=self.bundles,
            environ=self.env,
        )
        server = RelayServer(
            str(self.root / SOCKET),
            authenticate=behaviour.authenticate,
            handle=behaviour.handle,
            inscribe=behaviour.inscribe,
            admit=behaviour.admit,
            registry=behaviour.connections,
        )
        await server.start()
        self.behaviour, self.server = behaviour, server
        events.emit("supervisor.relay_serving", socket=server.path)

    async def aclose(self) -> None:
        """Stop serving, drop queued deliveries, end every tmux server we started (the runners
        were stopped first: only empty servers or strays remain)."""
        if self.server is not None:
            await self.server.aclose()
        if self.behaviour is not None:
            await self.behaviour.aclose()
        for server in self.servers.values():
            with contextlib.suppress(tm.TmuxError):
                for session, owned in (await server.sessions()).items():
                    if owned:
                        await server.kill_session(session, grace=2.0)
                await server.kill_server()

    def bundles(self) -> Mapping[str, Bundle]:
        """The relay's in-memory layer: the fleet's bundles, as last configured."""
        return self.fleet_bundles

    def tools_stream(
        self, layout: Layout, on_events: Callable[[int], None], on_note: Callable[..., None]
    ) -> Stream:
        """The stream of an agent's relay tools (`layout`: the agent the kernel identified when
        its session attached, in its bundle): an in-process session of the relay we serve,
        speaking as `<agent>@<bundle>` (no socket, no hello); the relay's socket when we serve
        none (an external relay)."""
        from mcphost.relaytools.cli import make_stream
        from mcphost.relaytools.settings import RelayTimeouts
        from mcphost.relaytools.stream import InProcessStream

        server = self.server
        if server is None:
            return make_stream(layout, on_events, on_note)
        principal_id = layout.principal_id
        return InProcessStream(
            lambda on_event: server.local_session(principal_id, on_event),
            principal_id,
            request_timeout=RelayTimeouts.from_env().request_s,
            on_events=on_events,
        )

    # -- identity -----------------------------------------------------------------------------
    def socket_trust(self, principal_id: str, cred: peer.PeerCred | None) -> bool:
        """Whether the kernel vouches for `cred` as `principal_id` (module doc)."""
        try:
            claimed = parse_principal(principal_id)
        except RelayError:
            return False
        if claimed.kind != "session" or cred is None:
            return False
        slot = self.agents.slots.get(claimed.name)
        if slot is None or slot.plan.bundle != claimed.namespace:
            return False
        try:
            agent_id, _generation = self.agents.identities.vouch(cred, self._uid_of)
        except Refused:
            return False
        return agent_id == claimed.name

    def _uid_of(self, agent_id: str) -> int | None:
        slot = self.agents.slots.get(agent_id)
        return None if slot is None else slot.uid

    # -- BundleHost ---------------------------------------------------------------------------
    def _member(self, bundle: str, agent_id: str) -> AgentRunner | None:
        slot = self.agents.slots.get(agent_id)
        if slot is None or slot.plan.bundle != bundle or slot.plan.runner not in MEMBER_RUNNERS:
            return None
        return slot.runner

    def _members(self, bundle: str) -> list[str]:
        return [a for a in self.agents.slots if self._member(bundle, a) is not None]

    def hosted(self, bundle: Bundle) -> bool:
        runners = (self._member(bundle.id, a) for a in self._members(bundle.id))
        return any(r is not None and r.status().state.active for r in runners)

    async def up(self, bundle: Bundle) -> None:
        members = self._members(bundle.id)
        if not members:
            raise RelayError(
                STARTUP_FAILED,
                f'bundle {bundle.id!r} has no agent with runner = "tmux" or "acp" in the fleet: '
                "add one to the fleet file and reload",
            )
        for agent_id in members:
            await self._start_or_stop(bundle.id, agent_id, up=True)

    async def down(self, bundle: Bundle) -> None:
        await asyncio.gather(
            *(self._start_or_stop(bundle.id, a, up=False) for a in self._members(bundle.id))
        )

    async def _start_or_stop(self, bundle: str, agent_id: str, *, up: bool) -> None:
        """Under the agent's lock, its runner *then* (a reload in between replaced or removed
        it): never a runner the supervisor has closed."""
        async with self.agents.agent_held(agent_id):
            runner = self._member(bundle, agent_id)
            if runner is None:
                return
            if not up:
                await runner.stop()
            elif not runner.status().state.active:
                await runner.start()

    def queue_depth(self, bundle: str | None, agent_id: str) -> int | None:
        """Items waiting in the relay's delivery queue to `agent_id` (its member session of
        `bundle`, named as the agent): `ctl status`. None when the agent has no bundle or this
        supervisor serves no relay (an external one holds the queues)."""
        if bundle is None or self.behaviour is None:
            return None
        worker = self.behaviour.state.workers.get((bundle, agent_id))
        return 0 if worker is None else len(worker.queue)

    def member_endpoint(self, bundle: Bundle, session_id: str) -> Endpoint | None:
        """A member's endpoint, as its runner gives it (`AgentRunner.endpoint`)."""
        runner = self._member(bundle.id, session_id)
        return None if runner is None else runner.endpoint()

    def member_state(self, bundle: Bundle, session_id: str) -> tuple[bool, MemberHealth]:
        """Ready as its runner says (`AgentRunner.ready`); failed (counted) or ended (stopped)
        as its state says."""
        from mcphost.relay.behaviour import MemberHealth

        runner = self._member(bundle.id, session_id)
        if runner is None:
            return False, MemberHealth()
        state = runner.status().state
        failures = int(state == AgentState.FAILED)
        return runner.ready(), MemberHealth(startup_failure_count=failures, stopped=state.ended)
