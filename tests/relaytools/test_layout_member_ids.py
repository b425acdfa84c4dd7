"""Bundle member ids and session names follow agentmux's session-id grammar (issue 10, item 10f).

A member id is a path segment of `<state>/bundles/<bundle>/sessions/<id>/identity.psk`; an id like
`../../x` made the real `mcphost relay-tools` read a PSK from outside `sessions/` and present it
to the relay at Hello. Now such a bundle (and such a `--session-name`) is a retained startup
fault: the server starts, relay-backed tools report the fault, the relay is never dialled, and
the PSK is never read. configgen refuses the same names.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import MCPError

from mcphost.testing.relayharness import Env, FakeRelay, sdk_client, tool_json

# deep (make test-slow): hostile member ids through the relay tools.
pytestmark = pytest.mark.deep

ROOT = Path(__file__).resolve().parents[2]
STOLEN = "c3RvbGVuLXBzay1vdXRzaWRlLXNlc3Npb25z"
ESCAPE = "../../../../outside"  # from <state>/bundles/evil/sessions/ up to the test root

EVIL_BUNDLE = """\
format-version = 1

[[sessions]]
id = "{member}"
directory = "{root}/work/alpha"
coder = "default"

[[sessions]]
id = "bravo"
directory = "{root}/work/bravo"
coder = "default"
"""


def plant(env: Env, member: str) -> Path:
    """A bundle `evil` with `member`, and a PSK where `member` would lead out of `sessions/`."""
    (env.config / "bundles" / "evil.toml").write_text(
        EVIL_BUNDLE.format(member=member, root=env.root)
    )
    sessions = env.state / "bundles" / "evil" / "sessions"
    (sessions / "a").mkdir(parents=True, exist_ok=True)  # as on a relay that minted other PSKs
    target = sessions / member / "identity.psk"
    target = Path(os.path.normpath(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(STOLEN + "\n")
    return target


def args(env: Env, session: str) -> list[str]:
    # `--flag=value`: a session name starting with `-` would otherwise read as an option
    return [*env.args(bundle="evil", session=None), f"--session-name={session}"]


async def refused(env: Env, relay: FakeRelay, session: str) -> Any:
    """Call a relay-backed tool; it must fail with a startup fault before any relay traffic."""
    error: MCPError | None = None
    async with sdk_client(env, args(env, session)) as c:
        try:
            await c.call_tool("updown", {"command": "up"})
        except MCPError as exc:
            error = exc
        help_doc = tool_json(await c.call_tool("help", {}))
    presented = [h.get("identity_token") == STOLEN for h in relay.hellos]
    assert relay.connections == 0 and relay.hellos == [], (
        f"relay dialled; PSK presented: {presented}"
    )
    assert error is not None, "the relay-backed tool was not refused"
    assert help_doc["association"]["associated"] is False
    data = error.error.data
    assert data["details"]["reason"] == "startup_fault", data
    assert STOLEN not in str(data)
    return data


@pytest.mark.anyio
@pytest.mark.parametrize("member", [ESCAPE, "../x", "a/../../../../outside", ".", "..", "-x"])
async def test_member_id_outside_the_grammar_never_reads_a_psk(
    env: Env, relay: FakeRelay, member: str
) -> None:
    psk = plant(env, member)
    assert psk.exists()
    relay.respond("up", {"kind": "bundle_transition", "schema_version": "1"})
    data = await refused(env, relay, member)
    assert data["code"].startswith("validation_"), data


@pytest.mark.anyio
async def test_a_bad_member_fails_the_bundle_even_for_a_good_session(
    env: Env, relay: FakeRelay
) -> None:
    plant(env, ESCAPE)
    relay.respond("up", {"kind": "bundle_transition", "schema_version": "1"})
    data = await refused(env, relay, "bravo")
    message = data["details"]["startup_fault_message"]
    assert "session id" in message and "evil" in message and "expected" in message, message


@pytest.mark.anyio
async def test_a_good_member_still_presents_its_psk(env: Env, relay: FakeRelay) -> None:
    plant(env, "bravo")
    relay.respond("up", {"kind": "bundle_transition", "schema_version": "1"})
    async with sdk_client(env, args(env, "bravo")) as c:
        result = await c.call_tool("updown", {"command": "up"})
    assert not result.is_error, result
    assert [h["identity_token"] for h in relay.hellos] == [STOLEN]


@pytest.mark.parametrize("session", [ESCAPE, "../x", "a.b", "1st", "x" * 32])
def test_configgen_refuses_a_session_name_outside_the_grammar(session: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "configgen",
            "claude",
            "--bundle",
            "party",
            f"--session-name={session}",
            "--mcphost-command",
            "/opt/bin/mcphost",
        ],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2, proc.stdout
    assert proc.stdout == ""
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1
    assert "relay session name" in line and "expected" in line and "letter" in line, line
