"""The relay's strict reading of users.toml and relay.toml (§3.1), and its booleans' precedence."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from mcphost.agentmux.wire import RelayError
from mcphost.relay import config as B


def layer(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def error(call: object, *args: object, **kwargs: object) -> RelayError:
    with pytest.raises(RelayError) as caught:
        call(*args, **kwargs)  # type: ignore[operator]
    return caught.value


# -- users.toml ------------------------------------------------------------------------------


def test_users_read(tmp_path: Path) -> None:
    layer(
        tmp_path,
        {
            "users.toml": """\
                format-version = 1
                default-bundle = "party"
                default-session = "alpha"

                [[sessions]]
                id = "op@GLOBAL"
                name = "Operator"
                policy = "operator"
                [sessions.ui]

                [[sessions]]
                id = "bus@GLOBAL"
                policy = "default"
                [sessions.pubsub]

                [[sessions]]
                id = "plain@GLOBAL"
                policy = "default"
                """
        },
    )
    users = B.load_users([tmp_path])
    assert (users.default_bundle, users.default_session) == ("party", "alpha")
    assert users.users == (
        B.User("op@GLOBAL", "operator", "Operator", "ui"),
        B.User("bus@GLOBAL", "default", None, "pubsub"),
        B.User("plain@GLOBAL", "default", None, "ui"),
    )
    assert users.get("op@GLOBAL") is users.users[0]
    assert users.get("alpha@party") is None
    assert B.load_users([tmp_path / "none"]) == B.Users()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('[[sessions]]\nid = "op"\npolicy = "p"', "sessions[0].id: 'op' must be <name>@GLOBAL"),
        ('[[sessions]]\nid = "op@party"\npolicy = "p"', "must be <name>@GLOBAL"),
        ('[[sessions]]\nid = "../op@GLOBAL"\npolicy = "p"', "must be <name>@GLOBAL"),
        ('[[sessions]]\nid = "op@GLOBAL"', "sessions[0].policy: missing required field"),
        (
            '[[sessions]]\nid = "op@GLOBAL"\npolicy = "p"\n[sessions.ui]\n[sessions.pubsub]',
            "at most one of",
        ),
        (
            '[[sessions]]\nid = "op@GLOBAL"\npolicy = "p"\n[[sessions]]\nid = "op@GLOBAL"\npolicy = "p"',
            "sessions[1].id: user 'op@GLOBAL' is defined twice",
        ),
        ('[[sessions]]\nid = "op@GLOBAL"\npolicy = "p"\ncoder = "x"', "sessions[0].coder: unknown"),
        ('default-bundle = ".."', "default-bundle: '..' is not a bundle id"),
        ("default_bundle = 'x'", "default_bundle: unknown field"),
    ],
)
def test_user_errors(tmp_path: Path, text: str, fragment: str) -> None:
    layer(tmp_path, {"users.toml": text})
    err = error(B.load_users, [tmp_path])
    assert err.code == "validation_invalid_arguments"
    assert str(tmp_path / "users.toml") in err.message
    assert fragment in err.message


# -- relay.toml ------------------------------------------------------------------------------


def test_relay_settings_defaults(tmp_path: Path) -> None:
    assert B.load_relay_settings([tmp_path], {}) == B.RelaySettings()
    assert B.RelaySettings() == B.RelaySettings(True, False, 256, (), None)


def test_relay_settings_file(tmp_path: Path) -> None:
    layer(
        tmp_path,
        {
            "relay.toml": """\
                format-version = 1
                watch-bundles = false
                require-session-credentials = true
                [choices]
                pending-max = 4096
                [[peers]]
                alias = "west"
                address = "/run/west/relay.sock"
                connect-as = "east"
                [delivery]
                anything = 1
                """
        },
    )
    settings = B.load_relay_settings([tmp_path], {})
    assert settings == B.RelaySettings(
        watch_bundles=False,
        require_session_credentials=True,
        choices_pending_max=4096,
        peers=(B.Peer("west", "/run/west/relay.sock", "east"),),
        path=tmp_path / "relay.toml",
    )


@pytest.mark.parametrize(
    ("file", "env", "flag", "expected"),
    [
        ("", {}, None, False),
        ("require-session-credentials = true", {}, None, True),
        ("require-session-credentials = true", {B.ENV_REQUIRE: "false"}, None, False),
        ("require-session-credentials = false", {B.ENV_REQUIRE: "true"}, None, True),
        ("require-session-credentials = false", {B.ENV_REQUIRE: "false"}, True, True),
        ("", {}, True, True),
    ],
)
def test_require_credentials_precedence(
    tmp_path: Path, file: str, env: dict[str, str], flag: bool | None, expected: bool
) -> None:
    layer(tmp_path, {"relay.toml": file})
    settings = B.load_relay_settings([tmp_path], env, require_credentials_flag=flag)
    assert settings.require_session_credentials is expected


def test_watch_precedence(tmp_path: Path) -> None:
    layer(tmp_path, {"relay.toml": "watch-bundles = true"})
    assert B.load_relay_settings([tmp_path], {B.ENV_WATCH: "false"}).watch_bundles is False
    assert B.load_relay_settings([tmp_path], {B.ENV_WATCH: "false"}, watch_flag=True).watch_bundles
    assert not B.load_relay_settings([tmp_path], {}, watch_flag=False).watch_bundles


@pytest.mark.parametrize("value", ["TRUE", "1", "yes", "", " true"])
def test_relay_env_booleans_are_exactly_true_or_false(tmp_path: Path, value: str) -> None:
    err = error(B.load_relay_settings, [tmp_path], {B.ENV_REQUIRE: value})
    assert err.code == "validation_invalid_arguments"
    assert err.details == {"variable": B.ENV_REQUIRE, "value": value}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("require_session_credentials = true", "(keys are kebab-case"),
        ("require-session-credentials = 'true'", "expected a boolean, got a string"),
        ("[choices]\npending-max = 0", "choices.pending-max: must be between 1 and 4096"),
        ("[choices]\npending-max = 4097", "must be between 1 and 4096"),
        ("[choices]\nmax = 1", "choices.max: unknown field"),
        ("[[peers]]\nalias = 'w'\naddress = 'rel'\nconnect-as = 'e'", "peers[0].address: must be"),
        ("[[peers]]\nalias = 'w'\naddress = '/s'", "peers[0].connect-as: missing required"),
        ("[[peers]]\nalias = '..'\naddress = '/s'\nconnect-as = 'e'", "peers[0].alias"),
        (
            "[[peers]]\nalias = 'w'\naddress = '/s'\nconnect-as = 'e'\n"
            "[[peers]]\nalias = 'w'\naddress = '/t'\nconnect-as = 'e'",
            "peers[1].alias: peer alias 'w' is used twice",
        ),
        ("delivery = 3", "delivery: expected a table"),
        ("relay-socket = '/x'", "relay-socket: unknown field"),
    ],
)
def test_relay_settings_errors(tmp_path: Path, text: str, fragment: str) -> None:
    layer(tmp_path, {"relay.toml": text})
    err = error(B.load_relay_settings, [tmp_path], {})
    assert err.code == "validation_invalid_arguments"
    assert str(tmp_path / "relay.toml") in err.message
    assert fragment in err.message
