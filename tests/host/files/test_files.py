"""upload_file / download_file end to end: the real `mcphost host` process driven by the
official SDK client against the real reference center, plus in-process calls of the same
handlers where timing must be controlled (cancellation, progress, volume)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import stat
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
from mcp import Client

from mcphost.host.server import HostSurface
from mcphost.surface import CallContext
from mcphost.testing import DevCenter
from tests.host.files import corpus
from tests.host.files.conftest import call, center_binding, mark, open_host, since

pytestmark = pytest.mark.anyio


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_(entry: dict[str, Any], marker: str) -> bool:
    """Whether a request-log entry is the one `mark()` made for `marker`."""
    body = entry.get("body")
    return isinstance(body, dict) and body.get("issue_id") == marker


def file_gets(center: DevCenter, marker: str) -> list[dict[str, Any]]:
    return [r for r in since(center, marker) if r["route"].startswith("/admin/files/")]


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".mcphost-" in p.name)


async def upload(client: Any, path: str, **extra: Any) -> dict[str, Any]:
    is_error, payload = await call(client, "upload_file", {"path": path, **extra})
    assert not is_error, payload
    return payload  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
async def host(center: DevCenter) -> AsyncIterator[Client]:
    """One real `mcphost host` for agent-1 on the center's workspace, driven by the SDK client and
    shared by the end-to-end tests that bind it that way (a host process costs more than a second
    of CPU just starting). Each test starts from an emptied workspace (the `workspace` fixture
    empties the root, which the host holds from start and which stays in place) and uses its own
    files and file ids; the host keeps nothing else between calls. Tests about another binding
    (another agent, a size cap, no root) start their own host."""
    center.agent_root.mkdir(parents=True, exist_ok=True)
    async with open_host(center.binding_env("unix")) as client:
        yield client


# -- containment through the real process ---------------------------------------------------

E2E_SKIP = {"\ud800.txt"}  # a lone surrogate cannot be sent as UTF-8 JSON by the client


async def test_upload_attack_corpus_end_to_end(
    center: DevCenter, workspace: Path, outside: Path, host: Client
) -> None:
    corpus.build(workspace, outside)
    secret = sha((outside / "secret.txt").read_bytes())
    wrong: list[tuple[str, Any, Any]] = []
    for template, expected in corpus.UPLOAD.items():
        if template in E2E_SKIP:
            continue
        path = corpus.expand(template, workspace)
        before = mark(center)
        is_error, payload = await call(host, "upload_file", {"path": path})
        got = payload["error"] if is_error else None
        if got != expected:
            wrong.append((template[:60], expected, payload))
        if is_error:
            assert payload["details"].get("path", path) == path
            assert since(center, before) == [], f"{template!r} reached the center"
        else:
            assert payload["sha256"] != secret
    assert wrong == []


async def test_download_attack_corpus_end_to_end(
    center: DevCenter, workspace: Path, outside: Path, host: Client
) -> None:
    (workspace / "payload.bin").write_bytes(b"payload\n" * 100)
    corpus.build(workspace, outside)
    outside_before = sorted(os.listdir(outside))
    wrong: list[tuple[str, Any, Any]] = []
    uri = (await upload(host, "payload.bin"))["file_uri"]
    for template, expected in corpus.DOWNLOAD.items():
        if template in E2E_SKIP:
            continue
        path = corpus.expand(template, workspace)
        before = mark(center)
        is_error, payload = await call(host, "download_file", {"file": uri, "dest_path": path})
        got = payload["error"] if is_error else None
        if got != expected:
            wrong.append((template[:60], expected, payload))
        if is_error:
            assert file_gets(center, before) == [], f"{template!r}: GET before containment"
        else:
            dest = Path(payload["dest_path"])
            assert dest.read_bytes() == b"payload\n" * 100
            assert str(dest).startswith(str(workspace) + "/")
    assert wrong == []
    assert sorted(os.listdir(outside)) == outside_before
    assert leftovers(workspace) == []


# -- integrity -------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 4096, 5 * 1024 * 1024 + 7])
async def test_round_trip(workspace: Path, host: Client, size: int) -> None:
    data = os.urandom(size)
    (workspace / "src.bin").write_bytes(data)
    up = await upload(host, "src.bin")
    assert up["size"] == size and up["sha256"] == sha(data) and up["filename"] == "src.bin"
    assert up["file_uri"].startswith("ac://files/")
    is_error, down = await call(
        host, "download_file", {"file": up["file_uri"], "dest_path": "out/copy.bin"}
    )
    assert not is_error, down
    assert down["size"] == size and down["sha256"] == sha(data)
    copy = workspace / "out" / "copy.bin"
    assert copy.read_bytes() == data
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    assert leftovers(workspace) == []


async def test_metadata_for_attachments(workspace: Path, host: Client) -> None:
    (workspace / "notes.json").write_text('{"a": 1}')
    (workspace / "picture").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 32)
    (workspace / "README").write_text("plain words\n")
    (workspace / "blob").write_bytes(b"\x00\x01\x02\xff")
    kinds = {
        name: (await upload(host, name))["mime_type"]
        for name in ("notes.json", "picture", "README", "blob")
    }
    up = await upload(host, "notes.json", scope="project", scope_id="p-1")
    assert up["reference_id"] and up["scope"] == "project"
    is_error, down = await call(
        host,
        "download_file",
        {"file": up["file_uri"].removeprefix("ac://files/"), "dest_path": "n.json"},
    )
    assert kinds == {
        "notes.json": "application/json",
        "picture": "image/png",
        "README": "text/plain",
        "blob": "application/octet-stream",
    }
    assert not is_error and down["mime_type"] == "application/json"


@pytest.mark.slow
async def test_large_round_trip_256_mib(workspace: Path, host: Client) -> None:
    block = os.urandom(1 << 20)
    digest = hashlib.sha256()
    with (workspace / "large.bin").open("wb") as out:
        for index in range(256):
            chunk = block[index:] + block[:index]
            digest.update(chunk)
            out.write(chunk)
    up = await upload(host, "large.bin")
    assert up["size"] == 256 << 20 and up["sha256"] == digest.hexdigest()
    is_error, down = await call(
        host, "download_file", {"file": up["file_uri"], "dest_path": "large.copy"}
    )
    assert not is_error, down
    assert down["sha256"] == digest.hexdigest()
    check = hashlib.sha256()
    with (workspace / "large.copy").open("rb") as copy:
        while chunk := copy.read(1 << 20):
            check.update(chunk)
    assert check.hexdigest() == digest.hexdigest()


# -- download rules --------------------------------------------------------------------------


async def test_overwrite(workspace: Path, host: Client) -> None:
    (workspace / "new.txt").write_text("new contents\n")
    (workspace / "old.txt").write_text("old\n")
    uri = (await upload(host, "new.txt"))["file_uri"]
    refused, payload = await call(host, "download_file", {"file": uri, "dest_path": "old.txt"})
    assert refused and payload["error"] == "destination_exists"
    assert "overwrite" in payload["message"]
    assert (workspace / "old.txt").read_text() == "old\n"
    is_error, _ = await call(
        host, "download_file", {"file": uri, "dest_path": "old.txt", "overwrite": True}
    )
    assert not is_error
    assert (workspace / "old.txt").read_text() == "new contents\n"


async def test_not_reachable_and_not_found(
    center: DevCenter, workspace: Path, host: Client
) -> None:
    (workspace / "theirs.txt").write_text("agent-2's\n")
    # agent-2's upload is only the setup (a file agent-1 may not reach): its handler in process
    other = HostSurface(center_binding(center, agent_id="agent-2"))
    try:
        result = await other.call_tool("upload_file", {"path": "theirs.txt"}, context()[0])
    finally:
        await other.aclose()
    assert not result.is_error and result.structured is not None, result.text
    theirs = result.structured["file_uri"]
    is_error, payload = await call(
        host, "download_file", {"file": theirs, "dest_path": "deep/dir/x.txt"}
    )
    assert is_error and payload["error"] == "file_not_reachable" and payload["status"] == 403
    assert "not attached to a scope you belong to" in payload["message"]  # the center's words
    is_error, payload = await call(
        host,
        "download_file",
        {"file": "ac://files/01ARZ3NDEKTSV4RRFFQ69G5FAV", "dest_path": "deep/dir/y.txt"},
    )
    assert is_error and payload["error"] == "file_not_found" and payload["status"] == 404
    is_error, payload = await call(host, "download_file", {"file": "nope", "dest_path": "z"})
    assert is_error and payload["error"] == "invalid_file_uri"
    assert not (workspace / "deep").exists()  # parents are created only for a 200


async def test_size_cap(center: DevCenter, workspace: Path) -> None:
    (workspace / "big.bin").write_bytes(os.urandom(10_000))
    env = {**center.binding_env("unix"), "MCPHOST_MAX_DOWNLOAD_BYTES": "4096"}
    async with open_host(env) as client:
        uri = (await upload(client, "big.bin"))["file_uri"]
        is_error, payload = await call(
            client, "download_file", {"file": uri, "dest_path": "new/big.copy"}
        )
    assert is_error and payload["error"] == "file_too_large"
    assert payload["details"]["limit_bytes"] == 4096
    assert not (workspace / "new").exists()


async def test_workspace_root_errors(center: DevCenter, workspace: Path, tmp_path: Path) -> None:
    """A host started without a root binding is a real process; a root bound to a missing
    directory is the same binding parsed (`AgentBinding.from_env`) into the same `HostSurface`
    that `mcphost host` builds, in process."""
    async with open_host(center.binding_env("unix", agent_root=None)) as client:
        is_error, payload = await call(client, "upload_file", {"path": "a.txt"})
        assert is_error and payload["error"] == "workspace_root_unset"
    gone = HostSurface(center_binding(center, agent_root=str(tmp_path / "gone")))
    try:
        result = await gone.call_tool(
            "download_file", {"file": "01ARZ3NDEKTSV4RRFFQ69G5FAV", "dest_path": "a"}, context()[0]
        )
    finally:
        await gone.aclose()
    assert result.is_error and json.loads(result.text)["error"] == "workspace_root_missing"


async def test_schema_refuses_identity_and_unknown_fields(workspace: Path, host: Client) -> None:
    is_error, payload = await call(host, "upload_file", {"path": "a", "agent_id": "agent-2"})
    assert is_error and payload["error"] == "invalid_arguments"
    is_error, payload = await call(host, "upload_file", {"path": "a", "scope": "task"})
    assert is_error and payload["error"] == "invalid_arguments"
    tools = {t.name: t for t in (await host.list_tools()).tools}
    assert {"upload_file", "download_file"} <= set(tools)
    assert tools["download_file"].annotations.destructive_hint is True


# -- changes, progress, cancellation (in process, where timing can be controlled) -----------


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, method: str, params: dict[str, Any]) -> None:
        self.sent.append((method, params))


def context(token: Any = None) -> tuple[CallContext, Recorder]:
    recorder = Recorder()
    return CallContext(request_id=1, progress_token=token, send_notification=recorder), recorder


async def uploaded_uri(surface: HostSurface, path: str) -> str:
    """Upload a workspace file through the in-process surface; its `ac://files/` URI."""
    result = await surface.call_tool("upload_file", {"path": path}, context()[0])
    assert not result.is_error and result.structured is not None, result.text
    return str(result.structured["file_uri"])


async def test_file_changed_during_upload_is_not_completed(
    center: DevCenter, workspace: Path
) -> None:
    source = workspace / "growing.log"
    source.write_bytes(os.urandom(24 << 20))
    surface = HostSurface(center_binding(center))
    ctx, _ = context()
    try:
        with center.faults(delay_ms={"transfer_put": 800}):
            before = mark(center)
            task = asyncio.create_task(
                surface.call_tool("upload_file", {"path": "growing.log"}, ctx)
            )
            # the upload is under way once its first PUT reaches the (slowed) center
            while not any(r["method"] == "PUT" for r in since(center, before)):
                assert not task.done(), task.result().text
                await asyncio.sleep(0.01)
            with source.open("ab") as out:
                out.write(b"more lines\n" * 1000)
            result = await task
    finally:
        await surface.aclose()
    assert result.is_error and '"file_changed_during_upload"' in result.text
    routes = [r["route"] for r in since(center, before)]
    assert not any(r.endswith("/complete") for r in routes)


async def test_progress_is_reported(center: DevCenter, workspace: Path) -> None:
    (workspace / "p.bin").write_bytes(os.urandom(32 << 20))
    surface = HostSurface(center_binding(center))
    try:
        with center.faults(delay_ms={"transfer_put": 300, "download": 300}):
            ctx, recorder = context("tok-1")
            result = await surface.call_tool("upload_file", {"path": "p.bin"}, ctx)
            assert not result.is_error, result.text
            assert result.structured is not None
            uri = result.structured["file_uri"]
            up = [p for m, p in recorder.sent if m == "notifications/progress"]
            ctx, recorder = context("tok-2")
            result = await surface.call_tool("download_file", {"file": uri, "dest_path": "p2"}, ctx)
            assert not result.is_error, result.text
            down = [p for m, p in recorder.sent if m == "notifications/progress"]
            ctx, recorder = context()  # no token: no notifications
            await surface.call_tool("download_file", {"file": uri, "dest_path": "p3"}, ctx)
            assert recorder.sent == []
    finally:
        await surface.aclose()
    for events, token in ((up, "tok-1"), (down, "tok-2")):
        assert events and all(e["progressToken"] == token for e in events)
        assert events[-1]["progress"] == events[-1]["total"] == 32 << 20
        assert [e["progress"] for e in events] == sorted(e["progress"] for e in events)


async def test_cancelled_download_leaves_nothing(center: DevCenter, workspace: Path) -> None:
    (workspace / "c.bin").write_bytes(os.urandom(64 << 20))
    surface = HostSurface(center_binding(center))
    try:
        uri = await uploaded_uri(surface, "c.bin")

        async def slow_reports(method: str, params: dict[str, Any]) -> None:
            await asyncio.sleep(0.05)  # keeps the transfer running long enough to cancel it

        slow = CallContext(request_id=2, progress_token="t", send_notification=slow_reports)
        task = asyncio.create_task(
            surface.call_tool("download_file", {"file": uri, "dest_path": "new/dir/c.copy"}, slow)
        )
        for _ in range(400):
            await asyncio.sleep(0.005)
            if leftovers(workspace):
                break
        assert leftovers(workspace), "the download never started writing"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await surface.aclose()
    assert leftovers(workspace) == []
    assert not (workspace / "new").exists()


async def test_a_download_cancelled_while_a_write_runs_still_removes_its_part(
    center: DevCenter, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel lands while a thread still writes the temp file (its fsync, held here): the
    call waits for that write, the cancel is re-raised (anyio cancels again at every wait), and
    the `.part`, its descriptor and the directories the call made must still go. (A regression:
    the cleanup once sat after the wait, and a re-raised cancel skipped it.)"""
    (workspace / "w.bin").write_bytes(os.urandom(3 << 20))
    writing, release = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def held_fsync(fd: int) -> None:
        if ".mcphost-" in os.readlink(f"/proc/self/fd/{fd}"):
            writing.set()
            release.wait(60)
        real_fsync(fd)

    surface = HostSurface(center_binding(center))
    try:
        uri = await uploaded_uri(surface, "w.bin")
        monkeypatch.setattr(os, "fsync", held_fsync)
        ctx, _ = context()
        scope = anyio.CancelScope()

        async def download() -> None:
            with scope:
                await surface.call_tool("download_file", {"file": uri, "dest_path": "n/d/w"}, ctx)

        async with anyio.create_task_group() as tg:
            tg.start_soon(download)
            await anyio.to_thread.run_sync(writing.wait)
            scope.cancel()
            await anyio.lowlevel.checkpoint()  # the call takes the cancel inside its wait
            release.set()
    finally:
        release.set()
        await surface.aclose()
    assert scope.cancelled_caught
    assert leftovers(workspace) == []
    assert not (workspace / "n").exists()
    assert [p.name for p in workspace.iterdir()] == ["w.bin"]
    assert not [path for path in open_paths() if ".mcphost-" in path]  # nor its descriptor


def open_paths() -> list[str]:
    """What this process's descriptors point at."""
    paths = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            paths.append(os.readlink(f"/proc/self/fd/{fd}"))
    return paths


async def test_cancelled_upload_is_not_completed(center: DevCenter, workspace: Path) -> None:
    (workspace / "u.bin").write_bytes(os.urandom(16 << 20))
    surface = HostSurface(center_binding(center))
    try:
        with center.faults(delay_ms={"transfer_put": 2000}):
            before = mark(center)
            ctx, _ = context()
            task = asyncio.create_task(surface.call_tool("upload_file", {"path": "u.bin"}, ctx))
            for _ in range(6000):  # until the PUT is held by the center (60 s at most)
                if any(r["method"] == "PUT" for r in since(center, before)):
                    break
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    finally:
        await surface.aclose()
    # the call is cancelled and its client closed: a later request has reached the center, and
    # no completion came before it
    after = mark(center)
    entries = since(center, before)
    routes = [
        r["route"] for r in entries[: entries.index(next(e for e in entries if is_(e, after)))]
    ]
    assert any(r.startswith("/admin/files/transfer/") for r in routes)
    assert not any(r.endswith("/complete") for r in routes)
