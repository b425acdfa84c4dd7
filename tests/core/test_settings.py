"""The settings base (mcphost.settings) and the relay tools' settings on it: explicit sources,
flag > env > file precedence, errors named as each source spells the setting, secrets unshown,
frozen values; and the processes' exit 2 with one line per problem."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from mcphost.agentmux.settings import AgentmuxSettings
from mcphost.binding import AgentBinding, BindingError
from mcphost.relaytools.settings import RelayTimeouts
from mcphost.settings import SettingError, Settings


class Demo(Settings):
    model_config = SettingsConfigDict(env_prefix="DEMO_")
    flag_names = {"restart_delay": "--delay"}

    restart_delay: float = Field(1.0, gt=0, description="a positive number of seconds")
    name: str = Field(description="the fleet's name")
    password: str | None = Field(None, json_schema_extra={"secret": True}, min_length=12)


def test_sources_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    toml = tmp_path / "s.toml"
    toml.write_text('name = "from-file"\nrestart_delay = 3\n')
    assert Demo.load(file=str(toml)).name == "from-file"
    both = Demo.load(env={"DEMO_NAME": " from-env "}, file=str(toml))
    assert (both.name, both.restart_delay) == ("from-env", 3.0)
    flags = Demo.load(env={"DEMO_NAME": "from-env"}, file=str(toml), cli={"name": "from-flag"})
    assert flags.name == "from-flag"


def test_only_upper_case_names_and_nonempty_values_count() -> None:
    with pytest.raises(SettingError) as info:
        Demo.load(env={"demo_name": "x", "DEMO_RESTART_DELAY": "  "})
    assert info.value.lines() == ["DEMO_NAME is not set: expected the fleet's name"]


def test_errors_name_the_setting_as_its_source_spells_it(tmp_path: Path) -> None:
    toml = tmp_path / "s.toml"
    toml.write_text('name = "n"\nrestart_delay = -1\ntypo = 1\n')
    with pytest.raises(SettingError) as info:
        Demo.load(file=str(toml))
    assert info.value.lines() == [
        f"{toml}: restart_delay is -1: expected a positive number of seconds",
        f"{toml}: typo is not one: expected a known setting",
    ]
    with pytest.raises(SettingError) as info:
        Demo.load(env={"DEMO_NAME": "n", "DEMO_RESTART_DELAY": "soon"}, cli={"restart_delay": 0})
    assert str(info.value) == "--delay is 0: expected a positive number of seconds"
    with pytest.raises(SettingError) as info:
        Demo.load(env={"DEMO_NAME": "n", "DEMO_RESTART_DELAY": "soon"})
    assert info.value.variable == "DEMO_RESTART_DELAY" and "'soon'" in str(info.value)


def test_a_secret_field_is_never_shown() -> None:
    with pytest.raises(SettingError) as info:
        Demo.load(env={"DEMO_NAME": "n", "DEMO_PASSWORD": "SECRETshort"})
    assert "SECRET" not in str(info.value) and "DEMO_PASSWORD is invalid (not shown)" in str(
        info.value
    )


def test_malformed_file_is_one_named_error(tmp_path: Path) -> None:
    toml = tmp_path / "s.toml"
    toml.write_text("name = \n")
    with pytest.raises(SettingError) as info:
        Demo.load(file=str(toml))
    assert info.value.variable == str(toml) and "TOML" in str(info.value)
    with pytest.raises(SettingError) as info:
        Demo.load(file=str(tmp_path / "absent.toml"))
    assert str(info.value) == (
        f"{tmp_path}/absent.toml is not a file: expected a readable TOML settings file"
    )


def test_direct_construction_reads_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEMO_NAME", "from-env")
    monkeypatch.setenv("DEMO_RESTART_DELAY", "9")
    d = Demo(name="given")
    assert (d.name, d.restart_delay) == ("given", 1.0)
    with pytest.raises(AttributeError):
        d.name = "other"  # type: ignore[misc]


def test_binding_reports_every_problem_in_variable_order() -> None:
    with pytest.raises(BindingError) as info:
        AgentBinding.from_env(
            {
                "AC_MCP_ADMIN_URL": "tcp://h:1",
                "AC_MCP_GENERATION": "x",
                "AC_MCP_WORKER_TOKEN": "acat_SE CRET",
            }
        )
    variables = [p.variable for p in info.value.problems]
    assert variables == [
        "AC_MCP_AGENT_ID",
        "AC_MCP_SERVER_FINGERPRINT",
        "AC_MCP_WORKER_TOKEN",
        "AC_MCP_GENERATION",
    ]
    assert all("SECRET" not in line for line in info.value.lines())


def test_agentmux_settings_flags_beat_env() -> None:
    env = {"AGENTMUX_BUNDLE": "p", "AGENTMUX_CONFIGURATION_DIRECTORY": "/a::/b"}
    s = AgentmuxSettings.from_env(env)
    assert (s.bundle, s.session, s.configuration_directory) == ("p", None, ("/a", "/b"))
    s = AgentmuxSettings.from_env(env, bundle="q", configuration_directory=("/f",), session="")
    assert (s.bundle, s.session, s.configuration_directory) == ("q", None, ("/f",))


@pytest.mark.parametrize("raw", ["0", "-5", "soon", "inf", "nan"])
def test_relay_timeouts_must_be_positive_milliseconds(raw: str) -> None:
    assert RelayTimeouts.from_env({}).request_s == 5.0
    assert RelayTimeouts.from_env({"MCPHOST_RELAY_HELLO_TIMEOUT_MS": "300"}).hello_s == 0.3
    with pytest.raises(SettingError) as info:
        RelayTimeouts.from_env({"MCPHOST_RELAY_REQUEST_TIMEOUT_MS": raw})
    assert str(info.value) == (
        f"MCPHOST_RELAY_REQUEST_TIMEOUT_MS is {raw!r}: expected a positive number of milliseconds"
    )


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AC_MCP_", "MCPHOST_"))}
    return subprocess.run(
        [sys.executable, "-m", "mcphost.cli", *argv],
        env={**base, **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
    )


def test_relay_tools_exit_2_on_a_bad_timeout(tmp_path: Path) -> None:
    proc = _run(
        ["relay-tools", "--state-directory", str(tmp_path)],
        {"MCPHOST_RELAY_HELLO_TIMEOUT_MS": "soon"},
    )
    assert proc.returncode == 2 and proc.stdout == b""
    assert proc.stderr.decode().splitlines() == [
        "mcphost relay-tools: MCPHOST_RELAY_HELLO_TIMEOUT_MS is 'soon': "
        "expected a positive number of milliseconds"
    ]


def test_host_prints_one_line_per_bad_variable() -> None:
    proc = _run(["host"], {"AC_MCP_GENERATION": "-1", "AC_MCP_WORKER_TOKEN": "acat_SE CRET"})
    assert proc.returncode == 2 and proc.stdout == b""
    lines = proc.stderr.decode().splitlines()
    assert [line.split()[1] for line in lines] == [
        "AC_MCP_AGENT_ID",
        "AC_MCP_ADMIN_URL",
        "AC_MCP_WORKER_TOKEN",
        "AC_MCP_GENERATION",
    ]
    assert all(line.startswith("mcphost: ") and "expected" in line for line in lines)
    assert b"SECRET" not in proc.stderr
