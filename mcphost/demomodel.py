"""`mcphost demo model`: the model stand-ins an operator runs to try real agents without an API key.

Owns: the command that serves the demo script (mcphost/standin/director.py) on the loopback for
both model APIs at once (Anthropic's Messages API for Claude Code, OpenAI's Responses API for
Codex, each on its own port), prints the exact `env` lines to paste into a fleet file for each
CLI (and the variables for running a CLI by hand), how to prompt it and how to stop it, then
serves until SIGINT or SIGTERM. `env_lines` is the one place those lines are written (`mcphost
demo agents` prints its fleet with them).

Must never: bind anything but 127.0.0.1, or need a real key (the keys it prints are stand-ins the
model never checks).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from contextlib import ExitStack

CLAUDE_KEY = "sk-ant-standin-not-a-key"
OPENAI_KEY = "sk-standin-not-a-key"
# Claude Code's own traffic besides the model (updates, telemetry, error reports): off, as the
# stand-in answers only the model API.
CLAUDE_QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
}

SCRIPT = """\
What the stand-in model does with every prompt (a relay delivery is a prompt too):
  1. calls the center's get_my_work (as the agent: the center records it);
  2. a line `send PEER: MESSAGE` -> the relay's send of MESSAGE to PEER; else
     a line `run: COMMAND`    -> runs COMMAND with the CLI's shell tool (Codex asks to
                                 leave its sandbox: an approval, or an ACP permission);
  3. a line `choose`          -> the relay's list (decisions) and choose of the first pending
                                 request's allow-once option (Claude Code, codex-acp);
  4. answers with one line per result."""


def claude_env(base_url: str) -> dict[str, str]:
    """A Claude Code (or claude-code-acp) agent's `env` for the Messages stand-in at `base_url`."""
    return {"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": CLAUDE_KEY, **CLAUDE_QUIET}


def codex_env(base_url: str) -> dict[str, str]:
    """A Codex (or codex-acp) agent's `env`: the supervisor writes OPENAI_BASE_URL into its
    `config.toml` as `openai_base_url` (Codex itself ignores the variable) and the key into its
    `auth.json`."""
    return {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": OPENAI_KEY}


def inline_table(env: dict[str, str]) -> str:
    """`env` as a fleet file's inline TOML table."""
    from mcphost.testing.fleet import toml_value

    return "{ " + ", ".join(f"{key} = {toml_value(value)}" for key, value in env.items()) + " }"


def env_lines(claude_url: str, codex_url: str) -> str:
    """What to paste: a fleet file's `env` per CLI, and the same by hand."""
    claude, codex = claude_env(claude_url), codex_env(codex_url)
    return "\n".join(
        [
            'In the fleet file, a Claude Code agent ([[agent]] with client = "claude"):',
            f"  env = {inline_table(claude)}",
            'a Codex agent (client = "codex"; the supervisor writes Codex\'s openai_base_url):',
            f"  env = {inline_table(codex)}",
            "By hand, outside a fleet:",
            f"  ANTHROPIC_BASE_URL={claude_url} ANTHROPIC_API_KEY={CLAUDE_KEY} claude",
            f"  OPENAI_API_KEY={OPENAI_KEY} codex -c openai_base_url='\"{codex_url}\"'",
        ]
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="mcphost demo model",
        description="Serve a scripted model for Claude Code and Codex on 127.0.0.1 and print "
        "the env lines to paste into a fleet file.",
        epilog=SCRIPT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--port",
        type=int,
        default=0,
        help="Claude Code's stand-in on PORT and Codex's on PORT+1 (default: two free ports)",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65534:
        parser.error("--port must be between 0 and 65534")
    from mcphost.standin.director import ClaudeDirector, CodexDirector

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    with ExitStack() as stack:
        try:
            claude = stack.enter_context(ClaudeDirector().running(args.port))
            codex = stack.enter_context(CodexDirector().running(args.port + 1 if args.port else 0))
        except OSError as exc:
            print(
                f"mcphost demo model: cannot listen on 127.0.0.1 ({exc.strerror}): "
                "choose another --port, or leave it out for free ports",
                file=sys.stderr,
            )
            return 1
        print("Model stand-ins on the loopback, serving the demo script:")
        print(f"  Anthropic Messages API (Claude Code, claude-code-acp): {claude.base_url}")
        print(f"  OpenAI Responses API (Codex, codex-acp):               {codex.base_url}")
        print()
        print(env_lines(claude.base_url, codex.base_url))
        print()
        print(SCRIPT)
        print()
        print(f"Stop it with Ctrl-C, or: kill -TERM {os.getpid()}", flush=True)
        stop.wait()
    print("Stand-ins stopped.", flush=True)
    return 0
