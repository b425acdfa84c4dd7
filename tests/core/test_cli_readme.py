"""README's commands exist as README names them: a newcomer follows README from the top without
reading tests/ or the source (issue #34; the walk: bench/results/2026-12-07-newcomer-walk.md).

Each `make TARGET` is a Makefile target; each `mcphost SUB` is a subcommand of `mcphost.cli`
(`mcphost demo X` one of the demo's runs); each `--flag` after `mcphost supervise` or
`mcphost ctl SUB` is one that command's own `--help` lists (real processes); and the fleet of
"Real agents in the first hour" binds at the center every agent id its fleet file names.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

from mcphost.cli import SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[2]
# `mcphost` as a command word: at a line's start, after a space or paren, or a `bin/` (not the
# `mcphost` of a path such as /var/lib/mcphost)
MCPHOST = r"(?:^|(?<=[\s(])|(?<=bin/))mcphost"
README = (ROOT / "README.md").read_text()


def code_spans(text: str) -> list[str]:
    """Every fenced block's lines and every inline `code` span of `text`."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    prose = re.sub(r"```[a-z]*\n.*?```", "", text, flags=re.S)
    return [line for block in blocks for line in block.splitlines()] + re.findall(
        r"`([^`\n]+)`", prose
    )


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def test_every_make_target_readme_names_is_in_the_makefile() -> None:
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    named = {m for span in code_spans(README) for m in re.findall(r"\bmake ([a-z][a-z-]*)", span)}
    assert named, "README names no make target"
    assert named <= targets, f"README names make targets the Makefile lacks: {named - targets}"


def test_every_mcphost_subcommand_readme_names_exists() -> None:
    spans = code_spans(README)
    named = {m for s in spans for m in re.findall(MCPHOST + r" ([a-z][a-z-]+)\b", s)}
    assert named <= set(SUBCOMMANDS), f"not subcommands: {named - set(SUBCOMMANDS)}"
    demo_usage = mcphost_help("demo")
    for run in {m for s in spans for m in re.findall(MCPHOST + r" demo ([a-z]+)\b", s)}:
        assert re.search(rf"\b{run}\b", demo_usage.split("\n", 1)[0]), (run, demo_usage)


@functools.cache
def mcphost_help(*command: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "mcphost", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout + done.stderr


def test_every_flag_readme_gives_supervise_and_ctl_is_in_their_help() -> None:
    missing = []
    for span in code_spans(README):
        for tail in re.findall(MCPHOST + r" supervise\b([^|;&#]*)", span):
            for flag in re.findall(r"(?<!\S)(--[a-z][a-z-]*)", tail):
                if flag not in mcphost_help("supervise"):
                    missing.append(f"supervise {flag}: {span}")
        for sub, tail in re.findall(MCPHOST + r" ctl(?: --state \S+)? ([a-z]+)\b([^|;&#]*)", span):
            for flag in re.findall(r"(?<!\S)(--[a-z][a-z-]*)", tail):
                if flag not in mcphost_help("ctl", sub):
                    missing.append(f"ctl {sub} {flag}: {span}")
    assert not missing, missing


def test_the_first_hour_fleet_binds_its_agent_ids_at_the_center() -> None:
    # An agent whose id the center does not know runs, but every center call it makes is
    # refused (`not_found`): the section must bind each id its fleet file names.
    text = section("Real agents in the first hour")
    ids = set(re.findall(r'^\s*id = "([^"]+)"', text, flags=re.M))
    assert ids, "the section's fleet file names no agent"
    bound = {
        agent
        for body in re.findall(r"_devcenter/agents[^\n]*\n[^\n]*'(\{.*?\})'", text)
        for agent in re.findall(r'"([^"]+)"', body.split('"agent_ids"', 1)[1].split("]")[0])
    }
    assert ids <= bound, f"ids the section never binds at the center: {ids - bound}"
