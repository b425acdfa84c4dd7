"""Where things are and who we are (mcphost/relaytools/layout.py): roots, association, the
identity token."""

from __future__ import annotations

from pathlib import Path

from mcphost.relaytools import layout
from mcphost.testing.relayharness import Env


def test_roots_precedence(tmp_path: Path) -> None:
    env = {"HOME": "/h", "XDG_CONFIG_HOME": "/xc", "XDG_STATE_HOME": "/xs"}
    assert layout.configuration_roots([], env) == (Path("/xc/agentmux"),)
    assert layout.state_root(None, env) == Path("/xs/agentmux")
    assert layout.state_root(None, {"HOME": "/h"}) == Path("/h/.local/state/agentmux")
    env["AGENTMUX_CONFIGURATION_DIRECTORY"] = "/a:/b"
    env["AGENTMUX_STATE_DIRECTORY"] = "/st"
    assert layout.configuration_roots([], env) == (Path("/a"), Path("/b"))
    assert layout.state_root(None, env) == Path("/st")
    assert layout.configuration_roots(["/f"], env) == (Path("/f"),)
    assert layout.state_root("/g", env) == Path("/g")


def test_association(env: Env) -> None:
    base = {"configuration_flags": [str(env.config)], "state_flag": str(env.state)}
    ok = layout.resolve(bundle_flag="party", session_flag="alpha", env={}, **base)
    assert ok.associated and ok.principal_id == "alpha@party"
    assert [m.transport for m in ok.members] == ["tmux", "tmux", "acp"]
    assert ok.socket_path == env.state / "relay.sock"
    assert ok.inscriptions_root == env.state / "inscriptions"
    via_env = layout.resolve(env={"AGENTMUX_BUNDLE": "party", "AGENTMUX_SESSION": "bravo"}, **base)
    assert via_env.principal_id == "bravo@party"
    bare = layout.resolve(env={}, **base)
    assert not bare.associated and bare.fault is None and bare.reason == "no_bundle"
    by_cwd = layout.resolve(
        env={"AGENTMUX_BUNDLE": "party"}, cwd=str(env.root / "work/charlie"), **base
    )
    assert by_cwd.session == "charlie"
    outsider = layout.resolve(bundle_flag="party", session_flag="zed", env={}, **base)
    assert outsider.fault and outsider.fault.code == "validation_unknown_sender"
    unknown = layout.resolve(bundle_flag="nope", session_flag="alpha", env={}, **base)
    assert unknown.fault and unknown.fault.code == "validation_unknown_bundle"
    implicit = layout.resolve(default_bundle="nope", env={}, **base)
    assert implicit.fault is None and not implicit.associated
    (env.config / "mcp.toml").write_text('bundle_name = "party"\nsession_name = "bravo"\n')
    from_file = layout.resolve(env={}, **base)
    assert from_file.principal_id == "bravo@party"
    assert layout.resolve(env={}, **base).configured_bundles() == ["alpha", "party", "zeta"]


def test_identity_token(env: Env) -> None:
    lay = layout.resolve(
        bundle_flag="party",
        session_flag="alpha",
        configuration_flags=[str(env.config)],
        state_flag=str(env.state),
        env={},
    )
    assert lay.identity_token() == "socket-trust"
    psk = env.state / "bundles/party/sessions/alpha/identity.psk"
    psk.parent.mkdir(parents=True)
    psk.write_text("  c2VjcmV0\n")
    assert lay.identity_token() == "c2VjcmV0"
