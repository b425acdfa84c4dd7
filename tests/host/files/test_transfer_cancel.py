"""Cancellation and progress of file transfers through the real `mcphost host` process.

Raw JSON-RPC lines (the hardening suite's `RawHost`, no SDK in between) against the session
reference center, slowed or frozen so a transfer is still in flight when it is cancelled. A
cancelled call gets no response (MCP), the host answers a ping right after, the workspace holds
exactly what it held before (no `.mcphost-*.part`, no directory the call created, no
destination), and a cancelled upload is never completed on the center.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcphost.testing import DevCenter
from tests.hardening.conftest import RawHost, host_env
from tests.host.files.conftest import mark, since
from tests.waiting import until

# deep (make test-slow): cancellation mid-transfer with the center frozen.
pytestmark = [pytest.mark.deep, pytest.mark.timeout(120)]


@pytest.fixture
def host(center: DevCenter, workspace: Path) -> Iterator[RawHost]:
    """A fresh host per test; neither it nor the center may log a traceback meanwhile (a
    client hanging up mid-transfer is not a center bug)."""
    center_log = center.stderr_file.stat().st_size
    with RawHost(host_env(center.binding_env("unix"))) as running:
        running.initialize()
        yield running
        assert running.close() == 0
        assert not running.bad_lines
        assert b"Traceback" not in running.stderr, running.stderr.decode(errors="replace")
    with center.stderr_file.open("rb") as log:
        log.seek(center_log)
        new = log.read().decode(errors="replace")
    assert "Traceback" not in new, new


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def start_call(host: RawHost, tool: str, arguments: dict[str, Any], token: Any = None) -> int:
    params: dict[str, Any] = {"name": tool, "arguments": arguments}
    if token is not None:
        params["_meta"] = {"progressToken": token}
    return host.request("tools/call", params)


def cancel(host: RawHost, request_id: int) -> None:
    note = {"requestId": request_id, "reason": "test cancels the transfer"}
    host.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": note})


def assert_never_answered(host: RawHost, request_id: int) -> None:
    assert request_id not in host.by_id
    assert not [m for m in list(host.messages) if m.get("id") == request_id]


def uploaded(host: RawHost, workspace: Path, name: str, size: int) -> str:
    """Put `size` random bytes on the center through the host; the source stays in place."""
    (workspace / name).write_bytes(os.urandom(size))
    is_error, result = host.call("upload_file", {"path": name}, timeout=60)
    assert not is_error, result
    return str(result["file_uri"])


def test_download_cancelled_while_the_center_is_slow(
    center: DevCenter, workspace: Path, host: RawHost
) -> None:
    uri = uploaded(host, workspace, "big.bin", 8 << 20)
    with center.faults(delay_ms={"download": 2000}):
        before = mark(center)
        call = start_call(host, "download_file", {"file": uri, "dest_path": "new/dir/big.copy"})
        until(
            lambda: [r for r in since(center, before) if r["route"].startswith("/admin/files/")],
            what="the download GET to reach the center",
        )
        cancel(host, call)
        host.alive()
        # A witness: the same download, sent after the cancelled one's GET reached the center
        # and held for the same 2 s. Once it is answered, an uncancelled call would have been.
        witness = host.call("download_file", {"file": uri, "dest_path": "witness.copy"}, 60)
        assert not witness[0], witness
    host.alive()
    assert_never_answered(host, call)
    assert listing(workspace) == ["big.bin", "witness.copy"]


def test_download_cancelled_mid_stream_leaves_nothing(
    center: DevCenter, workspace: Path, host: RawHost
) -> None:
    """The center is frozen (SIGSTOP) once the temp file exists, so the cancel lands while
    bytes are half written; the temp file and the two directories the call made must go while
    the center is still frozen, and the call is never answered, even once it runs again.

    On a busy machine the temp file may be seen only after the whole download is done: a
    download that had finished when the center was stopped was not cut mid-stream, so it is
    answered, its files are removed, and another one is tried (`_stopped_mid_stream`).

    A regression test: a cancel that arrived while a thread was still writing the temp file
    once skipped the cleanup (about one run in four), leaving the `.part` locked for good."""
    uri = uploaded(host, workspace, "big.bin", 128 << 20)
    assert center.pid is not None
    call, part = _stopped_mid_stream(center, host, workspace, uri, "new")
    try:
        assert part[0].startswith("new/dir/.mcphost-") and part[0].endswith(".part")
        cancel(host, call)
        host.alive()
        until(lambda: not (workspace / "new").exists(), what="the cancelled download's cleanup")
    finally:
        os.kill(center.pid, signal.SIGCONT)
    host.alive()
    # the center is running again and has served a later call: the cancelled one stays unanswered
    assert not host.call("get_my_work", {})[0]
    assert_never_answered(host, call)
    assert listing(workspace) == ["big.bin"]


def _stopped_mid_stream(
    center: DevCenter, host: RawHost, workspace: Path, uri: str, top: str
) -> tuple[int, list[str]]:
    """Start a download and SIGSTOP the center while its temp file exists (retrying downloads
    that finish first); the call's id and the temp file."""
    assert center.pid is not None
    for attempt in range(5):
        dest = f"{top}/dir/big.copy"
        call = start_call(host, "download_file", {"file": uri, "dest_path": dest})
        until(
            lambda call=call: (
                call in host.by_id
                or [p for p in listing(workspace) if p.startswith(top) and ".mcphost-" in p]
            ),
            what="the download's temp file",
            every=0.001,  # stop the center while the transfer is young
        )
        os.kill(center.pid, signal.SIGSTOP)
        part = [p for p in listing(workspace) if p.startswith(top) and ".mcphost-" in p]
        if part:
            return call, part  # stopped mid-stream
        os.kill(center.pid, signal.SIGCONT)
        host.wait(call, timeout=60)  # it finished first: not the case under test
        shutil.rmtree(workspace / top)
        print(f"attempt {attempt}: the download finished before the center was stopped")
    raise AssertionError("every download finished before the center could be stopped")


def test_upload_cancelled_while_the_center_is_slow_is_never_completed(
    center: DevCenter, workspace: Path, host: RawHost
) -> None:
    (workspace / "u.bin").write_bytes(os.urandom(16 << 20))
    with center.faults(delay_ms={"transfer_put": 2000}):
        before = mark(center)
        call = start_call(host, "upload_file", {"path": "u.bin"})
        put = until(
            lambda: [r for r in since(center, before) if r["method"] == "PUT"],
            what="the transfer PUT to reach the center",
        )[0]
        cancel(host, call)
        host.alive()
        # A witness upload, held for the same 2 s after the cancelled PUT: once it is answered,
        # the cancelled PUT's handler has run (and failed) and an uncancelled call would be done.
        (workspace / "w.bin").write_bytes(b"witness")
        witness = host.call("upload_file", {"path": "w.bin"}, 60)
        assert not witness[0], witness
    host.alive()
    assert_never_answered(host, call)
    assert listing(workspace) == ["u.bin", "w.bin"]
    routes = [r["route"] for r in since(center, before)]
    assert f"{put['route']}/complete" not in routes, routes
    # the center holds no bytes for the transfer, so it cannot be completed either
    reply = center.request(
        "POST",
        f"{put['route']}/complete",
        {"agent_id": center.agent_id, "sha256": "0" * 64, "size": 16 << 20},
        {"Authorization": f"Bearer {center.token}"},
    )
    assert (reply.status, reply.error) == (409, "transfer_incomplete")


def progress_of(host: RawHost, token: Any, call: int) -> list[dict[str, Any]]:
    """The progress notifications for `token`, all of which must precede the call's answer."""
    messages = list(host.messages)
    answered = next(i for i, m in enumerate(messages) if m.get("id") == call)
    events = [
        (i, m["params"])
        for i, m in enumerate(messages)
        if m.get("method") == "notifications/progress" and m["params"]["progressToken"] == token
    ]
    assert all(i < answered for i, _ in events)
    return [params for _, params in events]


def test_progress_through_the_process(center: DevCenter, workspace: Path, host: RawHost) -> None:
    size = 48 << 20
    (workspace / "p.bin").write_bytes(os.urandom(size))
    with center.faults(delay_ms={"transfer_put": 300, "download": 300}):
        up = start_call(host, "upload_file", {"path": "p.bin"}, token=7)
        answer = host.wait(up, timeout=60)
        assert not answer["result"]["isError"], answer
        uri = answer["result"]["structuredContent"]["file_uri"]
        down = start_call(host, "download_file", {"file": uri, "dest_path": "p2"}, token="dl-1")
        answer = host.wait(down, timeout=60)
        assert not answer["result"]["isError"], answer
        plain = host.call("download_file", {"file": uri, "dest_path": "p3"}, timeout=60)
        assert not plain[0], plain
    for call, token in ((up, 7), (down, "dl-1")):
        events = progress_of(host, token, call)
        values = [e["progress"] for e in events]
        assert len(events) >= 2, events
        assert values == sorted(set(values)), f"progress must increase: {values}"
        assert values[-1] == size and all(e["total"] == size for e in events)
    tokens = {
        m["params"]["progressToken"]
        for m in host.messages
        if m.get("method") == "notifications/progress"
    }
    assert tokens == {7, "dl-1"}  # the call without a token got none


@pytest.mark.parametrize("size", [100_000, 1 << 20])
def test_progress_never_repeats_a_value(
    center: DevCenter, workspace: Path, host: RawHost, size: int
) -> None:
    """A transfer of one batch (1 MiB) or less: its last batch and the final report are the
    same value, which MCP forbids sending twice; exactly one notification each way."""
    (workspace / "s.bin").write_bytes(os.urandom(size))
    up = start_call(host, "upload_file", {"path": "s.bin"}, token="up")
    uri = host.wait(up)["result"]["structuredContent"]["file_uri"]
    down = start_call(host, "download_file", {"file": uri, "dest_path": "s2"}, token="down")
    assert not host.wait(down)["result"]["isError"]
    for call, token in ((up, "up"), (down, "down")):
        assert [e["progress"] for e in progress_of(host, token, call)] == [size]
