"""The control socket's protocol, access rules and bounds, against a small fake handler.

The unit under test is `mcphost.supervisor.control` (protocol, server, client): the real server
on a real Unix socket, the real blocking client (`request`, `stream_logs`) and raw sockets for what the client never sends.
The supervisor behind it is a fake that records calls; the real supervisor's black-box tests
drive `mcphost ctl` against `mcphost supervise` (tests/supervisor/test_supervise.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from mcphost.supervisor.control import protocol
from mcphost.supervisor.control import server as control_server
from mcphost.supervisor.control.client import ExecClient, NotRunning, request, stream_logs
from mcphost.supervisor.control.protocol import ControlError, parse_request, unknown_agents
from mcphost.supervisor.control.server import ControlInUse, ControlServer, peer_allowed
from tests.waiting import eventually

pytestmark = pytest.mark.anyio


class OtherError(Exception):
    """A refusal class of the supervisor's own, with the same attributes as ControlError."""

    def __init__(self, code: str, message: str, details: dict[str, Any]) -> None:
        super().__init__(message)
        self.code, self.message, self.details = code, message, details


class Fake:
    """A ControlHandler that records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.log_chunks: list[bytes] = [b"line 1\n", b"line 2\n"]
        self.follow_forever = False
        self.flood = False
        self.produced = 0
        self.closed = asyncio.Event()
        self.fail_after: int | None = None

    def _agent(self, agent: str) -> None:
        if agent != "agent-1":
            raise ControlError("unknown_agent", f"no agent {agent!r}", {"agent": agent})

    async def status(self) -> Any:
        self.calls.append(("status",))
        return [{"agent_id": "agent-1", "state": "running", "pid": 42}]

    async def start(self, agents: list[str]) -> list[Any]:
        self.calls.append(("start", *agents))
        for agent in agents:
            self._agent(agent)
        return [{"agent_id": agent, "state": "running"} for agent in agents]

    async def stop(self, agents: list[str]) -> list[Any]:
        self.calls.append(("stop", *agents))
        if "boom" in agents:
            raise RuntimeError("secret internals /etc/mcphost/worker.token")
        if "odd" in agents:
            return [{"not json": object()}]
        for agent in agents:
            self._agent(agent)
        return [{"agent_id": agent, "state": "stopped"} for agent in agents]

    async def restart(self, agents: list[str]) -> list[Any]:
        self.calls.append(("restart", *agents))
        raise OtherError("unknown_agent", "not in the fleet", {"known": ["agent-1"]})

    async def reload(self, dry_run: bool = False) -> Any:
        self.calls.append(("reload",))
        raise ControlError("reload_failed", "fleet.toml: agent.id: bad", {"file": "fleet.toml"})

    async def logs(self, agent: str, lines: int, follow: bool) -> AsyncIterator[bytes]:
        self.calls.append(("logs", agent, lines, follow))
        self._agent(agent)
        try:
            for index, chunk in enumerate(self.log_chunks):
                if self.fail_after is not None and index == self.fail_after:
                    raise ControlError("log_unavailable", "the log rotated away")
                yield chunk
            while self.flood:
                self.produced += 64 * 1024
                yield b"x" * (64 * 1024)
            if follow and self.follow_forever:
                yield b"followed\n"
                await asyncio.Event().wait()
        finally:
            self.closed.set()

    def exec(self, agent: str, argv: list[str], fds: list[int]) -> FakeExecution:
        self._agent(agent)
        # what a spawn does with the descriptors: the child gets copies, ours are closed after
        os.write(fds[1], f"out {' '.join(argv)}\n".encode())
        os.write(fds[2], b"err\n")
        self.exec_fds = [os.dup(fd) for fd in fds]
        self.execution = FakeExecution(exit_code=int(argv[0]) if argv[0].isdigit() else None)
        self.calls.append(("exec", agent, argv, len(fds)))
        return self.execution


class FakeExecution:
    """Exits with `exit_code` at once, or runs until a signal or `end()`."""

    def __init__(self, exit_code: int | None) -> None:
        self.pid = 4242
        self.signals: list[int] = []
        self.ended = asyncio.Event()
        self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if exit_code is not None:
            self._exit.set_result(exit_code)

    def describe(self) -> dict[str, Any]:
        return {"agent_id": "agent-1", "generation": 3, "pid": self.pid}

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if not self._exit.done():
            self._exit.set_result(-sig)

    def end(self) -> None:
        self.ended.set()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path (sun_path is 108 bytes) that other uids may traverse."""
    path = Path(tempfile.mkdtemp(prefix="ctl-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def served(short_dir: Path) -> AsyncIterator[tuple[ControlServer, Fake, str]]:
    fake = Fake()
    path = str(short_dir / "control.sock")
    server = ControlServer(path, fake)
    await server.start()
    try:
        yield server, fake, path
    finally:
        await server.aclose()


def raw(path: str, payload: bytes, *, shut: bool = False) -> list[dict[str, Any]]:
    """Send bytes as they are; read every reply line until the server closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(15)
        sock.connect(path)
        try:
            sock.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before it read everything; its answer is still there
        if shut:
            sock.shutdown(socket.SHUT_WR)
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass  # it closed with our request unread: what it said came first
    return [json.loads(line) for line in data.splitlines()]


def error_of(path: str, payload: bytes) -> dict[str, Any]:
    replies = raw(path, payload)
    assert len(replies) == 1, replies
    assert replies[0]["ok"] is False
    error: dict[str, Any] = replies[0]["error"]
    assert set(error) == {"code", "message", "details"}
    return error


# -- requests and replies ------------------------------------------------------------------------


async def test_every_op_reaches_the_handler_and_results_come_back(served: Any) -> None:
    _server, fake, path = served
    assert await asyncio.to_thread(request, path, "status") == [
        {"agent_id": "agent-1", "state": "running", "pid": 42}
    ]
    assert await asyncio.to_thread(request, path, "start", agent="agent-1") == {
        "agent_id": "agent-1",
        "state": "running",
    }
    assert (await asyncio.to_thread(request, path, "stop", agent="agent-1"))["state"] == "stopped"
    assert fake.calls == [("status",), ("start", "agent-1"), ("stop", "agent-1")]
    replies = await asyncio.to_thread(raw, path, b'{"op":"status"}\n')
    assert replies == [
        {"ok": True, "result": [{"agent_id": "agent-1", "state": "running", "pid": 42}]}
    ]


async def test_handler_refusals_keep_their_code_message_and_details(served: Any) -> None:
    _server, _fake, path = served
    with pytest.raises(ControlError) as caught:
        await asyncio.to_thread(request, path, "start", agent="agent-9")
    assert (caught.value.code, caught.value.details) == ("unknown_agent", {"agent": "agent-9"})
    with pytest.raises(ControlError) as caught:
        await asyncio.to_thread(request, path, "reload")
    assert caught.value.code == "reload_failed"
    assert caught.value.message == "fleet.toml: agent.id: bad"
    assert caught.value.details == {"file": "fleet.toml"}
    # the supervisor's own refusal class is relayed the same way (code, message, details)
    error = await asyncio.to_thread(error_of, path, b'{"op":"restart","agent":"agent-1"}\n')
    assert error == {
        "code": "unknown_agent",
        "message": "not in the fleet",
        "details": {"known": ["agent-1"]},
    }


async def test_a_handler_bug_is_internal_without_its_text(served: Any) -> None:
    _server, _fake, path = served
    error = await asyncio.to_thread(error_of, path, b'{"op":"stop","agent":"boom"}\n')
    assert error["code"] == "internal"
    assert "RuntimeError" in error["message"] and "worker.token" not in json.dumps(error)
    odd = await asyncio.to_thread(error_of, path, b'{"op":"stop","agent":"odd"}\n')
    assert odd["code"] == "internal"
    # and the server keeps serving
    assert await asyncio.to_thread(request, path, "status")


@pytest.mark.parametrize(
    ("line", "code", "says"),
    [
        (b"not json\n", "bad_request", "JSON"),
        (b"[1]\n", "bad_request", "object"),
        (b"{}\n", "bad_request", '"op"'),
        (b'{"op": 1}\n', "bad_request", '"op"'),
        (b'{"op": "frobnicate"}\n', "unknown_op", "status, start, stop, restart, reload, logs"),
        (b'{"op": "status", "agent": "a"}\n', "bad_request", "agent"),
        (b'{"op": "status", "token": "acat_x"}\n', "bad_request", "token"),
        (b'{"op": "start"}\n', "bad_request", '"agent"'),
        (b'{"op": "start", "agent": ""}\n', "bad_request", '"agent"'),
        (b'{"op": "start", "agent": 7}\n', "bad_request", '"agent"'),
        (b'{"op": "start", "agent": "a\\nb"}\n', "bad_request", "printable"),
        (b'{"op": "logs", "agent": "agent-1", "lines": -1}\n', "bad_request", '"lines"'),
        (b'{"op": "logs", "agent": "agent-1", "lines": true}\n', "bad_request", '"lines"'),
        (b'{"op": "logs", "agent": "agent-1", "lines": 100001}\n', "bad_request", '"lines"'),
        (b'{"op": "logs", "agent": "agent-1", "follow": "yes"}\n', "bad_request", '"follow"'),
        (b"[" * 100_000 + b"\n", "request_too_large", "65536"),
        (b"[" * 60_000 + b"\n", "bad_request", "JSON"),
    ],
)
async def test_bad_requests_are_refused_with_stable_codes(
    served: Any, line: bytes, code: str, says: str
) -> None:
    _server, fake, path = served
    error = await asyncio.to_thread(error_of, path, line)
    assert error["code"] == code
    assert says in error["message"]
    assert "acat_x" not in json.dumps(error)
    assert fake.calls == []


async def test_several_agents_in_one_request_one_result_each(served: Any) -> None:
    """`"agents"`: the handler gets them all at once (without repeats), the reply a list."""
    _server, fake, path = served
    reply = await asyncio.to_thread(request, path, "start", agents=["agent-1", "agent-1"])
    assert reply == {"agents": [{"agent_id": "agent-1", "state": "running"}]}
    with pytest.raises(ControlError) as caught:
        await asyncio.to_thread(request, path, "stop", agents=["agent-1", "agent-9"])
    assert caught.value.code == "unknown_agent"
    assert fake.calls == [("start", "agent-1"), ("stop", "agent-1", "agent-9")]


@pytest.mark.parametrize(
    "body",
    [
        {"op": "stop", "agents": []},
        {"op": "stop", "agents": "agent-1"},
        {"op": "stop", "agents": ["agent-1", ""]},
        {"op": "stop", "agents": ["agent-1", 7]},
        {"op": "stop", "agents": ["a\x1b]52"]},
        {"op": "stop", "agents": ["a" * 257]},
        {"op": "stop", "agents": ["a"] * 1025},
        {"op": "stop", "agent": "agent-1", "agents": ["agent-2"]},
        {"op": "logs", "agents": ["agent-1"]},
    ],
)
def test_agents_must_be_a_list_of_ids_instead_of_agent(body: dict[str, Any]) -> None:
    with pytest.raises(ControlError) as caught:
        parse_request(json.dumps(body).encode())
    assert caught.value.code == "bad_request"
    assert len(caught.value.message) < 300


def test_start_stop_restart_take_agent_or_agents() -> None:
    one = parse_request(b'{"op":"restart","agent":"a"}')
    assert one == {"op": "restart", "agent": "a", "agents": ["a"]}
    several = parse_request(b'{"op":"restart","agents":["b","a","b"]}')
    assert several == {"op": "restart", "agents": ["b", "a"]}


def test_an_unknown_id_is_named_only_when_close_to_one_of_the_fleet() -> None:
    """A typo is named with the fleet's closest id; a value like none of the fleet's ids (a
    token typed in the wrong place passes the agent-id grammar) is only counted, on the wire
    too; the message says where the fleet's agents come from and how many there are."""
    token = "acat_" + "Zq9" * 14
    fleet = {"path": "/etc/mcphost/fleet.toml", "agents_from": "file"}
    error = unknown_agents(["agnet-1", token], ["agent-1", "agent-2", "printer"], fleet)
    assert error.code == "unknown_agent"
    assert error.message == (
        "not in the fleet: 'agnet-1' (did you mean 'agent-1'?), 1 value not shown (like none "
        "of the fleet's ids); nothing was done. The fleet file /etc/mcphost/fleet.toml defines "
        "3 agents: `mcphost ctl status` lists them"
    )
    assert error.details == {
        "agents": ["agnet-1"],
        "not_shown": 1,
        "did_you_mean": {"agnet-1": "agent-1"},
        "known_count": 3,
        "fleet": "/etc/mcphost/fleet.toml",
    }
    assert token not in json.dumps(error.wire())
    center = unknown_agents(["x"], ["a"], {"path": "/f.toml", "agents_from": "center"})
    assert "The center assigns this worker 1 agent:" in center.message
    assert "The fleet has no agents:" in unknown_agents(["x"], []).message


def test_parse_request_defaults() -> None:
    assert parse_request(b'{"op":"logs","agent":"a"}') == {
        "op": "logs",
        "agent": "a",
        "lines": 50,
        "follow": False,
    }
    assert parse_request(b'{"op":"reload"}') == {"op": "reload", "dry_run": False}
    assert parse_request(b'{"op":"reload","dry_run":true}')["dry_run"] is True
    with pytest.raises(ControlError, match="dry_run"):
        parse_request(b'{"op":"reload","dry_run":"yes"}')
    long_op = "x" * 10_000
    with pytest.raises(ControlError) as caught:
        parse_request(json.dumps({"op": long_op}).encode())
    assert len(caught.value.message) < 300


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (b"not json\n", "the supervisor's reply is not JSON"),
        (b"[1]\n", "the supervisor's reply is not an object"),
    ],
)
def test_a_reply_that_is_not_one_json_object_is_a_protocol_error(
    short_dir: Path, reply: bytes, message: str
) -> None:
    path = str(short_dir / "c.sock")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen(1)
        answered = threading.Thread(target=lambda: answer(listener, reply))
        answered.start()
        with pytest.raises(ControlError) as caught:
            request(path, "status", timeout=60)
        answered.join()
    assert (caught.value.code, caught.value.message) == ("protocol_error", message)


def answer(listener: socket.socket, reply: bytes) -> None:
    conn, _ = listener.accept()
    with conn:
        conn.recv(65536)
        conn.sendall(reply)


async def test_a_line_over_64_kib_is_refused_without_being_kept(served: Any) -> None:
    _server, fake, path = served
    # exactly at the limit (newline included) is read; one byte more is refused
    at_limit = b'{"op":"status","pad":"' + b"x" * (protocol.MAX_LINE - 25) + b'"}\n'
    assert len(at_limit) == protocol.MAX_LINE
    assert (await asyncio.to_thread(error_of, path, at_limit))["code"] == "bad_request"
    over = at_limit[:-3] + b'x"}\n'
    assert (await asyncio.to_thread(error_of, path, over))["code"] == "request_too_large"

    # 8 MiB with no newline: refused as soon as 64 KiB are buffered (the rest is never read)
    def flood() -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(15)
            sock.connect(path)
            sent = 0
            try:
                while sent < 8 * 1024 * 1024:
                    sent += sock.send(b"x" * 65536)
            except (BrokenPipeError, ConnectionResetError):
                pass
            data = b""
            try:
                while chunk := sock.recv(65536):
                    data += chunk
            except ConnectionResetError:
                pass
        return json.loads(data.splitlines()[0])

    reply = await asyncio.to_thread(flood)
    assert reply["error"]["code"] == "request_too_large"
    assert fake.calls == []


async def test_a_request_without_newline_but_half_closed_is_served(served: Any) -> None:
    _server, _fake, path = served
    replies = await asyncio.to_thread(raw, path, b'{"op":"status"}', shut=True)
    assert replies[0]["ok"] is True


async def test_a_silent_client_is_dropped_after_the_request_timeout(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _server, _fake, path = served
    monkeypatch.setattr(control_server, "REQUEST_TIMEOUT", 0.3)

    def idle() -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(path)
            return sock.recv(100)

    assert await asyncio.to_thread(idle) == b""  # closed, nothing said


async def test_too_many_connections_get_busy(served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    server, _fake, path = served
    monkeypatch.setattr(control_server, "MAX_CONNECTIONS", 3)
    idle = []
    for _ in range(3):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        idle.append(sock)
    try:
        await eventually(lambda: len(server._tasks) == 3, "the three connections admitted")
        assert (await asyncio.to_thread(error_of, path, b'{"op":"status"}\n'))["code"] == "busy"
    finally:
        for sock in idle:
            sock.close()
    await eventually(lambda: not server._tasks, "the three connections closed")
    assert await asyncio.to_thread(request, path, "status")


# -- logs ----------------------------------------------------------------------------------------


async def test_logs_stream_chunks_then_end(served: Any) -> None:
    _server, fake, path = served
    fake.log_chunks = [b"caf\xc3", b"\xa9 ok\n", b"y" * 40_000, b"bad \xff byte\n"]
    replies = await asyncio.to_thread(raw, path, b'{"op":"logs","agent":"agent-1","lines":7}\n')
    assert replies[-1] == {"ok": True, "end": True}
    texts = [r["log"] for r in replies[:-1]]
    assert all(len(t) <= protocol.LOG_CHUNK for t in texts)
    assert "".join(texts) == "café ok\n" + "y" * 40_000 + "bad \ufffd byte\n"
    assert fake.calls == [("logs", "agent-1", 7, False)]
    assert "".join(
        await asyncio.to_thread(lambda: list(stream_logs(path, "agent-1", lines=1, follow=False)))
    ).startswith("café")


async def test_logs_errors_before_and_during_the_stream(served: Any) -> None:
    _server, fake, path = served
    with pytest.raises(ControlError) as caught:
        await asyncio.to_thread(lambda: list(stream_logs(path, "agent-9", lines=5, follow=False)))
    assert caught.value.code == "unknown_agent"
    fake.fail_after = 1
    replies = await asyncio.to_thread(raw, path, b'{"op":"logs","agent":"agent-1"}\n')
    assert replies[0] == {"log": "line 1\n"}
    assert replies[1]["error"]["code"] == "log_unavailable"
    assert len(replies) == 2


async def test_follow_ends_when_the_client_leaves(served: Any) -> None:
    _server, fake, path = served
    fake.follow_forever = True

    def follow_then_leave() -> list[str]:
        seen = []
        stream = stream_logs(path, "agent-1", lines=10, follow=True)
        for text in stream:
            seen.append(text)
            if text == "followed\n":
                stream.close()  # closes the connection
                break
        return seen

    seen = await asyncio.to_thread(follow_then_leave)
    assert seen == ["line 1\n", "line 2\n", "followed\n"]
    await eventually(fake.closed.is_set, "the log closed")  # the server stopped pulling it


FLOOD_BOUND = 8 * 1024 * 1024


async def stalled(fake: Fake, bound: int) -> int:
    """What the flood has produced once it stops growing for a hundred turns of the event loop
    (the server shares it: unless blocked in `drain()`, it pulls a chunk every few turns), or
    once it passes `bound`; 0 (not yet) otherwise."""
    before = fake.produced
    for _ in range(100):
        await asyncio.sleep(0)
    if before > bound or (before and fake.produced == before):
        return before
    return 0


async def test_a_client_that_does_not_read_does_not_grow_the_server(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, fake, path = served
    monkeypatch.setattr(control_server, "STALL_TIMEOUT", 1.0)
    fake.flood = True
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(path)
    sock.sendall(b'{"op":"logs","agent":"agent-1","follow":true}\n')
    try:
        # the flood stops (or passes any bound a full socket and write buffer explain)
        produced = await eventually(lambda: stalled(fake, FLOOD_BOUND), "the flood stalled")
        # socket buffers plus the 64 KiB write buffer; not the flood
        assert produced <= FLOOD_BOUND, produced
        # and stays stalled until the server drops the client after STALL_TIMEOUT
        await eventually(fake.closed.is_set, "the stalled client dropped")
        assert fake.produced - produced <= 256 * 1024
        assert not server._tasks
    finally:
        sock.close()


# -- the socket: mode, lock, stale files, peers --------------------------------------------------


async def test_the_socket_is_0600_whatever_the_umask(short_dir: Path) -> None:
    old = os.umask(0)
    try:
        async with ControlServer(short_dir / "c.sock", Fake()):
            st = os.lstat(short_dir / "c.sock")
            assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
            assert stat.S_IMODE(os.lstat(short_dir / "c.sock.lock").st_mode) == 0o600
    finally:
        os.umask(old)
    assert not (short_dir / "c.sock").exists()  # removed at close


async def test_a_second_server_on_the_same_path_is_refused(served: Any) -> None:
    server, _fake, path = served
    with pytest.raises(ControlInUse) as caught:
        await ControlServer(path, Fake()).start()
    assert caught.value.code == "control_in_use"
    assert "another supervisor" in caught.value.message and path in caught.value.message
    # the holder wrote its pid into the lock file: the refusal names it
    assert f"(pid {os.getpid()})" in caught.value.message
    assert caught.value.details["pid"] == os.getpid()
    assert await asyncio.to_thread(request, path, "status")  # the first one is untouched
    await server.aclose()
    async with ControlServer(path, Fake()):  # once it is gone, a new one starts
        assert await asyncio.to_thread(request, path, "status")


async def test_a_second_supervisor_process_is_refused(served: Any) -> None:
    _server, _fake, path = served
    code = (
        "import asyncio, sys\n"
        "from mcphost.supervisor.control.server import ControlServer, ControlInUse\n"
        "try:\n"
        f"    asyncio.run(ControlServer({path!r}, None).start())\n"
        "except ControlInUse as exc:\n"
        "    print(exc.message); sys.exit(7)\n"
    )
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 7, done.stderr
    assert "another supervisor" in done.stdout


async def test_a_live_listener_without_the_lock_is_not_unlinked(short_dir: Path) -> None:
    path = str(short_dir / "c.sock")
    foreign = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    foreign.bind(path)
    foreign.listen(1)
    try:
        with pytest.raises(ControlInUse, match="already listens"):
            await ControlServer(path, Fake()).start()
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        foreign.close()  # now it is stale: replaced
        async with ControlServer(path, Fake()):
            assert await asyncio.to_thread(request, path, "status")
    finally:
        foreign.close()


async def test_a_non_socket_at_the_path_is_left_alone(short_dir: Path) -> None:
    path = short_dir / "c.sock"
    path.write_text("precious")
    with pytest.raises(ControlInUse, match="not a socket"):
        await ControlServer(path, Fake()).start()
    assert path.read_text() == "precious"
    # and the lock was released: once the file is gone, a server starts
    path.unlink()
    async with ControlServer(path, Fake()):
        pass


async def test_close_leaves_a_replaced_socket_alone(short_dir: Path) -> None:
    path = str(short_dir / "c.sock")
    server = ControlServer(path, Fake())
    await server.start()
    os.unlink(path)
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(path)
    try:
        await server.aclose()
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
    finally:
        other.close()


async def test_aclose_ends_a_follow(served: Any) -> None:
    server, fake, path = served
    fake.follow_forever = True
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.sendall(b'{"op":"logs","agent":"agent-1","follow":true}\n')
    try:
        await eventually(lambda: server._tasks, "the follow admitted")
        await server.aclose()
        assert fake.closed.is_set()
    finally:
        sock.close()


def test_peer_allowed() -> None:
    assert peer_allowed(1000, 1000) and peer_allowed(0, 1000) and peer_allowed(0, 0)
    assert not peer_allowed(1001, 1000) and not peer_allowed(65534, 0)


def test_client_says_not_running(short_dir: Path) -> None:
    with pytest.raises(NotRunning, match="no such socket"):
        request(str(short_dir / "nothing.sock"), "status")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(short_dir / "stale.sock"))
    stale.close()
    with pytest.raises(NotRunning, match="refused"):
        request(str(short_dir / "stale.sock"), "status")


_AS_NOBODY = (
    "import json, socket, sys\n"
    "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
    "try:\n"
    "    s.connect(sys.argv[1])\n"
    "except PermissionError:\n"
    "    print('EACCES'); sys.exit(0)\n"
    "try:\n"
    '    s.sendall(b\'{"op":"status"}\\n\')\n'
    "except BrokenPipeError:\n"
    "    pass\n"
    "print(s.makefile('rb').readline().decode())\n"
)


NOBODY_PYTHON = "/usr/bin/python3"  # the venv's may sit where uid 65534 cannot reach


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(NOBODY_PYTHON, os.X_OK),
    reason="needs root (to connect as another uid) and a system python3",
)
async def test_another_uid_is_shut_out_by_the_mode_and_by_the_peer_check(served: Any) -> None:
    _server, fake, path = served

    def as_nobody() -> str:
        done = subprocess.run(
            [NOBODY_PYTHON, "-I", "-S", "-c", _AS_NOBODY, path],
            capture_output=True,
            text=True,
            timeout=60,
            user=65534,
            group=65534,
            extra_groups=[],
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert await asyncio.to_thread(as_nobody) == "EACCES"  # 0600
    os.chmod(path, 0o666)  # a loosened mode still serves no one else
    reply = json.loads(await asyncio.to_thread(as_nobody))
    assert reply["error"]["code"] == "forbidden_peer"
    assert reply["error"]["details"] == {"peer_uid": 65534, "supervisor_uid": 0}
    assert fake.calls == []


# -- exec: descriptors over SCM_RIGHTS -------------------------------------------------------------


def exec_replies(path: str, body: dict[str, Any], fds: list[int]) -> list[dict[str, Any]]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(15)
        sock.connect(path)
        socket.send_fds(sock, [json.dumps(body).encode() + b"\n"], fds)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return [json.loads(line) for line in data.splitlines()]


async def test_exec_hands_the_three_descriptors_over_and_reports_the_exit(
    served: Any, tmp_path: Path
) -> None:
    _server, fake, path = served
    out, err = (open(tmp_path / name, "w+b") for name in ("out", "err"))  # noqa: SIM115
    with out, err, open(os.devnull, "rb") as null:
        client = ExecClient(
            path, "agent-1", ["7", "a b"], (null.fileno(), out.fileno(), err.fileno())
        )
        code = await asyncio.to_thread(client.wait)
    assert code == 7
    assert client.started == {"agent_id": "agent-1", "generation": 3, "pid": 4242}
    assert (tmp_path / "out").read_bytes() == b"out 7 a b\n"
    assert (tmp_path / "err").read_bytes() == b"err\n"
    assert fake.calls[-1] == ("exec", "agent-1", ["7", "a b"], 3)
    # the server closed its copies: only the handler's dups are left open
    for fd in fake.exec_fds:
        os.close(fd)


async def test_exec_forwards_signals_and_a_closed_client_ends_the_command(served: Any) -> None:
    _server, fake, path = served
    with open(os.devnull, "r+b") as null:
        client = ExecClient(path, "agent-1", ["run"], (null.fileno(),) * 3)
        client.signal("SIGINT")  # queued until started, then sent
        assert await asyncio.to_thread(client.wait) == -2
    assert fake.execution.signals == [2]
    with open(os.devnull, "r+b") as null, socket.socket(socket.AF_UNIX) as sock:
        sock.connect(path)
        body = {"op": "exec", "agent": "agent-1", "argv": ["run"]}
        socket.send_fds(sock, [json.dumps(body).encode() + b"\n"], [null.fileno()] * 3)
        first = await asyncio.to_thread(sock.recv, 65536)
        assert json.loads(first)["started"]["pid"] == 4242
        sock.sendall(b'{"op":"signal","signal":"SIGSEGV"}\n{"op":"nonsense"}\n')  # ignored
    await eventually(fake.execution.ended.is_set, "the command ended")
    assert fake.execution.signals == []


@pytest.mark.parametrize(
    ("body", "nfds", "says"),
    [
        ({"op": "exec", "agent": "agent-1", "argv": ["x"]}, 2, "exactly 3 file descriptors"),
        ({"op": "exec", "agent": "agent-1", "argv": ["x"]}, 0, "exactly 3 file descriptors"),
        ({"op": "status"}, 3, "status takes no file descriptors"),
        ({"op": "exec", "agent": "agent-1", "argv": []}, 3, '"argv"'),
        ({"op": "exec", "agent": "agent-1", "argv": ["a", 1]}, 3, '"argv"'),
        ({"op": "exec", "agent": "agent-1", "argv": ["a\u0000b"]}, 3, "NUL"),
        ({"op": "exec", "argv": ["x"]}, 3, '"agent"'),
    ],
)
async def test_exec_requests_are_checked_and_descriptors_never_kept(
    served: Any, body: dict[str, Any], nfds: int, says: str
) -> None:
    _server, fake, path = served
    with open(os.devnull, "rb") as null:
        fds = [os.dup(null.fileno()) for _ in range(nfds)]
        replies = await asyncio.to_thread(exec_replies, path, body, fds)
        for fd in fds:
            os.close(fd)
    assert len(replies) == 1 and replies[0]["ok"] is False, replies
    assert replies[0]["error"]["code"] == "bad_request" and says in replies[0]["error"]["message"]
    assert not [c for c in fake.calls if c[0] == "exec"]


async def test_exec_refusals_of_the_handler_reach_the_client(served: Any) -> None:
    _server, _fake, path = served
    with open(os.devnull, "r+b") as null:
        client = ExecClient(path, "agent-9", ["x"], (null.fileno(),) * 3)
        with pytest.raises(ControlError) as refused:
            await asyncio.to_thread(client.wait)
    assert refused.value.code == "unknown_agent"


def test_logs_of_the_supervisor_takes_no_agent() -> None:
    assert parse_request(b'{"op":"logs","supervisor":true,"lines":3}') == {
        "op": "logs",
        "agent": None,
        "lines": 3,
        "follow": False,
    }
    for bad in (
        b'{"op":"logs","supervisor":true,"agent":"a"}',
        b'{"op":"logs","supervisor":1}',
    ):
        with pytest.raises(ControlError) as caught:
            parse_request(bad)
        assert caught.value.code == "bad_request"
    with pytest.raises(ControlError):
        parse_request(b'{"op":"status","supervisor":true}')  # logs only
