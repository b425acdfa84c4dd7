"""Black-box fixtures: the real reference center, the real `mcphost host`, the real SDK client.

`host` runs the host's black-box suite both ways (issue 12: every tool behaves as the
standalone host does): `standalone` is `mcphost host` with env bindings; `supervised` is one
real `mcphost supervise` per module whose agents hold still, with the server command
`mcphost ctl exec AGENT -- python3 -I -S attach.py <center.sock>` (the pump, inside the agent).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from mcp import Client, StdioServerParameters

from mcphost.testing import DevCenter

if TYPE_CHECKING:
    from tests.supervisor.supervise_harness import Supervised

HOST_ARGS = ["-m", "mcphost.cli", "host"]
# The real CLIs' background traffic off (updates, telemetry, error reports): loopback only.
QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
}


def needs_clis(*programs: Path) -> list[pytest.MarkDecorator]:
    """The marks of a file that drives the real CLIs in tmux panes (deep: make test-slow)."""
    return [
        pytest.mark.deep,
        pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
        *(
            pytest.mark.skipif(not p.exists(), reason=f"{p} missing: run `make node`")
            for p in programs
        ),
    ]


def listed_agents(out: str) -> list[str]:
    """The homes the probe's `ls <state>/agents` listed (none where it was refused: the fence
    makes that directory 0711, owned by whoever runs bubblewrap, so an agent of its own uid
    under a root supervisor lists nothing)."""
    line = next(line for line in out.splitlines() if line.startswith("agents="))
    return line.removeprefix("agents=").split()


def sandbox_probe(token_file: Path, state: Path, grep: str = "grep") -> list[str]:
    """Shell commands a nested sandbox's command runs: what of the fence it can reach (the
    token, the state, other homes), whose namespace and seccomp it is in, and whether it may
    write the agent's home."""
    return [
        f"test -e {token_file} || echo token-hidden",
        f"test -e {state}/state.sqlite3 || echo state-hidden",
        f'echo "agents=$(ls {state}/agents)"',
        f"{grep} -E '^(NSpid|Seccomp):' /proc/self/status",
        '(echo x > "$HOME/home-probe") 2>/dev/null && echo home-written || echo home-refused',
    ]


HOLD = [sys.executable, "-c", "import signal; signal.pause()"]
UNTIERED = "agent-1-untiered"  # supervised: tier_tools is per agent in the fleet file


@pytest.fixture(scope="session")
def center(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCenter]:
    """One center for the standalone hosts (generation 0). A test that runs agent-1 under a
    supervisor takes `own_center`: its spawn raises the center's fence for agent-1 to >= 1,
    and a shared center would then refuse every later standalone call (`stale_generation`)."""
    with DevCenter.start(
        tmp_path_factory.mktemp("center"), unix=True, tcp=True, runtime_socket=True, control=True
    ) as running:
        yield running


@pytest.fixture
def own_center(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCenter]:
    """A center of the test's own, for a supervisor whose agents reach generation >= 1."""
    with DevCenter.start(
        tmp_path_factory.mktemp("own-center"),
        unix=True,
        tcp=True,
        runtime_socket=True,
        control=True,
    ) as running:
        yield running


@asynccontextmanager
async def open_host(env: dict[str, str], **client_options: Any) -> AsyncIterator[Client]:
    """The real host process, driven by the official SDK client over stdio."""
    params = StdioServerParameters(command=sys.executable, args=HOST_ARGS, env=env)
    async with Client(params, mode="legacy", **client_options) as client:
        yield client


async def call(client: Client, tool: str, args: dict[str, Any]) -> tuple[bool, Any]:
    """Call a tool; return (is_error, parsed JSON text)."""
    result = await client.call_tool(tool, args)
    text = result.content[0].text
    try:
        return bool(result.is_error), json.loads(text)
    except ValueError:
        return bool(result.is_error), text


def admin_bodies(center: DevCenter, since: int = 0) -> list[dict[str, Any]]:
    return [
        r["body"]
        for r in center.requests(500)[since:]
        if str(r.get("route", "")).startswith("/admin/") and isinstance(r.get("body"), dict)
    ]


def project_root() -> Path:
    return Path(__file__).resolve().parents[2]


class HostUnderTest:
    """The center tools as an agent's MCP client meets them: standalone or supervised."""

    def __init__(self, mode: str, center: DevCenter, sv: Supervised | None = None) -> None:
        self.mode = mode
        self.center = center
        self.sv = sv
        self.agent_id = center.agent_id

    @property
    def workspace(self) -> Path:
        """The agent's file root: `center.agent_root`, or its home workspace when supervised."""
        if self.sv is None:
            return Path(self.center.agent_root)
        return self.sv.workspace(self.agent_id)

    def generation(self, agent_id: str | None = None) -> int:
        """The generation the center sees: the standalone host's `AC_MCP_GENERATION` (unset:
        0), or the agent's current spawn under the supervisor."""
        if self.sv is None:
            return 0
        return int(self.sv.status()[agent_id or self.agent_id]["generation"])

    def params(self, *, tier_tools: bool = True) -> StdioServerParameters:
        if self.sv is None:
            env = self.center.binding_env("unix", **({} if tier_tools else {"tier_tools": "false"}))
            return StdioServerParameters(command=sys.executable, args=HOST_ARGS, env=env)
        from tests.supervisor.supervise_harness import REPO

        agent = self.agent_id if tier_tools else UNTIERED
        pump = [sys.executable, "-I", "-S", f"{REPO}/mcphost/attach.py"]
        pump.append(str(self.sv.state / "run" / "center.sock"))
        ctl = ["-m", "mcphost", "ctl", "--state", str(self.sv.state), "exec", agent, "--"]
        return StdioServerParameters(command=sys.executable, args=ctl + pump, env=self.sv.env())

    @asynccontextmanager
    async def open(
        self, *, tier_tools: bool = True, **client_options: Any
    ) -> AsyncIterator[Client]:
        async with Client(self.params(tier_tools=tier_tools), mode="legacy", **client_options) as c:
            yield c


@pytest.fixture(scope="module", params=["standalone", "supervised"])
def host(request: pytest.FixtureRequest, center: DevCenter) -> Iterator[HostUnderTest]:
    if request.param == "standalone":
        yield HostUnderTest("standalone", center)
        return

    # Its own center: the supervised agent-1 runs at generation >= 1, and the center's fence
    # would refuse the standalone tests' generation 0 on a shared one.
    base = Path(tempfile.mkdtemp(prefix="host-sv-"))
    with DevCenter.start(
        base / "center", unix=True, tcp=True, runtime_socket=True, control=True
    ) as own:
        yield from _supervised(base, own)


def _supervised(base: Path, center: DevCenter) -> Iterator[HostUnderTest]:
    from tests.supervisor.supervise_harness import Supervised

    sv = Supervised(base, center)
    center_keys = {"runtime_socket": str(center.runtime_socket)} if center.runtime_socket else {}
    sv.write_fleet(
        [
            {"id": center.agent_id, "command": HOLD},
            {"id": UNTIERED, "command": HOLD, "tier_tools": False},
        ],
        center_keys,
    )
    try:
        sv.start()
        sv.wait_running(center.agent_id)
        sv.wait_running(UNTIERED)
        yield HostUnderTest("supervised", center, sv)
    finally:
        sv.close()
