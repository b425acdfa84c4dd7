"""The attach pump (mcphost/attach.py), run for real: `python -I -S attach.py <socket>`.

A small threaded Unix-socket server stands in for the supervisor (status line, then whatever
the test needs: echo, answer after EOF, flood, or never read). Everything waits on conditions
(bytes counted, a connection accepted, the process exited); nothing sleeps, nothing bounds
wall time. Timeouts below only turn a real hang into a failure.
"""

from __future__ import annotations

import ast
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import mcphost
from tests.waiting import until

ATTACH = Path(mcphost.__file__).parent / "attach.py"
PUMP = [sys.executable, "-I", "-S", str(ATTACH)]
HANG = 60  # seconds: only a hang reaches this
OK = b"ok agent-7f3a 4\n"


class Server:
    """A stand-in supervisor socket: sends `greeting` to each connection, then runs `handler`."""

    def __init__(
        self, path: Path, greeting: bytes, handler: Callable[[Server, socket.socket], None]
    ) -> None:
        self.path = path
        self.greeting = greeting
        self.handler = handler
        self.received = bytearray()
        self.accepted = threading.Event()
        self.release = threading.Event()
        self.conns: list[socket.socket] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            self.accepted.set()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.sendall(self.greeting)
            self.handler(self, conn)
        except OSError:
            pass
        finally:
            conn.close()

    def read_all(self, conn: socket.socket) -> None:
        while data := conn.recv(65536):
            self.received += data

    def close(self) -> None:
        self.release.set()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self.listener.close()


def echo(server: Server, conn: socket.socket) -> None:
    while data := conn.recv(65536):
        server.received += data
        conn.sendall(data)


def answer_after_eof(server: Server, conn: socket.socket) -> None:
    server.read_all(conn)  # returns at the pump's SHUT_WR
    conn.sendall(bytes(server.received) + b'{"after":"eof"}\n')


def just_read(server: Server, conn: socket.socket) -> None:
    server.read_all(conn)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(
        greeting: bytes = OK, handler: Callable[[Server, socket.socket], None] = echo
    ) -> Server:
        server = Server(tmp_path / f"s{len(servers)}.sock", greeting, handler)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


SPAWNED: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def no_pump_left_behind() -> Iterator[None]:
    yield
    while SPAWNED:
        pump = SPAWNED.pop()
        if pump.poll() is None:  # only after a failure
            pump.kill()
            pump.wait()


def spawn(path: Path | str, **kwargs: object) -> subprocess.Popen[bytes]:
    options: dict[str, object] = {
        "stdin": subprocess.PIPE,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.PIPE,
    }
    options.update(kwargs)
    pump = subprocess.Popen([*PUMP, str(path)], **options)  # type: ignore[call-overload]
    SPAWNED.append(pump)
    return pump


def read_exactly(stream: object, size: int) -> bytes:
    read = stream.read  # type: ignore[attr-defined]
    chunks = []
    while size:
        chunk = read(min(size, 1 << 20))
        assert chunk, "stdout ended early"
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def test_json_lines_go_round_trip_and_eof_exits_0(serve: Callable[..., Server]) -> None:
    server = serve()
    pump = spawn(server.path)
    assert pump.stdin is not None and pump.stdout is not None
    lines = [b'{"jsonrpc":"2.0","id":%d,"method":"ping"}\n' % i for i in range(50)]
    for line in lines:
        pump.stdin.write(line)
        pump.stdin.flush()
        assert pump.stdout.readline() == line
    out, err = pump.communicate(timeout=HANG)
    assert (pump.returncode, out, err) == (0, b"", b"")
    assert bytes(server.received) == b"".join(lines)


def test_a_5_mb_line_passes_intact(serve: Callable[..., Server]) -> None:
    server = serve()
    line = b'{"jsonrpc":"2.0","id":1,"params":"' + os.urandom(5 << 19).hex().encode() + b'"}\n'
    assert len(line) > 5_000_000
    pump = spawn(server.path)
    out, err = pump.communicate(line, timeout=HANG)
    assert pump.returncode == 0, err
    assert out == line


def test_bytes_right_after_the_status_line_reach_stdout(serve: Callable[..., Server]) -> None:
    note = b'{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}\n'
    server = serve(greeting=OK + note)
    out, err = spawn(server.path).communicate(b"", timeout=HANG)
    assert (out, err) == (note, b"")


def test_a_refusal_prints_one_line_exits_3_and_sends_nothing(
    serve: Callable[..., Server],
) -> None:
    server = serve(
        greeting=b"refused not_in_fleet no agent of this supervisor started this process\n",
        handler=just_read,
    )
    pump = spawn(server.path)
    out, err = pump.communicate(b'{"jsonrpc":"2.0","id":1,"method":"initialize"}\n', timeout=HANG)
    assert pump.returncode == 3
    assert out == b""
    assert err == (
        b"mcphost attach: no agent of this supervisor started this process (not_in_fleet)\n"
    )
    until(lambda: server.conns and server.conns[0].fileno() == -1, what="server saw EOF")
    assert bytes(server.received) == b""  # not one byte of stdin moved before the status line


@pytest.mark.parametrize(
    ("status", "shown"),
    [
        (b"refused agent_not_running \x1b[31mred\x07\n", b"?[31mred? (agent_not_running)"),
        (b"refused uid_mismatch\n", b"the supervisor refused to attach (uid_mismatch)"),
    ],
)
def test_a_refusal_line_is_shown_without_control_characters(
    serve: Callable[..., Server], status: bytes, shown: bytes
) -> None:
    server = serve(greeting=status, handler=just_read)
    pump = spawn(server.path)
    out, err = pump.communicate(b"", timeout=HANG)
    assert (pump.returncode, out, err) == (3, b"", b"mcphost attach: " + shown + b"\n")


def test_no_server_exits_2_naming_the_socket(tmp_path: Path) -> None:
    missing = tmp_path / "nobody-here.sock"
    pump = spawn(missing)
    out, err = pump.communicate(b"", timeout=HANG)
    assert pump.returncode == 2 and out == b""
    text = err.decode()
    assert str(missing) in text and "No such file or directory" in text
    assert "mcphost supervise" in text and text.count("\n") == 1
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as left_behind:
        left_behind.bind(str(stale))  # a socket file nobody listens on
    pump = spawn(stale)
    out, err = pump.communicate(b"", timeout=HANG)
    assert pump.returncode == 2 and str(stale).encode() in err and b"Connection refused" in err


@pytest.mark.parametrize("greeting", [b"", b"hello there\n", b"x" * 2000])
def test_no_status_line_exits_2(serve: Callable[..., Server], greeting: bytes) -> None:
    server = serve(greeting=greeting, handler=lambda server, conn: None)  # then close
    pump = spawn(server.path)
    out, err = pump.communicate(b"", timeout=HANG)
    assert pump.returncode == 2 and out == b""
    assert str(server.path).encode() in err and b"mcphost supervise" in err


@pytest.mark.parametrize("argv", [[], ["a.sock", "b.sock"], ["--help"], [""]])
def test_bad_arguments_print_usage_and_exit_2(argv: list[str]) -> None:
    result = subprocess.run([*PUMP, *argv], capture_output=True, stdin=subprocess.DEVNULL)
    assert result.returncode == 2 and result.stdout == b""
    assert result.stderr.startswith(b"usage: ")


def test_stdin_eof_half_closes_and_answers_still_arrive(serve: Callable[..., Server]) -> None:
    server = serve(handler=answer_after_eof)
    request = b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}\n'
    pump = spawn(server.path)
    out, err = pump.communicate(request, timeout=HANG)  # writes, then closes stdin
    assert (pump.returncode, err) == (0, b"")
    assert out == request + b'{"after":"eof"}\n'


def test_a_client_that_stops_reading_stalls_only_the_answers(
    serve: Callable[..., Server],
) -> None:
    """The socket -> stdout side is full; every request still reaches the supervisor."""
    flood = bytes(range(256)) * (8 << 12)  # 8 MiB of answers, far more than every buffer

    def flooding(server: Server, conn: socket.socket) -> None:
        writer = threading.Thread(target=conn.sendall, args=(flood,), daemon=True)
        writer.start()
        server.read_all(conn)
        writer.join()

    server = serve(handler=flooding)
    pump = spawn(server.path)
    assert pump.stdin is not None and pump.stdout is not None
    requests = b"".join(b'{"id":%d,"method":"ping"}\n' % i for i in range(200_000))  # ~5 MB
    writer = threading.Thread(target=pump.stdin.write, args=(requests,), daemon=True)
    writer.start()
    until(lambda: len(server.received) == len(requests), HANG, "every request arrived")
    assert bytes(server.received) == requests
    writer.join(HANG)
    assert read_exactly(pump.stdout, len(flood)) == flood  # nothing was lost while stalled
    pump.stdin.close()
    assert pump.wait(HANG) == 0


def test_a_supervisor_that_stops_reading_stalls_only_the_requests(
    serve: Callable[..., Server],
) -> None:
    """The stdin -> socket side is full; every answer still reaches stdout."""
    answers = bytes(range(256)) * (4 << 12)  # 4 MiB

    def deaf(server: Server, conn: socket.socket) -> None:
        conn.sendall(answers)
        server.release.wait(HANG)
        server.read_all(conn)

    server = serve(handler=deaf)
    pump = spawn(server.path)
    assert pump.stdin is not None and pump.stdout is not None
    requests = b"r" * (4 << 20)  # more than the pump's buffer plus socket and pipe buffers
    writer = threading.Thread(target=pump.stdin.write, args=(requests,), daemon=True)
    writer.start()
    assert read_exactly(pump.stdout, len(answers)) == answers
    assert writer.is_alive()  # the requests really are stalled behind the deaf supervisor
    server.release.set()
    writer.join(HANG)
    pump.stdin.close()
    assert pump.wait(HANG) == 0
    assert bytes(server.received) == requests


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_while_pumping_exits_0(serve: Callable[..., Server], signum: int) -> None:
    server = serve()
    pump = spawn(server.path)
    assert pump.stdin is not None and pump.stdout is not None
    pump.stdin.write(b"{}\n")
    pump.stdin.flush()
    assert pump.stdout.readline() == b"{}\n"
    pump.send_signal(signum)
    assert pump.wait(HANG) == 0
    assert pump.stderr is not None and pump.stderr.read() == b""


def test_sigterm_while_waiting_for_the_status_line_exits_0(
    serve: Callable[..., Server],
) -> None:
    server = serve(greeting=b"", handler=lambda server, conn: server.release.wait(HANG))
    pump = spawn(server.path)
    assert server.accepted.wait(HANG)
    pump.send_signal(signal.SIGTERM)
    assert pump.wait(HANG) == 0


def test_the_client_closing_stdout_ends_the_pump_with_0(serve: Callable[..., Server]) -> None:
    server = serve()
    pump = spawn(server.path)
    assert pump.stdin is not None and pump.stdout is not None
    pump.stdout.close()  # the client went away: the echoed line meets EPIPE
    pump.stdin.write(b"{}\n")
    pump.stdin.flush()
    assert pump.wait(HANG) == 0


def test_stdin_is_left_blocking_as_it_was_found(serve: Callable[..., Server]) -> None:
    """O_NONBLOCK belongs to the open file, which a terminal shares with the shell."""
    server = serve()
    reader, writer = os.pipe()
    try:
        pump = spawn(server.path, stdin=reader)
        os.write(writer, b"{}\n")
        assert pump.stdout is not None and pump.stdout.readline() == b"{}\n"
        assert not os.get_blocking(reader)  # the pump shares this open file and made it so
        os.close(writer)
        writer = -1
        assert pump.wait(HANG) == 0
        assert os.get_blocking(reader)
    finally:
        os.close(reader)
        if writer != -1:
            os.close(writer)


def test_the_pump_imports_only_the_standard_library(serve: Callable[..., Server]) -> None:
    """Statically (every import is a stdlib name) and at run time (`-X importtime`)."""
    tree = ast.parse(ATTACH.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module is not None
            names.add(node.module)
    assert names and all(name.split(".")[0] in sys.stdlib_module_names for name in names)

    def imported(argv: list[str], stdin: bytes) -> set[str]:
        run = subprocess.run(
            [sys.executable, "-X", "importtime", *argv], input=stdin, capture_output=True
        )
        assert run.returncode == 0, run.stderr
        lines = run.stderr.decode().splitlines()
        rows = [line for line in lines if line.startswith("import time:") and "[us]" not in line]
        return {row.rsplit("|", 1)[1].strip() for row in rows}

    server = serve()
    baseline = imported(["-I", "-S", "-c", "pass"], b"")
    loaded = imported(["-I", "-S", str(ATTACH), str(server.path)], b"{}\n")
    extra = loaded - baseline
    assert extra <= {"_socket", "select", "errno", "posix", "_signal"}, extra
    assert not any(name.startswith(("mcphost", "site")) for name in loaded)
    assert all(name.split(".")[0] in sys.stdlib_module_names for name in loaded)
