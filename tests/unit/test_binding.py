"""AC_MCP_* parsing: defaults, trimming, every error names the variable and never the token."""

import hashlib
import os
from pathlib import Path

import pytest

from mcphost.binding import AgentBinding, BindingError

PIN = "sha256:" + ":".join(f"{b:02X}" for b in hashlib.sha256(b"x").digest())
BASE = {"AC_MCP_AGENT_ID": "agent-1", "AC_MCP_ADMIN_URL": "unix:/run/center.sock"}


def parse(**extra: str) -> AgentBinding:
    return AgentBinding.from_env({**BASE, **extra})


def error(**extra: str) -> BindingError:
    with pytest.raises(BindingError) as info:
        AgentBinding.from_env({**BASE, **extra})
    return info.value


def test_minimal_binding_has_documented_defaults() -> None:
    b = parse()
    assert b.agent_id == "agent-1"
    assert b.target.kind == "unix" and b.target.path == "/run/center.sock"
    assert b.tier_tools is True and b.generation == 0
    assert not b.token and b.pins == () and b.agent_root is None and b.runtime_socket is None


def test_values_are_trimmed() -> None:
    b = AgentBinding.from_env(
        {
            "AC_MCP_AGENT_ID": "  agent-1\n",
            "AC_MCP_ADMIN_URL": " tcp://127.0.0.1:8443 ",
            "AC_MCP_SERVER_FINGERPRINT": f" {PIN} ",
            "AC_MCP_GENERATION": " 7 ",
            "AC_MCP_TIER_TOOLS": " False ",
            "AC_MCP_WORKER_TOKEN": " acat_secret ",
        }
    )
    assert (b.agent_id, b.generation, b.tier_tools) == ("agent-1", 7, False)
    assert b.target.host == "127.0.0.1" and b.target.port == 8443
    assert b.token.reveal() == "acat_secret"


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"AC_MCP_AGENT_ID": ""}, "AC_MCP_AGENT_ID"),
        ({"AC_MCP_AGENT_ID": "bad id"}, "AC_MCP_AGENT_ID"),
        ({"AC_MCP_ADMIN_URL": ""}, "AC_MCP_ADMIN_URL"),
        ({"AC_MCP_ADMIN_URL": "http://host:80"}, "AC_MCP_ADMIN_URL"),
        ({"AC_MCP_ADMIN_URL": "unix:relative.sock"}, "AC_MCP_ADMIN_URL"),
        ({"AC_MCP_ADMIN_URL": "tcp://host"}, "AC_MCP_ADMIN_URL"),
        ({"AC_MCP_ADMIN_URL": "tcp://host:99999"}, "AC_MCP_ADMIN_URL"),
        ({"AC_MCP_ADMIN_URL": "tcp://host:1"}, "AC_MCP_SERVER_FINGERPRINT"),
        ({"AC_MCP_SERVER_FINGERPRINT": "sha256:nope"}, "AC_MCP_SERVER_FINGERPRINT"),
        ({"AC_MCP_TIER_TOOLS": "nope"}, "AC_MCP_TIER_TOOLS"),
        ({"AC_MCP_GENERATION": "-1"}, "AC_MCP_GENERATION"),
        ({"AC_MCP_GENERATION": "seven"}, "AC_MCP_GENERATION"),
        ({"AC_MCP_AGENT_ROOT": "relative/root"}, "AC_MCP_AGENT_ROOT"),
        ({"AC_MCP_RUNTIME_SOCKET": "rt.sock"}, "AC_MCP_RUNTIME_SOCKET"),
    ],
)
def test_errors_name_the_variable_and_show_the_value(env: dict[str, str], variable: str) -> None:
    err = error(**env)
    assert err.variable == variable
    assert str(err).startswith(variable)
    assert "expected" in str(err)
    shown = env.get(variable)
    if shown:
        assert repr(shown.strip()) in str(err)


def test_bool_forms() -> None:
    for raw, want in [("1", True), ("yes", True), ("ON", True), ("0", False), ("off", False)]:
        assert parse(AC_MCP_TIER_TOOLS=raw).tier_tools is want
    assert parse(AC_MCP_TIER_TOOLS="").tier_tools is True


def test_generation_accepts_plus_sign() -> None:
    assert parse(AC_MCP_GENERATION="+7").generation == 7


def test_token_never_appears_in_repr_or_errors() -> None:
    b = parse(AC_MCP_WORKER_TOKEN="acat_TOPSECRET")
    assert "TOPSECRET" not in repr(b)
    err = error(AC_MCP_WORKER_TOKEN="acat_TOPSECRET", AC_MCP_GENERATION="x")
    assert "TOPSECRET" not in str(err)


def test_token_file_must_be_private(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("acat_fromfile\n")
    os.chmod(token_file, 0o644)
    err = error(AC_MCP_WORKER_TOKEN_FILE=str(token_file))
    assert err.variable == "AC_MCP_WORKER_TOKEN_FILE" and "chmod 600" in str(err)
    assert "acat_fromfile" not in str(err)
    os.chmod(token_file, 0o600)
    b = parse(AC_MCP_WORKER_TOKEN_FILE=str(token_file))
    assert b.token.reveal() == "acat_fromfile" and b.token_file == str(token_file)


def test_token_file_and_inline_token_conflict(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("acat_x")
    os.chmod(token_file, 0o600)
    err = error(AC_MCP_WORKER_TOKEN="acat_y", AC_MCP_WORKER_TOKEN_FILE=str(token_file))
    assert "not both" in str(err)


def test_token_file_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.write_text("acat_x")
    os.chmod(real, 0o600)
    link = tmp_path / "link"
    link.symlink_to(real)
    assert error(AC_MCP_WORKER_TOKEN_FILE=str(link)).variable == "AC_MCP_WORKER_TOKEN_FILE"


def test_binding_is_frozen() -> None:
    b = parse()
    with pytest.raises(AttributeError):
        b.agent_id = "other"  # type: ignore[misc]
