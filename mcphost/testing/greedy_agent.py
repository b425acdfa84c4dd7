"""A greedy agent's client, run as the agent through `mcphost ctl exec` (standard library only).

Used by tests/supervisor/test_supervise_shares.py and bench/shares.py to attack a supervisor
the way one agent could. `python -I greedy_agent.py SOCKET SESSIONS MODE ARG`: attaches
SESSIONS raw sessions to the attach socket SOCKET (each must get `ok`), initializes each, prints
`ready`, then:
- `flood BYTES`: every session sends BYTES of `tools/list` requests, each padded to 64 KiB in
  `params._meta`, from its own thread, and never reads; `sent <n>` is printed when session n's
  whole flood was taken by the socket;
- `calls N`: N `tools/call get_task` requests, spread over the sessions, then `sent`; every
  answer read is printed as `answer <id>`;
- `keep N`: as `calls`, but each answer is followed by a new call on its session, so N stay
  in flight (answers are not printed).
It then waits until killed. Stdout lines are flushed one by one.
"""

from __future__ import annotations

import json
import socket
import sys
import threading

PAD = 64 * 1024
INIT = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "greedy-agent", "version": "1"},
}


def say(*words: object) -> None:
    print(*words, flush=True)


def attach(path: str) -> tuple[socket.socket, object]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 * 1024)
    sock.connect(path)
    reader = sock.makefile("rb")
    status = reader.readline()
    if not status.startswith(b"ok "):
        say("refused", status.decode(errors="replace").strip())
        sys.exit(3)
    send(sock, {"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": INIT})
    reader.readline()
    send(sock, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    return sock, reader


def send(sock: socket.socket, message: dict[str, object]) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


def flood(n: int, sock: socket.socket, size: int) -> None:
    line = b'{"jsonrpc":"2.0","id":%d,"method":"tools/list","params":{"_meta":{"pad":"%s"}}}\n'
    for i in range(max(1, size // PAD)):
        sock.sendall(line % (i, b"x" * PAD))
    say("sent", n)


def call(sock: socket.socket, i: int) -> None:
    params = {"name": "get_task", "arguments": {"task_id": f"t-{i}"}}
    send(sock, {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params})


def answers(sock: socket.socket, reader: object, keep: bool, first: int, step: int) -> None:
    n = first
    for raw in reader:  # type: ignore[attr-defined]
        if keep:
            n += step
            call(sock, n)
        else:
            say("answer", json.loads(raw).get("id"))


def main() -> None:
    path, sessions, mode, arg = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    attached = [attach(path) for _ in range(sessions)]
    say("ready")
    if mode == "flood":
        for n, (sock, _) in enumerate(attached):
            threading.Thread(target=flood, args=(n, sock, arg), daemon=True).start()
    else:
        for i in range(arg):
            call(attached[i % sessions][0], i)
        say("sent")
        step = max(arg, 1) * 1000  # ids stay unique per session: first + k * step
        for n, (sock, reader) in enumerate(attached):
            args = (sock, reader, mode == "keep", n, step)
            threading.Thread(target=answers, args=args, daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
