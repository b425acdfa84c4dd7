"""Black-box: `mcphost demo model` as a real process, as an operator runs it.

It must print both stand-ins' addresses and, for each CLI, an `env` line that is a valid inline
table of a fleet file whose addresses answer: the Messages API (Claude Code) at
ANTHROPIC_BASE_URL, the Responses API (Codex) at OPENAI_BASE_URL, with its `/v1`; both follow
the demo script (the first step of any prompt is the center's get_my_work). SIGTERM stops it
with exit 0. A port already taken is refused with exit 1 and a message that says what to do.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import tomllib
import urllib.request
from typing import Any

CENTER = "mcp__agent-center__get_my_work"


def post(url: str, body: dict[str, Any]) -> str:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return str(reply.read().decode())


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "mcphost", "demo", "model", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_demo_model_prints_env_lines_that_serve_claude_code_and_codex() -> None:
    proc = start()
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:  # until the banner's last line
            lines.append(line)
            if line.startswith("Stop it with Ctrl-C"):
                break
        out = "".join(lines)
        envs = [
            tomllib.loads(line.strip())["env"]
            for line in lines
            if line.strip().startswith("env = ")
        ]
        assert len(envs) == 2, out
        claude, codex = envs
        assert claude["ANTHROPIC_API_KEY"] and codex["OPENAI_API_KEY"], out
        assert codex["OPENAI_BASE_URL"].endswith("/v1"), out
        assert f"kill -TERM {proc.pid}" in out, out
        assert re.search(r"codex -c openai_base_url='\"http://127\.0\.0\.1:\d+/v1\"'", out), out
        prompt = {"role": "user", "content": "what is my work?"}
        body = {"messages": [prompt], "tools": [{"name": CENTER}]}
        answer = json.loads(post(claude["ANTHROPIC_BASE_URL"] + "/v1/messages", body))
        assert answer["content"][0]["name"] == CENTER, answer
        item = {"type": "message", "role": "user", "content": "what is my work?"}
        streamed = post(codex["OPENAI_BASE_URL"] + "/responses", {"input": [item], "tools": []})
        assert '"name": "get_my_work"' in streamed, streamed
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert proc.stdout.read().strip() == "Stand-ins stopped."
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_port_already_taken_is_refused_saying_what_to_do() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = start("--port", str(taken.getsockname()[1]))
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "cannot listen on 127.0.0.1" in err and "choose another --port" in err, err
