"""What looking at a supervisor costs, measured from outside it: its threads' CPU time
(`run_time`), a GET as a browser on the machine sends it (`get`), and an open page tab as its
script follows the fleet (`Watcher`: the page's event stream held open, or for a tree whose page
still polls, `/api/fleet` every `POLL_EVERY` seconds). bench/operations.py and bench/idle.py
both stand on it; neither imports the other.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import threading
import time
from pathlib import Path

POLL_EVERY = 2.0  # how often the page's script polled /api/fleet before it had a stream
SCRAPE_EVERY = 15.0  # Prometheus' usual scrape_interval


def run_time(pid: int) -> float:
    """The CPU time of `pid`'s threads, in seconds to the nanosecond: the sum of each thread's
    `schedstat` run time (utime + stime count 10 ms ticks: too coarse for a 30 s idle window of
    tens of milliseconds, or for one request). A thread that ended is not in it: used for
    differences over a window, in which the supervisor starts none (its executor's threads stay)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/schedstat") as stat:
            total += int(stat.read().split()[0])
    return total / 1e9


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get(port: int, path: str) -> float:
    """One GET on the page, as a browser on the machine would send it; seconds to the last byte."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        started = time.perf_counter()
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read()
        took = time.perf_counter() - started
    finally:
        conn.close()
    if response.status != 200:
        raise RuntimeError(f"{path} answered {response.status}: {body[:300]!r}")
    return took


def has_stream(tree: str) -> bool:
    """Whether `tree`'s fleet page pushes over `/api/stream` (else its script polls)."""
    page = Path(tree) / "mcphost" / "supervisor" / "operator" / "page.py"
    return "/api/stream" in page.read_text()


class Watcher:
    """An open page tab's live updates, as its script gets them: the stream held open and read
    in a thread (`messages` counts them), or for a page without one a poll every 2 s (`tick`)."""

    def __init__(self, port: int, stream: bool) -> None:
        self.port, self.stream = port, stream
        self.messages = self.polls = 0
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._next = 0.0

    def __enter__(self) -> Watcher:
        get(self.port, "/")  # the tab is opened once
        if self.stream:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=60)
            sock.sendall(
                f"GET /api/stream HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
                "Accept: text/event-stream\r\n\r\n".encode()
            )
            head = sock.recv(65536)
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"/api/stream answered {head[:200]!r}")
            self.messages += head.count(b"\ndata: ")
            self._sock = sock
            self._thread = threading.Thread(target=self._read, daemon=True)
            self._thread.start()
        return self

    def _read(self) -> None:
        assert self._sock is not None
        with contextlib.suppress(OSError):
            while chunk := self._sock.recv(65536):
                self.messages += chunk.count(b"data: ")

    def tick(self, now: float) -> None:
        """At `now` (seconds into the window): poll when a polling page would."""
        if not self.stream and now >= self._next:
            get(self.port, "/api/fleet")
            self.polls += 1
            self._next += POLL_EVERY

    def __exit__(self, *exc: object) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
        if self._thread is not None:
            self._thread.join(10)
