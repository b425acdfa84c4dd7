"""A hostile agent that floods loopback HTTP listeners with half-sent requests (stdlib only).

Used by tests/supervisor/test_supervise_listeners*.py and tools/listener_flood_cpu.py, run as a
fleet's agent (fenced like any other). `python -I flood_agent.py REPORT COUNT [--again] PORT...`:
raises its own descriptor limit to the hard one, then opens COUNT connections to each
`127.0.0.1:PORT` and sends each the start of a request head that it never finishes; it keeps
what it opened and watches for the other side closing. `--again`: every connection the listener
closes, or that fails to open, is opened again at once (the pressure never lets up). REPORT (a path in the agent's
workspace) is rewritten, atomically, as `{"opened": {port: n}, "failed": {port: n},
"closed": {port: n}, "open": {port: n}, "done": bool}` whenever a figure moved (at most twice a
second): `done` once every first connection was tried. It then runs until killed.
"""

from __future__ import annotations

import json
import os
import resource
import selectors
import socket
import sys
import time


def half_request(port: int) -> bytes:
    """A request head without its end: the listener waits for the rest, which never comes."""
    return f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Waiting: ".encode()


def main(argv: list[str]) -> None:
    report, count = argv[0], int(argv[1])
    again = "--again" in argv[2:]
    ports = [int(p) for p in argv[2:] if p != "--again"]
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    figures: dict[str, dict[int, int]] = {
        name: dict.fromkeys(ports, 0) for name in ("opened", "failed", "closed", "open")
    }
    chooser = selectors.DefaultSelector()

    def open_one(port: int) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(5)
        try:
            sock.connect(("127.0.0.1", port))
            sock.sendall(half_request(port))
        except OSError:
            sock.close()
            figures["failed"][port] += 1
            if again:
                retry.append(port)
            return
        sock.setblocking(False)
        chooser.register(sock, selectors.EVENT_READ, port)
        figures["opened"][port] += 1
        figures["open"][port] += 1

    written = [""]
    retry: list[int] = []  # ports whose connection failed to open (`--again`: open it again)

    def write(done: bool) -> None:
        text = json.dumps({**figures, "done": done})
        if text == written[0]:
            return
        written[0] = text
        with open(report + ".tmp", "w") as file:
            file.write(text)
        os.replace(report + ".tmp", report)

    def reap(timeout: float) -> None:
        for key, _ in chooser.select(timeout):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                if sock.recv(4096):
                    continue  # an answer (a refusal's status line): the close follows
            except BlockingIOError:
                continue
            except OSError:
                pass
            chooser.unregister(sock)
            sock.close()
            figures["closed"][key.data] += 1
            figures["open"][key.data] -= 1
            if again:
                open_one(key.data)

    last = time.monotonic()
    for index in range(count):
        for port in ports:
            open_one(port)
        if index % 100 == 99:
            reap(0)
            if time.monotonic() - last > 0.5:
                write(False)
                last = time.monotonic()
    while True:
        write(True)
        reap(0 if retry else 0.5)
        for port in [retry.pop() for _ in range(len(retry))]:
            open_one(port)


if __name__ == "__main__":
    main(sys.argv[1:])
