"""The relay's strict reading of bundles, coders.toml, users.toml and relay.toml (§3.1)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from mcphost.agentmux.wire import RelayError
from mcphost.relay import bundles as B
from mcphost.relaytools.layout import load_members
from mcphost.testing.relayharness import BUNDLE_PARTY, CODERS

CODERS_FULL = """\
format-version = 1

[[coders]]
id = "claude"
environment = [{ name = "CODER", value = "claude" }, { name = "SHARED", value = "coder" }]
[coders.tmux]
initial-command = "claude"
resume-command = "claude --resume {coder-session-id}"
prompt-regex = '(?ms)^[─-]{20,}\\s+[>❯]\\s+[─-]{20,}'
prompt-inspect-lines = 6
prompt-idle-column = 2
prime-timeout-ms = 5000
readiness-timeout-ms = 60000

[[coders]]
id = "sh"
[coders.tmux]
initial-command = "sh"

[[coders]]
id = "agent"
[coders.acp]
channel = "stdio"
command = "agent --acp"

[[coders]]
id = "web"
[coders.acp]
channel = "http"
url = "http://127.0.0.1:1/acp"
headers = [{ name = "X_Token", value = "t" }]

[[coders]]
id = "term"
[coders.pty]
initial-command = "sh"
cols = 120
rows = 40
term-protocol = "xterm"
wedge-detection = true
"""

BUNDLE_FULL = """\
format-version = 1
autostart = true
groups = ["reviewers", "night-shift"]
environment = [{ name = "SHARED", value = "bundle" }, { name = "BUNDLE_ONLY", value = "b" }]

[[sessions]]
id = "alpha"
name = "Alpha"
directory = "/work/alpha"
coder = "claude"
coder-session-id = "abc 'd"
policy = "operator"
groups = ["reviewers"]
environment = [{ name = "SHARED", value = "session" }, { name = "EMPTY", value = "" }]

[[sessions]]
id = "bravo"
directory = "~/bravo"
coder = "sh"

[[sessions]]
id = "charlie"
directory = "/work/charlie"
coder = "agent"

[[sessions]]
id = "operator"
[sessions.ui]

[[sessions]]
id = "feed"
[sessions.pubsub]
"""


def layer(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    return layer(tmp_path / "cfg", {"coders.toml": CODERS_FULL, "bundles/party.toml": BUNDLE_FULL})


def error(call: object, *args: object, **kwargs: object) -> RelayError:
    with pytest.raises(RelayError) as caught:
        call(*args, **kwargs)  # type: ignore[operator]
    return caught.value


# -- coders ----------------------------------------------------------------------------------


def test_coders_read_fully(cfg: Path) -> None:
    coders = B.load_coders([cfg])
    assert list(coders) == ["claude", "sh", "agent", "web", "term"]
    assert {c.id: c.transport for c in coders.values()} == {
        "claude": "tmux",
        "sh": "tmux",
        "agent": "acp",
        "web": "acp",
        "term": "pty",
    }
    claude = coders["claude"].tmux
    assert claude == B.TmuxCoder(
        initial_command="claude",
        resume_command="claude --resume {coder-session-id}",
        prompt_regex="(?ms)^[─-]{20,}\\s+[>❯]\\s+[─-]{20,}",
        prompt_inspect_lines=6,
        prompt_idle_column=2,
        prime_timeout_ms=5000,
        readiness_timeout_ms=60000,
    )
    assert coders["claude"].environment == (("CODER", "claude"), ("SHARED", "coder"))
    sh = coders["sh"].tmux
    assert sh is not None
    assert (sh.prompt_inspect_lines, sh.readiness_timeout_ms, sh.prompt_regex) == (1, 900000, None)
    assert coders["agent"].tmux is None
    assert coders["agent"].acp == B.AcpCoder("stdio", "agent --acp")
    assert coders["agent"].acp.argv() == ["agent", "--acp"]
    assert coders["web"].acp == B.AcpCoder("http", None, "http://127.0.0.1:1/acp")


def test_command_choice_quotes_the_coder_session_id(cfg: Path) -> None:
    claude = B.load_coders([cfg])["claude"].tmux
    assert claude is not None
    assert claude.command(None) == "claude"
    assert claude.command("abc-123") == "claude --resume abc-123"
    assert claude.command("x; rm -rf /") == "claude --resume 'x; rm -rf /'"
    sh = B.load_coders([cfg])["sh"].tmux
    assert sh is not None and sh.command("abc") == "sh"  # no resume command: initial
    assert claude.prompt_regex is not None
    assert re.search(claude.prompt_regex, "─" * 20 + "\n> " + "─" * 20)


def test_the_relay_tools_fixture_reads(tmp_path: Path) -> None:
    root = tmp_path / "r"
    config = layer(
        root / "cfg",
        {"coders.toml": CODERS, "bundles/party.toml": BUNDLE_PARTY.format(root=root)},
    )
    bundle = B.require_bundle([config], "party")
    assert [(s.id, s.transport) for s in bundle.sessions] == [
        ("alpha", "tmux"),
        ("bravo", "tmux"),
        ("charlie", "acp"),
    ]
    # the relay tools' lenient reading agrees with the relay's on the same files
    assert [(m.id, m.transport) for m in load_members([config], "party") or ()] == [
        (s.id, s.transport) for s in bundle.sessions
    ]


CODER_ERRORS = [
    ('[[coders]]\nid = "x"', "coders[0].tmux: exactly one of tmux, acp or pty"),
    (
        '[[coders]]\nid = "x"\n[coders.tmux]\ninitial-command = "a"\n[coders.acp]\nchannel = "stdio"',
        "exactly one of tmux, acp or pty",
    ),
    ('[[coders]]\nid = "x"\n[coders.tmux]\n', "coders[0].tmux.initial-command: missing required"),
    (
        '[[coders]]\nid = "x"\n[coders.tmux]\ninitial_command = "a"',
        "initial-command: missing required field",
    ),
    (
        '[[coders]]\nid = "x"\n[coders.tmux]\ninitial-command = "a"\nprompt_regex = "b"',
        "coders[0].tmux.prompt_regex: unknown field",
    ),
    (
        '[[coders]]\nid = "x"\n[coders.tmux]\ninitial-command = "a"\nprompt-regex = "("',
        "coders[0].tmux.prompt-regex: not a valid regular expression",
    ),
    (
        '[[coders]]\nid = "x"\n[coders.tmux]\ninitial-command = "a"\nreadiness-timeout-ms = 29999',
        "readiness-timeout-ms: must be between 30000 and 3600000, got 29999",
    ),
    (
        '[[coders]]\nid = "x"\n[coders.tmux]\ninitial-command = "a"\nreadiness-timeout-ms = 3600001',
        "must be between 30000 and 3600000",
    ),
    (
        '[[coders]]\nid = "x"\n[coders.tmux]\ninitial-command = "a"\nprompt-inspect-lines = 0',
        "prompt-inspect-lines: must be between 1 and 1000",
    ),
    (
        '[[coders]]\nid = "x"\n[coders.tmux]\ninitial-command = "a"\nprime-timeout-ms = "5"',
        "prime-timeout-ms: expected an integer, got a string",
    ),
    (
        '[[coders]]\nid = "x"\n[coders.tmux]\ninitial-command = "a"\nprompt-idle-column = true',
        "prompt-idle-column: expected an integer, got a boolean",
    ),
    (
        '[[coders]]\nid = "x"\n[coders.tmux]\ninitial-command = "a"\ncols = 80',
        "coders[0].tmux.cols: unknown field",  # pty-only keys
    ),
    ('[[coders]]\nid = "x"\n[coders.acp]\nchannel = "pipe"', 'channel: must be "stdio" or "http"'),
    ('[[coders]]\nid = "x"\n[coders.acp]\nchannel = "stdio"', "command: required (and not"),
    (
        '[[coders]]\nid = "x"\n[coders.acp]\nchannel = "stdio"\ncommand = " "',
        "command: must be non-empty",
    ),
    (
        '[[coders]]\nid = "x"\n[coders.acp]\nchannel = "stdio"\ncommand = "a"\nurl = "http://h"',
        "url: only for channel http",
    ),
    (
        '[[coders]]\nid = "x"\n[coders.acp]\nchannel = "http"\nurl = "http://h"\ncommand = "a"',
        "command: only for channel stdio",
    ),
    # agentmux retired the ACP turn timeout: its key fails the load
    (
        '[[coders]]\nid = "x"\n[coders.acp]\nchannel = "stdio"\ncommand = "a"\n'
        "prime-timeout-ms = 750",
        "coders[0].acp.prime-timeout-ms: unknown field",
    ),
    ('[[coders]]\nid = "x"\n[coders.acp]\nchannel = "http"', "url: required when channel is http"),
    (
        '[[coders]]\nid = "x"\nenvironment = [{ name = "1X", value = "v" }]\n[coders.tmux]\n'
        'initial-command = "a"',
        "coders[0].environment[0].name: '1X' is not an environment variable name",
    ),
    (
        '[[coders]]\nid = "x"\nenvironment = [{ name = "A", value = "v" }, { name = "A", value = "w" }]'
        '\n[coders.tmux]\ninitial-command = "a"',
        "environment[1].name: 'A' is set twice",
    ),
    (
        '[[coders]]\nid = "x"\nenvironment = [{ name = "A" }]\n[coders.tmux]\ninitial-command = "a"',
        "environment[0].value: missing required field",
    ),
    (
        '[[coders]]\nid = "x"\n[coders.tmux]\ninitial-command = "a"\n'
        '[[coders]]\nid = "x"\n[coders.tmux]\ninitial-command = "b"',
        "coders[1].id: coder id 'x' is defined twice",
    ),
    ("format-version = 2", "format-version: unsupported format version 2"),
    ("coder = 1", "coder: unknown field"),
]


@pytest.mark.parametrize(("text", "fragment"), CODER_ERRORS)
def test_coder_errors_name_file_and_key(tmp_path: Path, text: str, fragment: str) -> None:
    layer(tmp_path, {"coders.toml": text})
    err = error(B.load_coders, [tmp_path])
    assert err.code == "validation_invalid_arguments"
    assert err.message.startswith(f"coders configuration is invalid: {tmp_path / 'coders.toml'}: ")
    assert fragment in err.message
    assert err.details is not None and set(err.details) == {"path", "cause"}
    assert err.details["path"] == str(tmp_path / "coders.toml")


def test_no_coders_file_is_no_coders(tmp_path: Path) -> None:
    assert B.load_coders([tmp_path]) == {}


# -- bundles ---------------------------------------------------------------------------------


def test_a_full_bundle_reads(cfg: Path) -> None:
    bundle = B.require_bundle([cfg], "party")
    assert (bundle.id, bundle.path, bundle.autostart) == ("party", cfg / "bundles/party.toml", True)
    assert bundle.groups == ("reviewers", "night-shift")
    alpha = bundle.member("alpha")
    assert alpha == B.Session(
        id="alpha",
        directory="/work/alpha",
        kind="coder",
        transport="tmux",
        name="Alpha",
        policy="operator",
        coder="claude",
        coder_session_id="abc 'd",
        environment=(("SHARED", "session"), ("EMPTY", "")),
        groups=("reviewers",),
    )
    assert [(s.id, s.kind, s.transport) for s in bundle.sessions] == [
        ("alpha", "coder", "tmux"),
        ("bravo", "coder", "tmux"),
        ("charlie", "coder", "acp"),
        ("operator", "ui", "ui"),
        ("feed", "pubsub", "pubsub"),
    ]
    assert bundle.member("ghost") is None
    assert alpha is not None and alpha.principal_id("party") == "alpha@party"


SESSION = '[[sessions]]\nid = "alpha"\ndirectory = "/w"\ncoder = "sh"\n'
BUNDLE_ERRORS = [
    (
        '[[sessions]]\ndirectory = "/w"\ncoder = "sh"',
        "validation_invalid_arguments",
        "sessions[0].id: missing required",
    ),
    (
        '[[sessions]]\nid = "../x"\ndirectory = "/w"\ncoder = "sh"',
        "validation_invalid_arguments",
        "sessions[0].id: '../x' is not a session id",
    ),
    (
        '[[sessions]]\nid = "a' + "b" * 31 + '"\ndirectory = "/w"\ncoder = "sh"',
        "validation_invalid_arguments",
        "is not a session id",
    ),
    (
        SESSION + SESSION,
        "validation_invalid_arguments",
        "sessions[1].id: session id 'alpha' is used twice",
    ),
    (
        SESSION + 'name = "A"\n[[sessions]]\nid = "b"\ndirectory = "/w"\ncoder = "sh"\nname = "A"',
        "validation_invalid_arguments",
        "sessions[1].name: session name 'A' is used twice",
    ),
    (
        '[[sessions]]\nid = "a"\ncoder = "sh"',
        "validation_invalid_arguments",
        "sessions[0].directory: missing required field",
    ),
    (
        '[[sessions]]\nid = "a"\ndirectory = "rel"\ncoder = "sh"',
        "validation_invalid_arguments",
        "sessions[0].directory: must be an absolute path",
    ),
    (
        '[[sessions]]\nid = "a"\ndirectory = "/w"\ncoder = "nope"',
        "validation_invalid_arguments",
        "sessions[0].coder: coder 'nope' is not defined",
    ),
    (
        '[[sessions]]\nid = "a"\ndirectory = "/w"',
        "validation_invalid_arguments",
        "exactly one of coder, [sessions.ui] or [sessions.pubsub]",
    ),
    (
        '[[sessions]]\nid = "a"\ndirectory = "/w"\ncoder = "sh"\n[sessions.ui]',
        "validation_invalid_arguments",
        "exactly one of coder",
    ),
    (
        '[[sessions]]\nid = "a"\n[sessions.ui]\n[sessions.pubsub]',
        "validation_invalid_arguments",
        "exactly one of coder",
    ),
    (
        '[[sessions]]\nid = "a"\n[sessions.ui]\nport = 1',
        "validation_invalid_arguments",
        "sessions[0].ui.port: unknown field",
    ),
    (
        '[[sessions]]\nid = "a"\ncoder-session-id = "x"\n[sessions.ui]',
        "validation_invalid_arguments",
        "coder-session-id: only a coder session",
    ),
    (
        SESSION + "coder_session_id = 'x'",
        "validation_invalid_arguments",
        "sessions[0].coder_session_id: unknown field",
    ),
    (
        SESSION + "policy = 3",
        "validation_invalid_arguments",
        "sessions[0].policy: expected a string, got a number",
    ),
    (
        SESSION + "policy = ''",
        "validation_invalid_arguments",
        "sessions[0].policy: must be non-empty",
    ),
    (
        SESSION + "transport = 'tmux'",
        "validation_invalid_arguments",
        "sessions[0].transport: unknown field",
    ),
    (
        "autostart = 'yes'\n" + SESSION,
        "validation_invalid_arguments",
        "autostart: expected a boolean",
    ),
    ("sessions = 1", "validation_invalid_arguments", "sessions: expected an array of tables"),
    (
        "groups = ['ALL']\n" + SESSION,
        "validation_reserved_group_name",
        "groups[0]: group 'ALL' is reserved",
    ),
    ("groups = ['OPS']\n" + SESSION, "validation_reserved_group_name", "group 'OPS' is reserved"),
    (
        "groups = ['Ops']\n" + SESSION,
        "validation_invalid_group_name",
        "group 'Ops' must be lowercase",
    ),
    ("groups = ['a b']\n" + SESSION, "validation_invalid_group_name", "must be lowercase"),
    (
        "groups = ['ops', 'ops']\n" + SESSION,
        "validation_invalid_group_name",
        "groups: a group is declared twice",
    ),
    (
        SESSION + "groups = ['ops']",
        "validation_invalid_group_name",
        "sessions[0].groups[0]: group 'ops' is not declared",
    ),
    (SESSION + "groups = ['ALL']", "validation_reserved_group_name", "sessions[0].groups[0]"),
    (
        "environment = [{ name = 'A', value = 1 }]\n" + SESSION,
        "validation_invalid_arguments",
        "environment[0].value: expected a string",
    ),
    (
        "environment = [{ name = 'A', value = 'v', extra = 1 }]\n" + SESSION,
        "validation_invalid_arguments",
        "environment[0].extra: unknown field",
    ),
    (
        "format-version = 0\n" + SESSION,
        "validation_invalid_arguments",
        "format-version: unsupported",
    ),
    ("bundle-name = 'x'\n" + SESSION, "validation_invalid_arguments", "bundle-name: unknown field"),
]


@pytest.mark.parametrize(("text", "code", "fragment"), BUNDLE_ERRORS)
def test_bundle_errors_name_file_and_key(
    tmp_path: Path, text: str, code: str, fragment: str
) -> None:
    layer(tmp_path, {"coders.toml": CODERS_FULL, "bundles/b.toml": text})
    err = error(B.load_bundle, [tmp_path], "b")
    assert err.code == code
    path = tmp_path / "bundles" / "b.toml"
    assert err.message.startswith(f"bundle configuration is invalid: {path}: ")
    assert fragment in err.message
    assert err.details == {"path": str(path), "cause": err.message.split(f"{path}: ", 1)[1]}


def test_broken_toml_is_invalid_with_its_path(tmp_path: Path) -> None:
    layer(tmp_path, {"bundles/b.toml": "[[sessions]\n"})
    err = error(B.load_bundle, [tmp_path], "b")
    assert err.code == "validation_invalid_arguments"
    assert err.details is not None and err.details["path"] == str(tmp_path / "bundles/b.toml")
    assert str(tmp_path / "bundles/b.toml") in err.message


def test_an_unreadable_layer_is_its_own_code(tmp_path: Path) -> None:
    (tmp_path / "bundles" / "b.toml").mkdir(parents=True)  # a directory: read fails
    err = error(B.load_bundle, [tmp_path], "b")
    assert err.code == "validation_unreadable_configuration_layer"
    assert err.details is not None and err.details["path"] == str(tmp_path / "bundles/b.toml")


@pytest.mark.parametrize("bundle_id", ["..", ".", "a/b", "", "x y"])
def test_bundle_ids_outside_the_grammar_are_refused_before_any_path(
    tmp_path: Path, bundle_id: str
) -> None:
    err = error(B.load_bundle, [tmp_path], bundle_id)
    assert err.code == "validation_invalid_params"
    assert err.details == {"bundle_name": bundle_id}


def test_layers_first_wins_per_file_bundles_union_by_id(tmp_path: Path) -> None:
    first = layer(
        tmp_path / "a",
        {
            "coders.toml": CODERS_FULL,
            "bundles/party.toml": SESSION,
            "bundles/notes.txt": "ignored",
        },
    )
    second = layer(
        tmp_path / "b",
        {
            "coders.toml": "broken = [",  # shadowed by the first layer's coders.toml: never read
            "bundles/party.toml": SESSION.replace("alpha", "shadowed"),
            "bundles/zeta.toml": SESSION.replace("alpha", "zed"),
        },
    )
    roots = [first, second]
    assert B.bundle_ids(roots) == ["party", "zeta"]
    loaded = {i: B.load_bundle(roots, i) for i in B.bundle_ids(roots)}
    assert list(loaded) == ["party", "zeta"]
    assert [s.id for s in loaded["party"].sessions] == ["alpha"]
    assert [s.id for s in loaded["zeta"].sessions] == ["zed"]
    assert loaded["zeta"].path == second / "bundles/zeta.toml"
    assert B.load_bundle(roots, "ghost") is None
    err = error(B.require_bundle, roots, "ghost")
    assert err.code == "validation_unknown_bundle"
    assert err.message == (
        f"bundle 'ghost' is not configured under {first / 'bundles'}, {second / 'bundles'}"
    )
    assert err.details == {
        "bundle_name": "ghost",
        "path": f"{first / 'bundles'}, {second / 'bundles'}",
    }


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
