"""Token hygiene at the command line: bad token characters, tokens in the wrong place, abbreviations.

Every case drives the real process as an operator would (`mcphost host`, `mcphost check`,
`mcphost check --json`, `configgen`, `mcphost relay-tools`, `mcphost devcenter`, `mcphost
ctl`, `mcphost supervise`) and asserts the points below. The sweeps (bad bindings, token file
endings, refused options) run most cases through the same `main()` in this process
(`run_in_process`: the environment, exit code and both output streams are the process's) and
one run of each sweep's first case as a real process (the three bad-token sweeps each a
different one of `host`, `check` and `check --json`), so the entry points, interpreter start-up
and exit status stay covered end to end:

- a bad binding exits 2 with one message that names the variable and says what is expected;
  `check --json` prints a classified JSON result (never nothing, never a traceback);
- the token, and its last 16 characters, appear nowhere in stdout or stderr;
- no CLI takes an abbreviated option for a longer one (`--token` is not `--token-file`), and an
  option it does not know is named without its value.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mcphost.testing import DevCenter
from tests.hardening.conftest import ROOT, host_env, run_in_process

# deep (make test-slow): token sources and option sweeps.
pytestmark = [pytest.mark.deep, pytest.mark.timeout(180)]

HOST_AND_CHECK = (["host"], ["check"], ["check", "--json"])


def runner_for(first_case: bool, argv: list[str], real_argv: list[str]) -> Any:
    """`run` (a real process) for the sweep's first case run as `real_argv`, else
    `run_in_process`."""
    return run if first_case and argv == real_argv else run_in_process


SECRET = "acat_Zq3Lx9Vb2Nw8Rt5Ys1Kp7Hm4Gd6Fc0-_EjUoWiQaSl"


def run(argv: list[str], env: dict[str, str], module: str = "mcphost.cli") -> Any:
    return subprocess.run(
        [sys.executable, "-m", module, *argv],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
    )


def assert_hidden(proc: Any, token: str, what: object) -> None:
    blob = proc.stdout + proc.stderr
    for needle in (token, token[-16:]):
        assert needle.encode() not in blob, f"the token leaked: {what}"


def assert_bad_binding(
    proc: Any, argv: list[str], variable: str, fragment: str, token: str, what: object
) -> str:
    """Exit 2, one stderr line naming `variable` with `fragment` and "expected"; no traceback;
    `check --json` prints one classified JSON result. Returns the operator message."""
    assert proc.returncode == 2, (what, argv, proc.stderr)
    err = proc.stderr.decode()
    assert "Traceback" not in err, (what, argv, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, (what, argv, err)
    assert variable in lines[0] and "expected" in lines[0] and fragment in lines[0], lines[0]
    assert_hidden(proc, token, (what, argv))
    if argv == ["check", "--json"]:
        report = json.loads(proc.stdout)
        assert report["ok"] is False and report["error"] == "bad_binding", report
        assert report["details"]["variable"] == variable, report
        assert variable in report["message"] and "expected" in report["message"]
    else:
        assert proc.stdout == b"", (what, argv)
    return lines[0].split(": ", 1)[1]


def token_file(tmp_path: Path, content: bytes, name: str = "token") -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    path.chmod(0o600)
    return path


# -- item 4: a token must be one line of printable ASCII -----------------------------------------

BAD_FILE_CONTENTS = {
    "second_line": (b"{t}\nsecond line\n", "line break"),
    "crlf_then_more": (b"{t}\r\nX", "line break"),
    "two_trailing_newlines": (b"{t}\n\n", "line break"),
    "escape_character": (b"{t}\x1b[0m\n", "control character"),
    "delete_character": (b"{t}\x7f", "control character"),
    "space_inside": (b"{t} other\n", "space"),
    "tab_inside": (b"{t}\tother", "tab"),
    "non_ascii": ("{t}é\n".encode(), "non-ASCII"),
    "not_utf8": (b"{t}\xff\xfe\n", "non-ASCII"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILE_CONTENTS))
def test_token_file_with_bad_characters_is_refused_at_start(
    center: DevCenter, tmp_path: Path, case: str
) -> None:
    template, fragment = BAD_FILE_CONTENTS[case]
    path = token_file(tmp_path, template.replace(b"{t}", center.token.encode()))
    env = host_env(
        center.binding_env("unix", AC_MCP_WORKER_TOKEN=None, AC_MCP_WORKER_TOKEN_FILE=str(path))
    )
    for argv in HOST_AND_CHECK:
        runner = runner_for(case == sorted(BAD_FILE_CONTENTS)[0], argv, ["host"])
        proc = runner(argv, env)
        message = assert_bad_binding(
            proc, argv, "AC_MCP_WORKER_TOKEN_FILE", fragment, center.token, case
        )
        assert str(path) in message  # the path is shown: it is what the operator must fix


NOT_A_FILE = ("directory", "fifo")


def not_a_file(tmp_path: Path, kind: str) -> Path:
    """A token-file path naming a directory, or a FIFO nobody writes to (reading it blocks)."""
    path = tmp_path / f"token-{kind}"
    if kind == "directory":
        path.mkdir(mode=0o700)
    else:
        os.mkfifo(path, 0o600)
    return path


@pytest.mark.parametrize("kind", NOT_A_FILE)
def test_a_token_file_that_is_not_a_regular_file_is_refused(
    center: DevCenter, tmp_path: Path, kind: str
) -> None:
    """A directory was a traceback (exit 1; `internal_unexpected_failure` in `check`), a FIFO
    hung every command for ever: each is `bad_binding`, exit 2, one line naming the variable
    and the kind of file. The FIFO cases are all real processes (a hang fails the run's
    timeout instead of the test process); the directory's first command is one."""
    path = not_a_file(tmp_path, kind)
    env = host_env(
        center.binding_env("unix", AC_MCP_WORKER_TOKEN=None, AC_MCP_WORKER_TOKEN_FILE=str(path))
    )
    for argv in HOST_AND_CHECK:
        runner = run if kind == "fifo" or argv == ["host"] else run_in_process
        proc = runner(argv, env)
        message = assert_bad_binding(
            proc,
            argv,
            "AC_MCP_WORKER_TOKEN_FILE",
            f"a {kind}".replace("fifo", "FIFO"),
            center.token,
            kind,
        )
        assert str(path) in message and "regular file" in message, message


@pytest.mark.parametrize("kind", NOT_A_FILE)
def test_supervise_refuses_a_center_token_file_that_is_not_a_regular_file(
    center: DevCenter, tmp_path: Path, kind: str
) -> None:
    """`[center] token_file` naming a directory (a traceback, exit 1) or a FIFO (a hang): exit 2
    (a bad setting), one line naming the fleet file and the key; the state directory is not
    created."""
    from tests.supervisor.supervise_harness import fleet_toml

    path = not_a_file(tmp_path, kind)
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(fleet_toml(center, path, [{"id": "a1", "command": ["true"]}]))
    state = tmp_path / "state"
    argv = ["supervise", "--fleet", str(fleet), "--state", str(state)]
    proc = run(argv, host_env({}, MCPHOST_LOG_LEVEL="debug"))
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.decode()
    assert "Traceback" not in err and proc.stdout == b"", err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    kind_shown = "a directory" if kind == "directory" else "a FIFO"
    assert lines[0].startswith(f"mcphost supervise: {fleet}: center.token_file is"), lines[0]
    assert kind_shown in lines[0] and "expected a regular file" in lines[0], lines[0]
    assert not state.exists()


BAD_INLINE = {
    "line_break": ("{t}\nsecond", "line break"),
    "bell": ("{t}\x07", "control character"),
    "space_inside": ("acat_two words {t}", "space"),
    "non_ascii": ("{t}ü", "non-ASCII"),
    "too_long": ("{t}" + "x" * 9000, "longer than 8192"),
}


@pytest.mark.parametrize("case", sorted(BAD_INLINE))
def test_inline_token_with_bad_characters_is_refused_at_start(center: DevCenter, case: str) -> None:
    template, fragment = BAD_INLINE[case]
    bad = template.replace("{t}", center.token)
    env = host_env(center.binding_env("unix", AC_MCP_WORKER_TOKEN=bad))
    for argv in HOST_AND_CHECK:
        runner = runner_for(case == sorted(BAD_INLINE)[0], argv, ["check"])
        assert_bad_binding(
            runner(argv, env), argv, "AC_MCP_WORKER_TOKEN", fragment, center.token, case
        )


ENDINGS = [b"\n", b"\r\n", b""]


@pytest.mark.parametrize("ending", ENDINGS)
def test_token_file_with_one_line_ending_works(
    center: DevCenter, tmp_path: Path, ending: bytes
) -> None:
    path = token_file(tmp_path, center.token.encode() + ending)
    env = host_env(
        center.binding_env(
            "unix",
            AC_MCP_WORKER_TOKEN=None,
            AC_MCP_WORKER_TOKEN_FILE=str(path),
            AC_MCP_RUNTIME_SOCKET=None,
        )
    )
    runner = run if ending == ENDINGS[0] else run_in_process
    proc = runner(["check", "--json"], env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["center"]["ok"] is True, report
    assert report["token"] == "configured"
    assert_hidden(proc, center.token, ending)


def test_check_classifies_every_bad_binding(center: DevCenter, tmp_path: Path) -> None:
    """`mcphost check` and `check --json` never crash: each bad binding is a classified result."""
    loose = token_file(tmp_path, center.token.encode() + b"\n", "loose")
    loose.chmod(0o644)
    two_lines = token_file(tmp_path, center.token.encode() + b"\nsecond\n", "two-lines")
    cases: list[tuple[dict[str, str | None], str]] = [
        ({"AC_MCP_AGENT_ID": None}, "AC_MCP_AGENT_ID"),
        ({"AC_MCP_ADMIN_URL": "https://center:443"}, "AC_MCP_ADMIN_URL"),
        ({"AC_MCP_SERVER_FINGERPRINT": "sha256:00"}, "AC_MCP_SERVER_FINGERPRINT"),
        ({"AC_MCP_TIER_TOOLS": "maybe"}, "AC_MCP_TIER_TOOLS"),
        ({"AC_MCP_GENERATION": "-3"}, "AC_MCP_GENERATION"),
        ({"AC_MCP_AGENT_ROOT": "relative"}, "AC_MCP_AGENT_ROOT"),
        ({"AC_MCP_WORKER_TOKEN_FILE": str(loose)}, "AC_MCP_WORKER_TOKEN_FILE"),
        (
            {"AC_MCP_WORKER_TOKEN": None, "AC_MCP_WORKER_TOKEN_FILE": str(loose)},
            "AC_MCP_WORKER_TOKEN_FILE",
        ),
        (
            {"AC_MCP_WORKER_TOKEN": None, "AC_MCP_WORKER_TOKEN_FILE": str(two_lines)},
            "AC_MCP_WORKER_TOKEN_FILE",
        ),
        ({"AC_MCP_WORKER_TOKEN": center.token + "\r\nX-Injected: 1"}, "AC_MCP_WORKER_TOKEN"),
    ]
    for index, (overrides, variable) in enumerate(cases):
        env = host_env(center.binding_env("tcp", **overrides))  # type: ignore[arg-type]
        runner = run if index == 0 else run_in_process
        for argv in (["check"], ["check", "--json"]):
            assert_bad_binding(runner(argv, env), argv, variable, "", center.token, overrides)


# -- item 5: a token put where a path or option belongs is never echoed --------------------------


def test_token_in_the_token_file_variable_is_never_echoed(center: DevCenter) -> None:
    for index, overrides in enumerate(
        (
            {"AC_MCP_WORKER_TOKEN": None, "AC_MCP_WORKER_TOKEN_FILE": center.token},
            {"AC_MCP_WORKER_TOKEN_FILE": center.token},  # both set, and no path
        )
    ):
        env = host_env(center.binding_env("unix", **overrides))  # type: ignore[arg-type]
        for argv in HOST_AND_CHECK:
            runner = runner_for(index == 0, argv, ["check", "--json"])
            message = assert_bad_binding(
                runner(argv, env),
                argv,
                "AC_MCP_WORKER_TOKEN_FILE",
                "absolute path",
                center.token,
                overrides,
            )
            assert "not shown" in message


CONFIGGEN = [
    "claude",
    "--agent-id",
    "a1",
    "--admin-url",
    "unix:/run/center.sock",
    "--mcphost-command",
    "/opt/bin/mcphost",
]


def configgen(*argv: str, env: dict[str, str] | None = None, real: bool = True) -> Any:
    """`python -m configgen <argv>` as a real process, or its `main()` in this process."""
    clean = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), **(env or {})}
    if not real:
        return run_in_process(list(argv), clean, module="configgen.cli")
    return run(list(argv), clean, module="configgen")


CONFIGGEN_TOKEN_OPTIONS = [
    [*CONFIGGEN, "--token", SECRET],
    [*CONFIGGEN, f"--token={SECRET}"],
    ["--token", SECRET, *CONFIGGEN],
]


@pytest.mark.parametrize("argv", CONFIGGEN_TOKEN_OPTIONS)
def test_configgen_token_option_is_refused_without_echo(argv: list[str]) -> None:
    proc = configgen(*argv, real=argv == CONFIGGEN_TOKEN_OPTIONS[0])
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == b""
    err = proc.stderr.decode()
    assert "--token-file" not in err, err  # not taken for --token-file
    assert "not shown" in err  # named (or, before the client, an invalid choice), not echoed
    if argv[0] != "--token":
        assert "unrecognized arguments: --token" in err, err
    assert_hidden(proc, SECRET, argv)


def test_configgen_token_file_option_holding_a_token_is_not_echoed() -> None:
    """In this process: `configgen`'s entry point is run for real by the sweep above."""
    proc = configgen(*CONFIGGEN, "--token-file", SECRET, real=False)
    assert proc.returncode == 2 and proc.stdout == b""
    err = proc.stderr.decode()
    assert "AC_MCP_WORKER_TOKEN_FILE" in err and "absolute path" in err and "--token-file" in err
    assert_hidden(proc, SECRET, "--token-file")


def test_configgen_refuses_a_bad_token_exactly_as_the_host_does(center: DevCenter) -> None:
    bad = center.token + "\nsecond line"
    binding = {"AC_MCP_AGENT_ID": "a1", "AC_MCP_ADMIN_URL": "unix:/run/center.sock"}
    proc = configgen(
        "claude",
        "--from-env",
        "--mcphost-command",
        "/opt/bin/mcphost",
        env={**binding, "AC_MCP_WORKER_TOKEN": bad},
        real=False,  # configgen's entry point runs for real in the token-option sweep
    )
    assert proc.returncode == 2 and proc.stdout == b""
    assert_hidden(proc, center.token, "configgen --from-env")
    configgen_message = proc.stderr.decode().strip().removeprefix("configgen: error: ")
    host = run(["host"], host_env({**binding, "AC_MCP_WORKER_TOKEN": bad}))
    host_message = assert_bad_binding(
        host, ["host"], "AC_MCP_WORKER_TOKEN", "line break", center.token, "host"
    )
    assert configgen_message == host_message


TOKEN_AS_OPTION = [
    ("host", ["host", "--token", SECRET]),
    ("check", ["check", "--token", SECRET]),
    ("check --json", ["check", "--json", f"--token={SECRET}"]),
    ("relay-tools", ["relay-tools", "--token", SECRET]),
    ("devcenter", ["devcenter", "--state", "/nonexistent", "--token", SECRET]),
    ("subcommand", [SECRET]),
]


@pytest.mark.parametrize(("name", "argv"), TOKEN_AS_OPTION, ids=[n for n, _ in TOKEN_AS_OPTION])
def test_unknown_options_are_named_without_their_values(name: str, argv: list[str]) -> None:
    runner = run if name == TOKEN_AS_OPTION[0][0] else run_in_process
    proc = runner(argv, host_env({}))
    assert proc.returncode == 2, (name, proc.stderr)
    assert proc.stdout == b""
    assert "Traceback" not in proc.stderr.decode()
    assert_hidden(proc, SECRET, name)


# -- item 5: no abbreviations in any CLI ---------------------------------------------------------


def test_no_cli_accepts_an_abbreviated_option(tmp_path: Path) -> None:
    env = host_env({})
    unrecognized = "unrecognized arguments: "
    cases: list[tuple[str, list[str], str]] = [
        ("mcphost.cli", ["check", "--js"], unrecognized + "--js"),
        ("mcphost.cli", ["relay-tools", "--bund", "party"], unrecognized + "--bund"),
        # --state is required: its abbreviation is not taken for it
        ("mcphost.cli", ["devcenter", "--sta", str(tmp_path / "state")], "required: --state"),
        (
            "configgen",
            ["claude", "--agent-id", "a1", "--admin", "unix:/c.sock"],
            unrecognized + "--admin",
        ),
        (
            "mcphost.cli",
            ["ctl", "--state", str(tmp_path), "status", "--sta", "x"],
            unrecognized + "--sta",
        ),
        (
            "mcphost.cli",
            ["supervise", "--fle", "x", "--state", str(tmp_path)],
            unrecognized + "--fle",
        ),
    ]
    for index, (module, argv, expected) in enumerate(cases):
        if index == 0:
            proc = run(argv, env, module=module)
        else:  # `python -m configgen` is `configgen.cli.main()`
            proc = run_in_process(argv, env, module=module.replace("configgen", "configgen.cli"))
        err = proc.stderr.decode()
        assert proc.returncode == 2, (argv, err)
        assert expected in err, (argv, err)
        assert proc.stdout == b"", argv
