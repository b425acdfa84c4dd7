"""AC_MCP_* parsing: defaults, trimming, the token grammar; every error names the variable and
never the token."""

import hashlib
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcphost.binding import TOKEN_MAX, AgentBinding, BindingError, check_token

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


# -- the token grammar (issue 10, item 4) and token-file hygiene (item 5) ------------------------


def private_file(tmp_path: Path, content: bytes) -> str:
    path = tmp_path / "token"
    path.write_bytes(content)
    path.chmod(0o600)
    return str(path)


@pytest.mark.parametrize(
    ("token", "fragment"),
    [
        ("acat_SECRET\nsecond", "a line break at character 12"),
        ("acat_SECRET\r\nX-Injected: 1", "a line break at character 12"),
        ("acat_SE CRET", "a space at character 8"),
        ("acat_SECRET\x1b", "a control character (U+001B) at character 12"),
        ("acat_SECRETé", "a non-ASCII character (U+00E9) at character 12"),
        ("acat_SECRET" + "x" * TOKEN_MAX, f"longer than {TOKEN_MAX} characters"),
    ],
)
def test_inline_token_outside_the_grammar_is_refused_unshown(token: str, fragment: str) -> None:
    err = error(AC_MCP_WORKER_TOKEN=token)
    assert err.variable == "AC_MCP_WORKER_TOKEN"
    assert fragment in str(err) and "expected a bearer token on one line" in str(err)
    assert "SECRET" not in str(err) and "SECRET" not in repr(err.details)
    assert err.details["variable"] == "AC_MCP_WORKER_TOKEN"


@pytest.mark.parametrize("ending", [b"", b"\n", b"\r\n"])
def test_token_file_loses_one_line_ending(tmp_path: Path, ending: bytes) -> None:
    path = private_file(tmp_path, b"acat_fromfile" + ending)
    assert parse(AC_MCP_WORKER_TOKEN_FILE=path).token.reveal() == "acat_fromfile"


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"acat_SECRET\nsecond line\n", "line break at character 12"),
        (b"acat_SECRET\n\n", "line break at character 12"),
        (b" acat_SECRET\n", "space at character 1"),
        (b"acat_SECRET\xff", "non-ASCII character (U+FFFD)"),
        (b"\n", "a file containing the token"),
    ],
)
def test_token_file_outside_the_grammar_is_refused_unshown(
    tmp_path: Path, content: bytes, fragment: str
) -> None:
    path = private_file(tmp_path, content)
    err = error(AC_MCP_WORKER_TOKEN_FILE=path)
    assert err.variable == "AC_MCP_WORKER_TOKEN_FILE"
    assert fragment in str(err) and path in str(err) and "SECRET" not in str(err)


@pytest.mark.parametrize(
    "env",
    [
        {"AC_MCP_WORKER_TOKEN_FILE": "acat_SECRET"},
        {"AC_MCP_WORKER_TOKEN_FILE": "acat_SECRET", "AC_MCP_WORKER_TOKEN": "acat_other"},
        {"AC_MCP_WORKER_TOKEN_FILE": "relative/acat_SECRET"},
    ],
)
def test_token_file_value_that_is_not_a_path_is_not_shown(env: dict[str, str]) -> None:
    err = error(**env)
    assert err.variable == "AC_MCP_WORKER_TOKEN_FILE" and "absolute path" in str(err)
    assert "SECRET" not in str(err) and "not shown" in str(err)


def test_token_file_path_is_shown_when_it_is_a_path() -> None:
    err = error(AC_MCP_WORKER_TOKEN_FILE="/run/t", AC_MCP_WORKER_TOKEN="acat_SECRET")
    assert "'/run/t'" in str(err) and "not both" in str(err) and "SECRET" not in str(err)


@given(st.text(max_size=60))
def test_check_token_accepts_exactly_printable_ascii_and_never_shows_a_refused_one(
    tail: str,
) -> None:
    token = "SECRET" + tail
    try:
        assert check_token("AC_MCP_WORKER_TOKEN", token) == token
    except BindingError as exc:
        assert any(not "!" <= c <= "~" for c in token)
        assert "SECRET" not in str(exc) and str(exc).startswith("AC_MCP_WORKER_TOKEN ")
    else:
        assert all("!" <= c <= "~" for c in token)
