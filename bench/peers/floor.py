"""The interpreter floor: answer one `initialize` with a canned reply, then wait for EOF."""

import json
import sys

request = json.loads(sys.stdin.readline())
reply = {
    "jsonrpc": "2.0",
    "id": request["id"],
    "result": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "serverInfo": {"name": "floor", "version": "1"},
    },
}
sys.stdout.write(json.dumps(reply) + "\n")
sys.stdout.flush()
sys.stdin.read()
