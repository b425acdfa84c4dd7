"""Property tests: escaping (every output parses back to the input) and determinism."""

from __future__ import annotations

import json
import tomllib

import tomli_w
from hypothesis import given
from hypothesis import strategies as st

from configgen import CLIENTS, AgentConfig, CenterBinding, RelayBinding, render
from configgen.clients import codex_tables
from configgen.merge import merge
from tests.thorough import examples

# Any Unicode scalar value except NUL (which no path or env value can hold).
TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40
)
PRINTABLE = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=40)
NAME = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)
# The host's token grammar: printable ASCII without spaces (empty: no inline token).
TOKEN = st.from_regex(r"[!-~]{0,40}", fullmatch=True)
SETTINGS = examples(full=150, quick=40)


@SETTINGS
@given(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",))),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1),
)
def test_toml_string_and_key_round_trip(value: str, name: str) -> None:
    text = codex_tables(CLIENTS["codex"], {"s": {"args": [value], "env": {name: value}}})
    assert tomllib.loads(text) == {"mcp_servers": {"s": {"args": [value], "env": {name: value}}}}
    # every control character but tab is escaped (newlines only end lines), and DEL too
    assert all(c in "\t\n" or ord(c) >= 0x20 for c in text)
    assert "\x7f" not in text


@st.composite
def configs(draw: st.DrawFn) -> AgentConfig:
    path = "/" + draw(TEXT)
    center = CenterBinding(
        agent_id=draw(st.from_regex(r"[!-~]{1,30}", fullmatch=True)),
        admin_url="unix:" + path,
        token=draw(TOKEN),
        agent_root=draw(st.none() | st.just("/" + draw(TEXT).strip())),
        tier_tools=draw(st.none() | st.booleans()),
        generation=draw(st.integers(0, 10**12)),
    )
    relay = draw(
        st.none()
        | st.builds(
            RelayBinding,
            bundle=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True),
            session_name=st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,20}", fullmatch=True),
            state_directory=st.none() | TEXT.map(lambda t: "/" + t),
        )
    )
    return AgentConfig(
        center=center,
        relay=relay,
        mcphost="/" + draw(PRINTABLE),
        center_name=draw(NAME),
        relay_name="relay-" + draw(st.from_regex(r"[a-z]{1,8}", fullmatch=True)),
    )


@SETTINGS
@given(configs())
def test_codex_output_parses_and_means_the_input(config: AgentConfig) -> None:
    data = render("codex", config)
    assert data == render("codex", config)
    parsed = tomllib.loads(data.decode("utf-8"))["mcp_servers"]
    center = parsed[config.center_name]
    assert center["command"] == config.mcphost
    assert config.center is not None
    assert center["env"]["AC_MCP_AGENT_ID"] == config.center.agent_id
    assert center["env"]["AC_MCP_ADMIN_URL"] == config.center.admin_url
    assert center["env"].get("AC_MCP_WORKER_TOKEN", "") == config.center.token
    assert center["env"].get("AC_MCP_AGENT_ROOT") == config.center.agent_root
    if config.relay is not None:
        assert parsed[config.relay_name]["args"][2] == config.relay.bundle
    # merging into our own output changes nothing (idempotence)
    assert merge("codex", data, config) == data


@SETTINGS
@given(configs())
def test_json_outputs_parse_and_are_deterministic(config: AgentConfig) -> None:
    for name, fmt in CLIENTS.items():
        if fmt.syntax != "json":
            continue
        try:
            data = render(name, config)
        except ValueError:  # refused: a value this client would interpolate
            continue
        assert data == render(name, config)
        servers = json.loads(data)[fmt.servers_key]
        assert servers[config.center_name]["command"] == config.mcphost
        assert merge(name, data, config) == data


@SETTINGS
@given(
    st.dictionaries(
        NAME.filter(lambda n: n not in {"agent-center", "agentmux"}),
        st.tuples(TEXT, st.dictionaries(TEXT.filter(bool), TEXT, max_size=3)),
        max_size=4,
    ),
    st.booleans(),
)
def test_codex_merge_keeps_arbitrary_foreign_servers_byte_for_byte(
    foreign: dict[str, tuple[str, dict[str, str]]], ours_first: bool
) -> None:
    config = AgentConfig(
        center=CenterBinding(agent_id="a", admin_url="unix:/s"),
        relay=RelayBinding(bundle="b", session_name="s"),
        mcphost="/m",
    )
    text = "".join(
        f"# {name}\n" + _table(name, command, env) + "\n"
        for name, (command, env) in foreign.items()
    )
    if ours_first:  # our tables before foreign ones: replaced where they stand
        text = render("codex", config).decode() + "\n" + text
    merged = merge("codex", text.encode(), config).decode()
    parsed = tomllib.loads(merged)["mcp_servers"]
    for name, (command, env) in foreign.items():
        assert parsed[name] == {"command": command, "env": env}
        block = f"# {name}\n" + _table(name, command, env)
        assert block in merged
    if not ours_first:
        assert merged.startswith(text)
    assert merge("codex", merged.encode(), config).decode() == merged


def _table(name: str, command: str, env: dict[str, str]) -> str:
    return tomli_w.dumps({"mcp_servers": {name: {"command": command, "env": env}}})
