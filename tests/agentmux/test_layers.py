"""The operator's configuration layers: agentmux's precedence, the same for the relay and its tools.

Reference §3.1: `AGENTMUX_CONFIGURATION_DIRECTORY` (`:`-separated), else
`$XDG_CONFIG_HOME/agentmux`, else `~/.config/agentmux`; the first source that names a layer is
the whole list. The supervisor's relay reads the fleet's generated layer first, then those
(`RelayHost.configuration_roots`); the relay tools resolve the same operator layers
(`layout.configuration_roots`). A `policies.toml` sits in every candidate place, each with its
own default policy, so which one the relay honours is visible.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mcphost.relay.policy import load_policies
from mcphost.relaytools import layout
from mcphost.supervisor.agents.relayhost import RelayHost

PLACES = ("env1", "env2", "xdg", "home")


@dataclass
class NoAgents:
    slots: Mapping[str, object] = field(default_factory=dict)
    roots: Mapping[tuple[int, int], tuple[str, int]] = field(default_factory=dict)


def _policies(where: Path, name: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    (where / "policies.toml").write_text(
        f'format-version = 1\ndefault = "{name}"\n\n[[policies]]\nid = "{name}"\n'
        '[policies.controls]\nlist = "home"\n'
    )


def _places(tmp: Path) -> dict[str, Path]:
    return {
        "env1": tmp / "env1",
        "env2": tmp / "env2",
        "xdg": tmp / "xdg" / "agentmux",
        "home": tmp / "home" / ".config" / "agentmux",
    }


ALL = frozenset(PLACES)


@pytest.mark.parametrize(
    ("env_dir", "xdg", "files", "layers", "honoured"),
    [
        pytest.param(True, True, ALL, ["env1", "env2"], "env1", id="env dir set"),
        pytest.param(True, True, ALL - {"env1"}, ["env1", "env2"], "env2", id="env dir, 2nd"),
        pytest.param(False, True, ALL, ["xdg"], "xdg", id="XDG set"),
        pytest.param(False, True, {"home"}, ["xdg"], None, id="XDG set, ~/.config not read"),
        pytest.param(False, False, ALL, ["home"], "home", id="only ~/.config"),
        pytest.param(False, False, frozenset(), ["home"], None, id="none"),
    ],
)
def test_the_operator_layers_follow_agentmuxs_precedence(
    tmp_path: Path,
    env_dir: bool,
    xdg: bool,
    files: frozenset[str],
    layers: list[str],
    honoured: str | None,
) -> None:
    places = _places(tmp_path)
    for name in files:
        _policies(places[name], name)
    env = {"HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    if env_dir:
        env["AGENTMUX_CONFIGURATION_DIRECTORY"] = f"{places['env1']}:{places['env2']}"
    if xdg:
        env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    operator = tuple(places[name] for name in layers)

    host = RelayHost(str(tmp_path / "state"), env, NoAgents())
    assert host.configuration_roots == (tmp_path / "state" / "relay" / "config", *operator)
    assert layout.configuration_roots((), env) == operator  # the relay tools agree
    policies = load_policies(host.configuration_roots)
    if honoured is None:
        assert policies.path is None  # no file in the layers: the starter presets
    else:
        assert policies.path == places[honoured] / "policies.toml"
        assert policies.default == honoured


def test_blank_parts_name_no_layer() -> None:
    env = {"HOME": "/h", "AGENTMUX_CONFIGURATION_DIRECTORY": " : "}
    assert layout.configuration_roots((), env) == (Path("/h/.config/agentmux"),)
    env["XDG_CONFIG_HOME"] = "relative/is/ignored"
    assert layout.configuration_roots((), env) == (Path("/h/.config/agentmux"),)
    env["AGENTMUX_CONFIGURATION_DIRECTORY"] = "/a::/b:"
    assert layout.configuration_roots((), env) == (Path("/a"), Path("/b"))
