"""Shared pytest configuration: anyio on asyncio only, and hypothesis without a database.

The suite runs in parallel (pytest-xdist): every worker is its own process with its own
session fixtures (each starts its own reference center, on its own sockets under its own
`tmp_path_factory` directory, TCP on port 0). Hypothesis keeps no example database, so workers
never share a `.hypothesis/` directory and a run does not depend on what earlier runs found;
a failure prints its reproduction blob instead.

A suite started in the background by a non-interactive shell (`make test &`, a CI wrapper)
inherits SIGINT ignored, and every process it starts would inherit that too, so the tests that
press Ctrl-C on a child (`ctl logs --follow`, `ctl exec`) would wait for an exit that never
comes. The default disposition is restored here, in the controller and in every worker.
"""

import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

settings.register_profile("mcphost", database=None, print_blob=True)
settings.load_profile("mcphost")


@pytest.fixture(scope="session", autouse=True)
def _remove_supervisor_state_dirs() -> Iterator[None]:
    """At the end of this test process, the supervisors' state directories under /tmp go too."""
    yield
    harness = sys.modules.get("tests.supervisor.supervise_harness")
    for state in getattr(harness, "STATE_DIRS", []):
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# The suite's two tiers. `make test` (before every commit, under 90 s on this project's 2-CPU
# machines) runs every unit and in-process test plus one black-box path per surface: the host
# both standalone and supervised (blackbox/test_host.py), the file tools (host/files/test_tools.py),
# the relay tools (relaytools/test_relaytools_blackbox.py), the supervisor
# (supervisor/test_supervise.py, test_ctl.py) and the relay it hosts
# (supervisor/test_relay_hosting.py), and the identity property test. The files below prove
# one property in depth, each driving many real processes; they are marked `deep`, and
# `make test-slow` runs them with the `slow` tests and the `thorough` ones at full depth. CI
# runs both tiers, so nothing is skipped before a change lands.
DEEP = {
    "blackbox/test_claude_code.py": "the Claude Code CLI (node) against generated configs",
    "blackbox/test_default_agents.py": "the real Claude Code and Codex TUIs kept up 30 s each",
    "blackbox/test_fenced_claude.py": "the real Claude Code completing a turn inside the fence",
    "blackbox/test_fenced_codex.py": "the real Codex CLI completing a turn inside the fence",
    "blackbox/test_inspector.py": "the MCP Inspector CLI (node), one host per method and era",
    "blackbox/test_process.py": "the host process's own life: bindings, signals, stdout",
    "blackbox/test_ts_sdk.py": "the TypeScript SDK's stdio client (node)",
    "configgen/test_configgen_cli.py": "the configgen CLI as a process, option by option",
    "configgen/test_configgen_roundtrip.py": "every client's generated config starts a host",
    "devcenter/test_process.py": "the reference center as a process",
    "host/files/test_cancel_e2e.py": "cancellation mid-transfer with the center frozen",
    "host/files/test_race.py": "transfers while a thread swaps the workspace under them",
    "host/files/test_workspace_hardening.py": "the workspace attack scenarios, host by host",
    "hardening/test_argument_bounds.py": "argument size and shape bounds, with peak memory",
    "hardening/test_burst.py": "thousands of concurrent calls held by the center",
    "hardening/test_center_schemathesis.py": "the center against its OpenAPI document",
    "hardening/test_deep_json.py": "nesting bombs from the center",
    "hardening/test_faults.py": "center faults: kills, error statuses, slowness",
    "hardening/test_lifecycle.py": "signals and parent death with calls in flight",
    "hardening/test_load.py": "sequential and concurrent load with bounded memory",
    "hardening/test_pinning.py": "TLS pins: rotation, expiry, stalled handshakes",
    "hardening/test_protocol_fuzz.py": "hypothesis over malformed protocol input",
    "hardening/test_redirects.py": "redirects from the center are refused",
    "hardening/test_relaytools_security.py": "the relay tools' identity and PSK handling",
    "hardening/test_secrets_and_stdout.py": "the token on every error path and output",
    "hardening/test_stdio_wire.py": "stdio framing, caps and backpressure floods",
    "hardening/test_token_hygiene.py": "token sources and option sweeps",
    "relaytools/test_relaytools_member_ids.py": "hostile member ids through the relay tools",
    "relaytools/test_relaytools_realrelay.py": "the relay tools against the real relay",
    "supervisor/test_demo_fleet.py": "`mcphost demo fleet` twice, whole (~4 s of CPU each)",
    "supervisor/test_fence.py": "five supervisors (root and nobody) with hostile fenced agents",
    "supervisor/test_exec.py": "ctl exec, including Claude Code's mcp list",
    "supervisor/test_lifecycle.py": "restart policies and backoff of real processes",
    "supervisor/test_relay_send_bounds.py": "send's text-only paste and a 300 MiB send flood",
    "supervisor/test_sessions.py": "the session hub: caps, floods, generations",
    "supervisor/test_supervise_centerfleet.py": "the fleet from the center",
    "supervisor/test_supervise_generations.py": "three workers moving one agent: generations",
    "supervisor/test_supervise_rotation.py": "token rotations with calls in flight",
    "supervisor/test_supervise_lifecycle.py": "restarts, reloads and generations over time",
    "supervisor/test_supervise_relay.py": "the relay tools through the supervisor",
    "supervisor/test_supervise_shares.py": "one agent's flood and slow calls against a supervisor",
    "supervisor/test_supervise_user.py": "agents under another user",
}
TESTS = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before `-m` selects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    missing = [name for name in DEEP if not (TESTS / name).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py DEEP names files that do not exist: {missing}")
    for item in items:
        if item.path.is_relative_to(TESTS) and item.path.relative_to(TESTS).as_posix() in DEEP:
            item.add_marker(pytest.mark.deep)
