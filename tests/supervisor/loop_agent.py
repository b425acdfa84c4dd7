"""A stand-in agent that keeps calling: `loop_agent.py <mcp-config> <sessions>` opens that many
center sessions through the attach entry of its config and, in one thread per session, calls
`get_my_work` again and again (paced at about 50 calls a second per session) until the file
`./stop` appears; every call is one line of `./loop.jsonl`: `{"session", "i", "ok", "text",
"at"}`. Then it writes `./stopped` and waits for SIGTERM (so its PID and generation stay).

Standard library plus `mcphost.testing.standin_agent.Session` (the stand-in's MCP client).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcphost.testing.standin_agent import Session

LOCK = threading.Lock()


def loop(index: int, entry: dict[str, object]) -> None:
    session = Session(entry)  # type: ignore[arg-type]
    session.open()
    calls = 0
    while not os.path.exists("stop"):
        calls += 1
        reply = session.request("tools/call", {"name": "get_my_work", "arguments": {}})
        result = reply.get("result") or {}
        ok = "result" in reply and not result.get("isError")
        text = json.dumps(result.get("content") or reply.get("error"))[:600]
        line = {"session": index, "i": calls, "ok": ok, "text": text, "at": time.time()}
        with LOCK, open("loop.jsonl", "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
        time.sleep(0.02)  # pacing: the agent's own rhythm, not a test's wait


def main(argv: list[str]) -> int:
    with open(argv[0], encoding="utf-8") as handle:
        entry = json.load(handle)["mcpServers"]["agent-center"]
    threads = [
        threading.Thread(target=loop, args=(i, entry), daemon=True) for i in range(int(argv[1]))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    Path("stopped").write_text("stopped")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
