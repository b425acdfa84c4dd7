"""A real relay for tests: the configuration tree, a real `BundleHost` on real tmux, and a
`RelayServer` + `RelayBehaviour` running on their own event loop in a background thread.

- `config_tree(root)`: the bundle `party` (alpha: operator, named "Alpha"; bravo and charlie:
  the file default), each member a tiny interactive stand-in that prints the prompt `> ` and
  echoes what it reads (the coder's `prompt-regex` matches the prompt, so the readiness gate is
  real); the bundle `mixed` (a tmux lead, an ACP member: the stand-in ACP agent of
  acp_agent.py, a UI member and a pty member); `policies.toml`
  (`default`: list, look, send at home; `operator`: everything) and `users.toml` (`op@GLOBAL`).
- `TmuxHost`: a small real `BundleHost`, one `TmuxServer` per bundle under `<state>/bundles`,
  as the supervisor's `RelayHost` is, and each ACP member a process of its own with its
  `AcpSession` (`AcpProcess`, as the supervisor's `AcpRunner` is, without the fence); the members of a bundle it took `down` are stopped
  (`MemberHealth.stopped`) until it is `up` again, as an operator's stop makes them there.
- `RealRelay`: the relay on `<state>/relay.sock` with `TmuxHost`, the bundle `party` up, on a
  thread of its own, so a test's blocking calls (or another process, such as the real `mcphost
  relay-tools`) talk to it over the socket. Socket trust is the kernel's word that the peer runs
  as this uid, for the principals in `trusted`. It records each hello (principal, socket trust
  or not, accepted or not; never the token) and each request frame it served.

Used by tests/relay/test_behaviour.py (in its own loop), tests/relay/test_inscriptions.py and
tests/relaytools/test_relay_tools_realrelay.py.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
import threading
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from mcphost.agentmux.bundlefile import Bundle, require_bundle
from mcphost.agentmux.wire import SOCKET_TRUST, Hello, Principal, Request
from mcphost.peer import PeerCred
from mcphost.relay.acp.session import AcpSession
from mcphost.relay.behaviour import MemberHealth, RelayBehaviour
from mcphost.relay.members.tmux import TmuxEndpoint
from mcphost.relay.server import RelayServer
from mcphost.relay.tmux import TmuxServer

T = TypeVar("T")
GUARD = 30.0  # only a hang reaches it
MEMBERS = ("alpha@party", "bravo@party", "charlie@party", "lead@mixed", "op@GLOBAL")

# The stand-in agent: prompt "> ", echo each line. "hold" makes it busy (no prompt) until it
# reads "release", so a test can keep the readiness gate closed for as long as it needs.
STAND_IN = """\
import sys
held = False
while True:
    if not held:
        sys.stdout.write("> ")
        sys.stdout.flush()
    line = sys.stdin.readline()
    if not line:
        break
    if line.strip() in ("hold", "release"):
        held = line.strip() == "hold"
        sys.stdout.write(("holding" if held else "released") + "\\n")
    else:
        sys.stdout.write("echo: " + line)
    sys.stdout.flush()
"""

POLICIES = """\
format-version = 1
default = "default"

[[policies]]
id = "default"
description = "list, look and send at home"
[policies.controls]
list = "home"
look = "home"
send = "home"

[[policies]]
id = "operator"
description = "everything"
[policies.controls]
list = "all"
look = "all"
send = "all"
raww = "all"
choose = "all"
updown = "all"
[policies.controls.new]
peer = "all"
[policies.controls.change]
psk = "all"
scope = "all"
[policies.controls.drop]
peer = "all"
"""


def config_tree(root: Path) -> tuple[Path, Path]:
    """(configuration root, state root) with bundles/party.toml, coders.toml, policies.toml,
    users.toml and the stand-in program."""
    config = root / "config"
    state = root / "state"
    work = root / "work"
    for path in (config / "bundles", state, work):
        path.mkdir(parents=True, mode=0o700)
    program = root / "standin.py"
    program.write_text(STAND_IN)
    command = f"{shlex.quote(sys.executable)} -u {shlex.quote(str(program))}"
    (config / "coders.toml").write_text(
        'format-version = 1\n\n[[coders]]\nid = "standin"\n[coders.tmux]\n'
        f"initial-command = {command!r}\n"
        "prompt-regex = '^>\\s*$'\nprompt-inspect-lines = 1\n"
        '\n[[coders]]\nid = "acpish"\n[coders.acp]\nchannel = "stdio"\n'
        f"command = {acp_command(root)!r}\n"
        '\n[[coders]]\nid = "term"\n[coders.pty]\ninitial-command = "sh"\n'
    )
    members = ""
    for member, extra in (("alpha", 'name = "Alpha"\npolicy = "operator"\n'), ("bravo", ""),
                          ("charlie", "")):  # fmt: skip
        members += (
            f'\n[[sessions]]\nid = "{member}"\n{extra}directory = "{work}"\ncoder = "standin"\n'
        )
    (config / "bundles" / "party.toml").write_text("format-version = 1\n" + members)
    # a bundle whose other members this relay cannot host: an ACP coder and a UI session
    (config / "bundles" / "mixed.toml").write_text(
        "format-version = 1\n"
        f'[[sessions]]\nid = "lead"\ndirectory = "{work}"\ncoder = "standin"\npolicy = "operator"\n'
        f'[[sessions]]\nid = "agent"\ndirectory = "{work}"\ncoder = "acpish"\n'
        '[[sessions]]\nid = "panel"\n[sessions.ui]\n'
        f'[[sessions]]\nid = "term"\ndirectory = "{work}"\ncoder = "term"\n'
    )
    (config / "policies.toml").write_text(POLICIES)
    (config / "users.toml").write_text(
        'format-version = 1\n\n[[sessions]]\nid = "op@GLOBAL"\npolicy = "operator"\n[sessions.ui]\n'
    )
    return config, state


def acp_command(root: Path) -> str:
    """The `acpish` coder's command: the stand-in ACP agent (mcphost/testing/acp_agent.py), its
    history under `root` so a restarted one can load its session. No spaces in the paths: ACP
    commands split on whitespace."""
    return f"{sys.executable} -I -m mcphost.testing.acp_agent --history {root}/acp-history.json"


@dataclass(eq=False)
class AcpProcess:
    """An ACP member the host runs: the coder's command with piped stdio, its `AcpSession`
    (bootstrapped with no MCP servers), the endpoint the relay's ACP kind reads (`session`,
    `idle_state`, `stopped`). `restart()` ends it and starts it again (loading its session)."""

    argv: list[str]
    cwd: str
    proc: asyncio.subprocess.Process | None = None
    session: AcpSession | None = None
    session_id: str | None = None
    stopped: bool = False
    starts: int = 0

    def idle_state(self) -> tuple[str, str | None]:
        return ("unavailable" if self.stopped else "recovering"), None

    async def start(self) -> None:
        self.starts += 1
        self.stopped = False
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, cwd=self.cwd, env=env, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            limit=16 << 20,
        )  # fmt: skip
        assert self.proc.stdout is not None and self.proc.stdin is not None
        session = AcpSession(self.proc.stdout, self.proc.stdin)
        self.session_id = await session.bootstrap(self.cwd, [], resume_session_id=self.session_id)
        self.session = session

    async def stop(self) -> None:
        self.stopped = True
        session, self.session = self.session, None
        if session is not None:
            await session.close()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()

    async def restart(self) -> None:
        await self.stop()
        await self.start()


@dataclass
class TmuxHost:
    """A real BundleHost: one TmuxServer per bundle under `<state>/bundles/<id>`."""

    state_root: Path
    servers: dict[str, TmuxServer] = field(default_factory=dict)
    pids: dict[tuple[str, str], int] = field(default_factory=dict)
    stopped: set[tuple[str, str]] = field(default_factory=set)
    acp: dict[tuple[str, str], AcpProcess] = field(default_factory=dict)
    ups: int = 0
    downs: int = 0

    def hosted(self, bundle: Bundle) -> bool:
        return bundle.id in self.servers

    async def up(self, bundle: Bundle) -> None:
        self.ups += 1
        server = TmuxServer(self.state_root / "bundles" / bundle.id)
        self.servers[bundle.id] = server
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.state_root)}
        for session in bundle.sessions:
            coder = bundle.coder_for(session)
            if coder is not None and coder.acp is not None and session.directory:
                key = (bundle.id, session.id)
                member = self.acp[key] = AcpProcess(coder.acp.argv(), session.directory)
                await member.start()
                self.stopped.discard(key)
                continue
            if coder is None or coder.tmux is None:
                continue  # a member no kind here hosts (ui, pty)
            assert session.directory
            argv = shlex.split(coder.tmux.command(session.coder_session_id))
            name = self.session_name(bundle, session.id)
            pid = await server.new_session(name, argv, session.directory, env)
            self.pids[(bundle.id, session.id)] = pid
            self.stopped.discard((bundle.id, session.id))

    async def down(self, bundle: Bundle) -> None:
        self.downs += 1
        server = self.servers.pop(bundle.id)
        for session in bundle.sessions:
            member = self.acp.pop((bundle.id, session.id), None)
            if member is not None:
                await member.stop()
            await server.kill_session(self.session_name(bundle, session.id))
            self.pids.pop((bundle.id, session.id), None)
            self.stopped.add((bundle.id, session.id))
        await server.kill_server()

    def member_endpoint(self, bundle: Bundle, session_id: str) -> object | None:
        member = self.acp.get((bundle.id, session_id))
        if member is not None:
            return member
        server = self.servers.get(bundle.id)
        return (
            None if server is None else TmuxEndpoint(server, self.session_name(bundle, session_id))
        )

    def session_name(self, bundle: Bundle, session_id: str) -> str:
        return f"{bundle.id}-{session_id}"

    def member_state(self, bundle: Bundle, session_id: str) -> tuple[bool, MemberHealth]:
        member = self.acp.get((bundle.id, session_id))
        if member is not None:
            alive = member.proc is not None and member.proc.returncode is None
            return alive, MemberHealth(stopped=member.stopped)
        pid = self.pids.get((bundle.id, session_id))
        alive = False
        if pid is not None:
            try:
                os.kill(pid, 0)
                alive = True
            except ProcessLookupError:
                alive = False
        return alive, MemberHealth(stopped=(bundle.id, session_id) in self.stopped)


class RealRelay:
    """The relay (server, behaviour, `TmuxHost`) on its own loop in a daemon thread."""

    def __init__(
        self,
        config: Path,
        state: Path,
        *,
        trusted: Iterable[str] = MEMBERS,
        hosted: Iterable[str] = ("party",),
        quiet_ms: int = 150,
        poll_ms: int = 20,
    ) -> None:
        self.config = config
        self.state = state
        self.trusted = set(trusted)
        self.hosted = tuple(hosted)
        self.quiet_ms = quiet_ms
        self.poll_ms = poll_ms
        self.socket = state / "relay.sock"
        self.hellos: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.host = TmuxHost(state)
        self.behaviour: RelayBehaviour | None = None
        self.server: RelayServer | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    # -- running ---------------------------------------------------------------------------------
    def start(self) -> RealRelay:
        self._thread.start()
        self.run(self._start)
        return self

    def stop(self) -> None:
        try:
            self.run(self._stop)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(GUARD)
            self._loop.close()

    def run(self, factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run `factory()` on the relay's loop and return its result (blocking)."""
        return asyncio.run_coroutine_threadsafe(factory(), self._loop).result(GUARD)

    async def arun(self, factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """`run` for a caller on another event loop (does not block it)."""
        future = asyncio.run_coroutine_threadsafe(factory(), self._loop)
        return await asyncio.wait_for(asyncio.wrap_future(future), GUARD)

    async def _start(self) -> None:
        behaviour = RelayBehaviour(
            [self.config], self.state, self.host, socket_trust=self._socket_trust,
            quiet_ms=self.quiet_ms, poll_ms=self.poll_ms, environ={},
        )  # fmt: skip
        server = RelayServer(
            str(self.socket),
            authenticate=self._authenticate,
            handle=self._handle,
            inscribe=behaviour.inscribe,
            registry=behaviour.connections,
            pre_hello_timeout=GUARD,
        )
        self.behaviour, self.server = behaviour, server
        for bundle_id in self.hosted:
            await self.host.up(require_bundle([self.config], bundle_id))
        await server.start()

    async def _stop(self) -> None:
        if self.server is not None:
            await self.server.aclose()
        if self.behaviour is not None:
            await self.behaviour.aclose()
        for member in list(self.host.acp.values()):
            await member.stop()
        self.host.acp.clear()
        for bundle_id, server in list(self.host.servers.items()):
            for name in await server.sessions():
                await server.kill_session(name)
            await server.kill_server()
            self.host.servers.pop(bundle_id, None)

    # -- the relay's hooks -----------------------------------------------------------------------
    def _socket_trust(self, principal_id: str, cred: PeerCred | None) -> bool:
        return cred is not None and cred.uid == os.geteuid() and principal_id in self.trusted

    def _authenticate(self, hello: Hello, cred: PeerCred | None) -> Principal:
        record: dict[str, Any] = {
            "principal_id": hello.principal_id,
            "socket_trust": hello.identity_token == SOCKET_TRUST,
            "accepted": False,
        }
        self.hellos.append(record)
        assert self.behaviour is not None
        principal = self.behaviour.authenticate(hello, cred)
        record["accepted"] = True
        return principal

    async def _handle(self, principal: Principal, request: Request) -> dict[str, Any]:
        body = request.body
        frame: dict[str, Any] = {
            "principal_id": principal.id,
            "request": body if isinstance(body, dict) else body.wire(),
        }
        if request.request_id is not None:
            frame["request_id"] = request.request_id
        if request.namespace is not None:
            frame["namespace"] = request.namespace
        self.requests.append(frame)
        assert self.behaviour is not None
        return await self.behaviour.handle(principal, request)

    def operations(self) -> list[str]:
        return [r["request"].get("operation") for r in self.requests]

    def pane(self, member: str, bundle: str = "party") -> list[str]:
        """The member's pane now (its last 1000 lines)."""
        server = self.host.servers.get(bundle)
        if server is None:
            return []
        return self.run(lambda: server.capture(f"{bundle}-{member}", 1000))
