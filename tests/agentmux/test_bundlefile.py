"""The bundle file's one reader (§3.1): the relay's strict reading of a bundle and its coders,
the relay tools' lenient one, and the writer the supervisor writes the fleet's bundles with."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcphost.agentmux import bundlefile as B
from mcphost.agentmux.wire import RelayError
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
    ('[[coders]]\nid = "x"', "coders[0].tmux: exactly one of tmux, acp or pty must be set"),
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


# -- the side file: members agentmux cannot express (mcphost's) -----------------------------

SIDE = """\
format-version = 1

[[coders]]
id = "p"
[coders.process]
command = "run --me"

[[sessions]]
bundle = "b"
index = 1
id = "P"
directory = "/w/P"
coder = "p"
policy = "operator"

[[sessions]]
bundle = "other"
index = 0
id = "Q"
directory = "/w/Q"
coder = "p"
"""
SIDE_BUNDLE = '[[sessions]]\nid = "a"\ndirectory = "/w/a"\ncoder = "sh"\n' + (
    '[[sessions]]\nid = "c"\ndirectory = "/w/c"\ncoder = "agent"\n'
)


def test_a_process_member_reads_from_the_side_file_at_its_place(tmp_path: Path) -> None:
    """agentmux's files hold the tmux and ACP members; the side file of the bundle's layer adds
    the process one at its index, with its coder, for both readings (another bundle's member
    of the side file is not this bundle's)."""
    files = {"coders.toml": CODERS_FULL, "bundles/b.toml": SIDE_BUNDLE, B.MEMBERS_FILE: SIDE}
    layer(tmp_path, files)
    strict = B.require_bundle([tmp_path], "b")
    expected = [("a", "tmux"), ("P", "process"), ("c", "acp")]
    assert [(s.id, s.transport) for s in strict.sessions] == expected
    assert strict.member("P") == B.Session(
        id="P", directory="/w/P", kind="coder", transport="process", policy="operator", coder="p"
    )
    assert strict.coders["p"] == B.Coder("p", "process", process=B.ProcessCoder("run --me"))
    lenient = B.require_bundle([tmp_path], "b", reading=B.LENIENT)
    assert lenient == strict
    assert [(m.id, m.transport) for m in load_members([tmp_path], "b") or ()] == expected


def test_the_side_file_is_the_bundle_layer_s_own(tmp_path: Path) -> None:
    """A bundle from a layer without a side file has no side members, though an earlier layer
    (whose `coders.toml` wins) has one."""
    first = layer(tmp_path / "first", {"coders.toml": CODERS_FULL, B.MEMBERS_FILE: SIDE})
    second = layer(tmp_path / "second", {"bundles/b.toml": SIDE_BUNDLE})
    read = B.require_bundle([first, second], "b")
    assert [s.id for s in read.sessions] == ["a", "c"]


def test_a_process_coder_in_coders_toml_is_refused_strictly_and_ignored_leniently(
    tmp_path: Path,
) -> None:
    """`coders.toml` is agentmux's: `[coders.process]` is a key agentmux does not know. Strictly
    refused (a coder of none of agentmux's shapes; beside one, an unknown field); leniently read
    as absent, like any unknown key: a coder with no other shape is left out, so its member is
    listed as `UNKNOWN_CODER` (tmux), as for any coder that is not defined."""
    alone = '[[coders]]\nid = "p"\n[coders.process]\ncommand = "run"\n'
    layer(tmp_path, {"coders.toml": alone, "bundles/b.toml": A.replace('"sh"', '"p"')})
    assert (
        "coders[0].tmux: exactly one of tmux, acp or pty"
        in error(B.load_coders, [tmp_path]).message
    )
    lenient = B.require_bundle([tmp_path], "b", reading=B.LENIENT)
    assert [(s.id, s.transport) for s in lenient.sessions] == [("a", B.UNKNOWN_CODER)]
    assert B.load_coders([tmp_path], B.LENIENT) == {}
    beside = alone + '[coders.tmux]\ninitial-command = "a"\n'
    layer(tmp_path, {"coders.toml": beside})
    assert "coders[0].process: unknown field" in error(B.load_coders, [tmp_path]).message
    assert B.load_coders([tmp_path], B.LENIENT)["p"].transport == "tmux"


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (('command = "run --me"\n', ""), "coders[0].process.command: missing required"),
        (('"run --me"', '""'), "coders[0].process.command: must be non-empty"),
        (('"run --me"\n', '"a"\nargv = ["a"]\n'), "coders[0].process.argv: unknown field"),
        (("[coders.process]", "[coders.tmux]"), "coders[0].process: exactly one of process"),
        (('coder = "p"\npolicy', 'coder = "sh"\npolicy'), "coder 'sh' is not defined"),
        (("index = 1\n", ""), "sessions[0].index: missing required field"),
        (("index = 1", "index = 3"), "sessions[0].index: beyond the bundle's 2 members"),
        (('id = "P"', 'id = "a"'), "sessions[0].id: session id 'a' is used twice"),
        (('id = "p"', 'id = "sh"'), "coders[0].id: coder id 'sh' is defined twice"),
        (("format-version = 1\n", "shape = 1\n"), "members configuration is invalid"),
    ],
)
def test_side_file_errors_name_file_and_key(
    tmp_path: Path, edit: tuple[str, str], fragment: str
) -> None:
    """Strictly, a flaw of the side file is refused as one of agentmux's files; leniently, the
    bundle still reads (a broken side file adds no member)."""
    side = SIDE.replace(*edit)
    files = {"coders.toml": CODERS_FULL, "bundles/b.toml": SIDE_BUNDLE, B.MEMBERS_FILE: side}
    layer(tmp_path, files)
    err = error(B.load_bundle, [tmp_path], "b")
    assert fragment in err.message and B.MEMBERS_FILE in err.message
    lenient = B.require_bundle([tmp_path], "b", reading=B.LENIENT)
    assert {"a", "c"} <= {s.id for s in lenient.sessions}
    layer(tmp_path, {B.MEMBERS_FILE: "sessions = ["})
    assert [s.id for s in B.require_bundle([tmp_path], "b", reading=B.LENIENT).sessions] == [
        "a",
        "c",
    ]


# -- the lenient reading (the relay tools') --------------------------------------------------

# One forgiven flaw per case: (the bundle file, the coders file, the members the lenient reading
# gives as (id, name, transport, directory)). Each one the strict reading refuses.
A = '[[sessions]]\nid = "a"\ndirectory = "/w/a"\ncoder = "sh"\n'
LENIENT_CASES = {
    "unknown keys and format-version": (
        "format-version = 9\nbundle-name = 'x'\n" + A + "transport = 'acp'\n",
        CODERS_FULL,
        [("a", None, "tmux", "/w/a")],
    ),
    "groups, environment, policy, coder-session-id on a marker": (
        "groups = ['OPS', 'ok', 'ok']\nenvironment = [{ name = '1' }]\n"
        + A
        + "groups = ['nope', 'ok']\npolicy = 3\nenvironment = 1\n"
        + '[[sessions]]\nid = "u"\ncoder-session-id = "x"\n[sessions.ui]\nport = 1\n',
        CODERS_FULL,
        [("a", None, "tmux", "/w/a"), ("u", None, "ui", None)],
    ),
    "an entry that is no table or has no string id": (
        "sessions = [1, { id = 2, coder = 'sh' }, { id = 'a', directory = '/w/a', coder = 'sh' }]",
        CODERS_FULL,
        [("a", None, "tmux", "/w/a")],
    ),
    "an id used twice: the first stands": (
        A + A.replace("/w/a", "/w/b").replace('"sh"', '"agent"'),
        CODERS_FULL,
        [("a", None, "tmux", "/w/a")],
    ),
    "a name used twice, a relative or mistyped directory": (
        A
        + 'name = "N"\n'
        + '[[sessions]]\nid = "b"\nname = "N"\ndirectory = "rel"\ncoder = "sh"\n'
        + '[[sessions]]\nid = "c"\nname = 7\ndirectory = 7\ncoder = "sh"\n',
        CODERS_FULL,
        [("a", "N", "tmux", "/w/a"), ("b", None, "tmux", None), ("c", None, "tmux", None)],
    ),
    "no shape, several shapes": (
        '[[sessions]]\nid = "a"\ndirectory = "/w/a"\n'
        + '[[sessions]]\nid = "b"\ncoder = "agent"\n[sessions.pubsub]\n',
        CODERS_FULL,
        [("a", None, "tmux", "/w/a"), ("b", None, "pubsub", None)],
    ),
    "a coder not defined": (
        '[[sessions]]\nid = "a"\ndirectory = "/w/a"\ncoder = "ghost"\n',
        CODERS_FULL,
        [("a", None, "tmux", "/w/a")],
    ),
    "an invalid coders.toml": (A, "coders = [", [("a", None, "tmux", "/w/a")]),
    "a coder's body, and coders without an id or shape": (
        A.replace('"sh"', '"x"') + A.replace('"a"', '"b"').replace('"sh"', '"y"'),
        '[[coders]]\nid = "x"\n[coders.acp]\nchannel = "pipe"\nprime-timeout-ms = 1\n'
        '[[coders]]\nid = "y"\n[coders.pty]\n[coders.process]\ncommand = "c"\n'
        '[[coders]]\n[coders.acp]\n[[coders]]\nid = "z"\n',
        [("a", None, "acp", "/w/a"), ("b", None, "pty", "/w/a")],
    ),
}


@pytest.mark.parametrize("case", list(LENIENT_CASES))
def test_the_lenient_reading_forgives_what_the_relay_tools_do_not_use(
    tmp_path: Path, case: str
) -> None:
    text, coders, members = LENIENT_CASES[case]
    layer(tmp_path, {"coders.toml": coders, "bundles/b.toml": text})
    with pytest.raises(RelayError):
        B.load_bundle([tmp_path], "b")
    read = B.require_bundle([tmp_path], "b", reading=B.LENIENT)
    assert [(s.id, s.name, s.transport, s.directory) for s in read.sessions] == members
    assert [(m.id, m.transport) for m in load_members([tmp_path], "b") or ()] == [
        (m[0], m[2]) for m in members
    ]


@pytest.mark.parametrize(
    ("text", "code", "fragment"),
    [
        ('[[sessions]]\nid = "../x"\n', "validation_invalid_arguments", "sessions[0].id: '../x'"),
        ("[[sessions]\n", "validation_invalid_arguments", "bundle configuration is invalid"),
    ],
)
def test_the_lenient_reading_never_forgives_a_member_id_or_a_broken_file(
    tmp_path: Path, text: str, code: str, fragment: str
) -> None:
    layer(tmp_path, {"bundles/b.toml": text})
    err = error(B.load_bundle, [tmp_path], "b", reading=B.LENIENT)
    assert err.code == code and fragment in err.message
    assert error(B.load_bundle, [tmp_path], "..", reading=B.LENIENT).code == (
        "validation_invalid_params"
    )


def test_the_lenient_reading_of_a_good_file_is_the_strict_one(cfg: Path) -> None:
    strict = B.require_bundle([cfg], "party")
    lenient = B.require_bundle([cfg], "party", reading=B.LENIENT)
    assert lenient == strict
    assert {c.id: c.transport for c in lenient.coders.values()} == {
        c.id: c.transport for c in strict.coders.values()
    }
    assert all(c.tmux is None and c.acp is None for c in lenient.coders.values())  # no bodies


# -- the writer ------------------------------------------------------------------------------


def test_a_bundle_written_reads_back_as_itself(cfg: Path, tmp_path: Path) -> None:
    """Every key the model holds: members of every shape, groups, environments, each coder's
    body (keys the model does not hold, a pty coder's `cols`, an http coder's `headers`, are not
    written)."""
    bundle = B.require_bundle([cfg], "party")
    out = tmp_path / "out"
    layer(
        out,
        {
            "bundles/party.toml": B.bundle_toml(bundle, "# written\n"),
            "coders.toml": B.coders_toml(bundle.coders.values()),
        },
    )
    assert (out / "bundles/party.toml").read_text().startswith("# written\nformat-version = 1\n")
    again = B.require_bundle([out], "party")
    assert again == B.Bundle(**{**_fields(bundle), "path": out / "bundles/party.toml"})
    assert dict(again.coders) == dict(bundle.coders)


def _fields(bundle: B.Bundle) -> dict[str, object]:
    import dataclasses

    return {f.name: getattr(bundle, f.name) for f in dataclasses.fields(bundle)}


# Any string Python can encode (no lone surrogates): quotes, backslashes, control characters
# (the fleet refuses most of them in a command, the writer must not depend on that), unicode.
_ANY_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40).filter(
    lambda t: t.strip() and "\x00" not in t
)
_IDS = st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,30}", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(
    members=st.lists(
        st.tuples(
            _IDS, _ANY_TEXT, st.none() | _ANY_TEXT, st.sampled_from(["tmux", "acp", "process"])
        ),
        max_size=5,
        unique_by=lambda m: m[0],
    )
)
def test_any_string_round_trips_through_the_writer(
    tmp_path_factory: pytest.TempPathFactory, members: list[tuple[str, str, str | None, str]]
) -> None:
    """Issue #18: a DEL in a command made `coders.toml` invalid TOML for every bundle. Members
    of every kind, interleaved: each reads back at its place, the process ones from the side
    file (`layer_toml`)."""
    coders = {
        f"c-{i}": B.Coder(
            f"c-{i}",
            shape,
            tmux=B.TmuxCoder(command) if shape == "tmux" else None,
            acp=B.AcpCoder("stdio", command) if shape == "acp" else None,
            process=B.ProcessCoder(command) if shape == "process" else None,
        )
        for i, (_, command, _, shape) in enumerate(members)
        if shape != "acp" or command.split()  # an ACP command splits on whitespace
    }
    sessions = tuple(
        B.Session(
            id=agent, directory="/w", kind="coder", transport=shape, policy=policy, coder=f"c-{i}"
        )
        for i, (agent, _, policy, shape) in enumerate(members)
        if f"c-{i}" in coders
    )
    root = tmp_path_factory.mktemp("w")
    path = root / "bundles" / "b.toml"
    for relative, text in B.layer_toml([B.Bundle("b", path, sessions, coders=coders)]).items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)  # as written: no dedent
    read = B.require_bundle([root], "b")
    assert read.sessions == sessions
    assert dict(read.coders) == coders
    # agentmux's own files, without the side file, are agentmux's: its tmux and ACP members
    (root / B.MEMBERS_FILE).unlink()
    alone = B.require_bundle([root], "b")
    assert alone.sessions == tuple(s for s in sessions if s.transport != "process")
