"""Issue 34: a Claude Code installed by its vendor's ways under the operator's home runs fenced,
and the rest of that home stays hidden while it runs.

The operator's home is a temporary one (the supervisor's `HOME`) laid out as Claude Code's
native installer lays it out (`native`: `~/.local/bin/claude`, a symlink to
`~/.local/share/claude/versions/<version>`, with an older version file beside it) or as
`npm install -g` with a user prefix does (`npm-prefix`: `~/.npm-global/bin/claude`, a symlink
into `~/.npm-global/lib/node_modules/@anthropic-ai/claude-code/bin/claude.exe`, with another
package beside it); the program is the real Claude Code CLI (tools/node_modules' native binary,
linked in). The home also holds a key in `~/.ssh`, a file in `~/.claude` (the sign-in
directory) and one of its own. The supervisor's `PATH` starts with the link's directory, and a
default-fenced agent runs plain `claude -p` against the model stand-in, whose script has it run a
Bash command that looks for each of those and then call the center's `get_my_work` through its
MCP server.

Shown: the agent runs (the fence hid the whole home before: its spawn failed "hidden by the
fence"); Claude Code calls the center as the agent; the command finds the program it runs and
nothing else of the home: not the version or package beside it, not the link, not the key, not
the sign-in directory, not the home's own file (fence.py `install_trees`, `vendor_trees`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from mcphost.standin.anthropic import ModelStandIn, Say, ToolUse
from mcphost.supervisor.confine import probe as machine
from mcphost.testing import DevCenter
from tests.blackbox.conftest import project_root
from tests.supervisor.supervise_harness import Supervised, center_heard, fenced_turn

CLAUDE = project_root() / "tools" / "node_modules" / ".bin" / "claude"
GET_MY_WORK = "mcp__agent-center__get_my_work"
VERSION = "2.1.332"

# deep (make test-slow): the real Claude Code, in the fence, from the operator's home.
pytestmark = [
    pytest.mark.deep,
    pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed"),
    pytest.mark.skipif(
        machine.probe().missing() is not None, reason=f"no fence here: {machine.probe().missing()}"
    ),
]


def link_or_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)  # 400 MB: a link where the file system allows it
    except OSError:
        shutil.copy2(source, target)


def vendor_home(base: Path, layout: str) -> tuple[Path, dict[str, Path]]:
    """An operator's home with Claude Code where one of its vendor's ways puts it (`native`:
    its installer; `npm-prefix`: `npm install -g` with a user prefix), and what the agent's
    Bash command looks for: its own program (`own-program`, which it must see), and what it
    must not (the link on PATH, another version or package beside it, a key, the sign-in
    directory, a file of the home)."""
    home = base / "operator"
    if layout == "native":
        versions = home / ".local" / "share" / "claude" / "versions"
        program, beside = versions / VERSION, versions / "2.0.0"
        link = home / ".local" / "bin" / "claude"
    else:
        modules = home / ".npm-global" / "lib" / "node_modules"
        package = modules / "@anthropic-ai" / "claude-code"
        program, beside = package / "bin" / "claude.exe", modules / "other-package" / "index.js"
        (package / "package.json").parent.mkdir(parents=True)
        (package / "package.json").write_text('{"name": "@anthropic-ai/claude-code"}\n')
        link = home / ".npm-global" / "bin" / "claude"
    link_or_copy(CLAUDE.resolve(), program)
    beside.parent.mkdir(parents=True, exist_ok=True)
    beside.write_text("beside\n")
    link.parent.mkdir(parents=True)
    link.symlink_to(program)
    (home / ".ssh").mkdir(mode=0o700)
    (home / ".ssh" / "id_ed25519").write_text("operator-ssh-key\n")
    (home / ".claude").mkdir()
    (home / ".claude" / "notes.md").write_text("operator-claude-dir\n")
    (home / "diary.txt").write_text("operator-home-file\n")
    return home, {
        "own-program": program,
        "beside": beside,
        "link": link,
        "ssh-key": home / ".ssh" / "id_ed25519",
        "claude-dir": home / ".claude" / "notes.md",
        "home-file": home / "diary.txt",
    }


def probe(checks: dict[str, Path]) -> str:
    """The Bash command: which of `checks` it finds."""
    return "; ".join(
        f"if [ -e {path} ] || [ -L {path} ]; then echo {name}-seen; else echo {name}-hidden; fi"
        for name, path in checks.items()
    )


@pytest.mark.parametrize("layout", ["native", "npm-prefix"])
def test_claude_code_from_its_native_installer_runs_fenced_and_the_home_stays_hidden(
    tmp_path: Path, own_center: DevCenter, layout: str
) -> None:
    center = own_center
    if not CLAUDE.exists():
        pytest.fail(f"{CLAUDE} missing: run `make node` (make test does it)")
    home, checks = vendor_home(tmp_path, layout)
    (tmp_path / "sv").mkdir()
    sv = Supervised(tmp_path / "sv", center)
    sv.extra_env["HOME"] = str(home)
    sv.extra_env["PATH"] = f"{checks['link'].parent}:/usr/local/bin:/usr/bin:/bin"
    agent = center.agent_id
    script = [
        ToolUse("Bash", {"command": probe(checks), "description": "look around"}),
        ToolUse("ToolSearch", {"query": f"select:{GET_MY_WORK}"}),
        ToolUse(GET_MY_WORK, {}),
        Say("done"),
    ]
    with ModelStandIn(script).running() as model:
        env = {
            "ANTHROPIC_BASE_URL": model.base_url,
            "ANTHROPIC_API_KEY": "sk-ant-standin-not-a-key",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
        }
        command = [
            "claude", "-p", "Do the task.", "--mcp-config", "{mcp_config}",
            "--strict-mcp-config", "--allowedTools", "Bash,mcp__agent-center",
            "--output-format", "json",
        ]  # fmt: skip
        entry = {"id": agent, "client": "claude", "runner": "process", "command": command}
        sv.write_fleet([entry], restart="never", env=env)
        try:
            log = fenced_turn(sv, agent)
            results = [r for e in model.exchanges for r in e.tool_results]
            assert len(results) == 3, (log, sv.status()[agent], results)
            bash, _, work = results
            out = bash["text"]
            assert not bash["is_error"], bash
            assert "own-program-seen" in out, out
            for hidden in ("beside", "link", "ssh-key", "claude-dir", "home-file"):
                assert f"{hidden}-hidden" in out, out
            assert "operator-ssh-key" not in repr(model.exchanges)
            assert center_heard(center, agent, "get_my_work"), log
            assert not work["is_error"] and '"tasks"' in work["text"], work
        finally:
            sv.close()
            shutil.rmtree(sv.state, ignore_errors=True)
