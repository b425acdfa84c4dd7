"""Merge: our servers are added or replaced; everything foreign is kept (bytes, for TOML)."""

from __future__ import annotations

import json
import tomllib
from typing import Any

import pytest

from configgen import CLIENTS, ConfigError, merge, render
from configgen.merge import is_ours
from tests.configgen.configgen_samples import sample_config

FOREIGN = {
    "command": "npx",
    "args": ["-y", "@acme/tool", "--flag=é"],
    "env": {"ZED": "1", "API_KEY": "k"},
    "disabled": False,
    "timeout": 1.5,
}

CODEX_USER = """\
# my codex config
model = "o4"   # trailing comment
approval_policy = "never"

[profiles.fast]
model = "mini"
notes = '''
[mcp_servers.agent-center]
this is a literal string, not a table
'''

[mcp_servers.github]
command = "npx"
args = [
  "-y",
  [ "nested" ] ,
]
env = { TOKEN = "t\\u0001" }   # inline env

# the next server was written by hand
[mcp_servers.local]
command = "/usr/bin/local-mcp"
[mcp_servers.local.env]
"weird key" = \"\"\"multi
[not.a.table]
line\"\"\"
"""

JSON_CLIENTS = [name for name, fmt in CLIENTS.items() if fmt.syntax == "json"]


def _foreign_doc(client_name: str) -> dict[str, Any]:
    key = CLIENTS[client_name].servers_key
    return {
        "theme": "dark",
        key: {"zeta": FOREIGN, "alpha": {"command": "a"}},
        "inputs": [{"id": "x", "type": "promptString"}],
    }


@pytest.mark.parametrize("client_name", JSON_CLIENTS)
def test_json_merge_keeps_foreign_content_and_order(client_name: str) -> None:
    key = CLIENTS[client_name].servers_key
    before = _foreign_doc(client_name)
    merged = json.loads(merge(client_name, json.dumps(before).encode(), sample_config()))
    assert list(merged) == ["theme", key, "inputs"]
    assert merged["theme"] == "dark" and merged["inputs"] == before["inputs"]
    assert list(merged[key]) == ["zeta", "alpha", "agent-center", "agentmux"]
    for name in ("zeta", "alpha"):
        # the foreign server's serialized sub-document is unchanged, key order included
        assert json.dumps(merged[key][name]) == json.dumps(before[key][name])
    fresh = json.loads(render(client_name, sample_config()))[key]
    assert merged[key]["agent-center"] == fresh["agent-center"]


@pytest.mark.parametrize("client_name", JSON_CLIENTS)
def test_json_merge_replaces_ours_in_place_and_is_idempotent(client_name: str) -> None:
    key = CLIENTS[client_name].servers_key
    first = merge(client_name, json.dumps(_foreign_doc(client_name)).encode(), sample_config())
    changed = sample_config(center_name="agent-center", tool_timeout_sec=99, mcphost="/new/mcphost")
    second = merge(client_name, first, changed)
    servers = json.loads(second)[key]
    assert list(servers) == ["zeta", "alpha", "agent-center", "agentmux"]
    assert servers["agent-center"]["command"] == "/new/mcphost"
    assert merge(client_name, second, changed) == second


@pytest.mark.parametrize("client_name", list(CLIENTS))
def test_merge_into_empty_is_render(client_name: str) -> None:
    for empty in (b"", b"  \n", "\ufeff".encode()):
        assert merge(client_name, empty, sample_config()) == render(client_name, sample_config())


@pytest.mark.parametrize("client_name", list(CLIENTS))
def test_conflict_with_a_server_we_did_not_write(client_name: str) -> None:
    fmt = CLIENTS[client_name]
    if fmt.syntax == "json":
        existing = json.dumps({fmt.servers_key: {"agent-center": {"command": "mine"}}}).encode()
    else:
        existing = b'[mcp_servers.agent-center]\ncommand = "mine"\n'
    with pytest.raises(ConfigError, match=r"did not write.*--force"):
        merge(client_name, existing, sample_config())
    forced = merge(client_name, existing, sample_config(), force=True)
    assert b'"mine"' not in forced
    assert b"/opt/mcphost/bin/mcphost" in forced


def test_codex_merge_keeps_foreign_bytes() -> None:
    merged = merge("codex", CODEX_USER.encode(), sample_config()).decode()
    assert merged.startswith(CODEX_USER)
    parsed = tomllib.loads(merged)
    before = tomllib.loads(CODEX_USER)
    assert parsed["profiles"] == before["profiles"]
    for name in ("github", "local"):
        assert parsed["mcp_servers"][name] == before["mcp_servers"][name]
    assert parsed["mcp_servers"]["agent-center"]["env"]["AC_MCP_TIER_TOOLS"] == "false"
    # replacing: the foreign text stays byte-for-byte, our tables are rewritten where they stand
    again = merge("codex", merged.encode(), sample_config(tool_timeout_sec=77)).decode()
    assert again.startswith(CODEX_USER)
    assert "tool_timeout_sec = 77" in again and "tool_timeout_sec = 300" not in again
    assert merge("codex", again.encode(), sample_config(tool_timeout_sec=77)).decode() == again


def test_codex_merge_replaces_ours_in_the_middle_keeping_following_comments() -> None:
    ours = render("codex", sample_config()).decode()
    text = ours + "\n# about the next one\n[mcp_servers.after]\ncommand = 'x'\n"
    merged = merge("codex", text.encode(), sample_config()).decode()
    assert "# about the next one\n[mcp_servers.after]\ncommand = 'x'\n" in merged
    assert merged.count("[mcp_servers.agent-center]") == 1
    assert tomllib.loads(merged)["mcp_servers"]["after"] == {"command": "x"}
    assert merged.startswith(render("codex", sample_config()).decode().split("[mcp_servers")[0])


def test_codex_merge_replaces_ours_where_they_stand_keeping_the_comment_above() -> None:
    ours = render("codex", sample_config()).decode().split("\n\n", 1)[1]  # without the header
    text = '# mine\nmodel = "o4"\n\n# the center, written by configgen\n' + ours
    text += "\n[profiles.fast]\nmodel = 'mini'\n"
    merged = merge("codex", text.encode(), sample_config(tool_timeout_sec=9)).decode()
    assert merged.startswith('# mine\nmodel = "o4"\n\n# the center, written by configgen\n')
    assert merged.endswith("\n\n[profiles.fast]\nmodel = 'mini'\n")
    assert merged.count("tool_timeout_sec = 9") == 2
    assert merged.replace("tool_timeout_sec = 9", "tool_timeout_sec = 300") == text


def test_codex_merge_replaces_ours_after_foreign_tables_split_the_servers() -> None:
    # the first merge appends ours after [profiles.fast]: mcp_servers now comes in two runs
    text = '[mcp_servers.github]\ncommand = "npx"\n\n# about profiles\n[profiles.fast]\nm = 1\n'
    once = merge("codex", text.encode(), sample_config()).decode()
    assert once.startswith(text)
    twice = merge("codex", once.encode(), sample_config(tool_timeout_sec=7)).decode()
    assert twice.startswith(text) and "tool_timeout_sec = 7" in twice
    assert merge("codex", twice.encode(), sample_config()).decode() == once


def test_codex_merge_without_trailing_newline() -> None:
    merged = merge("codex", b'model = "o4"', sample_config()).decode()
    assert merged.startswith('model = "o4"\n\n[mcp_servers.agent-center]\n')
    tomllib.loads(merged)


@pytest.mark.parametrize(
    "existing",
    [
        # ours written in forms configgen does not rewrite as text: refused, never mangled
        b'[mcp_servers]\nagent-center = { command = "x", env = { MCPHOST_CONFIGGEN = "1" } }\n',
        b'mcp_servers.agent-center.command = "x"\nmcp_servers.agent-center.env.MCPHOST_CONFIGGEN = "1"\n',
        b'mcp_servers = { other = { command = "y" } }\n',
    ],
)
def test_codex_merge_refuses_what_it_cannot_rewrite_safely(existing: bytes) -> None:
    with pytest.raises(ConfigError, match=r"\[mcp_servers.NAME\] tables"):
        merge("codex", existing, sample_config())


@pytest.mark.parametrize(
    ("client_name", "existing", "fragment"),
    [
        ("claude", b'{"mcpServers": {}, // c\n}', "not JSON.*comments"),
        ("claude", b"[1]", "not a JSON object"),
        ("vscode", b'{"servers": []}', "'servers' is not an object"),
        ("codex", b"a = ", "not TOML"),
        ("codex", b'[mcp_servers.x]\ncommand = "a"\n[mcp_servers.x]\n', "not TOML"),
        ("codex", b"mcp_servers = 1", "not a table"),
        ("claude", b"\xff\xfe", "not UTF-8"),
    ],
)
def test_merge_input_errors(client_name: str, existing: bytes, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        merge(client_name, existing, sample_config())


def test_is_ours() -> None:
    assert is_ours({"env": {"MCPHOST_CONFIGGEN": "1"}})
    assert not is_ours({"env": {}}) and not is_ours({"command": "x"}) and not is_ours("x")
