"""A directory (and a leaf) swapped for a symlink to outside while transfers run.

A thread flips `race/` between a real directory and a symlink to a sibling directory holding a
same-named secret, as fast as it can. Uploads must never send the secret and downloads must
never write outside: the descriptor walk either sees the directory (and keeps it) or refuses.
"""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import os
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from mcphost.errors import ToolFailure
from mcphost.host.server import HostSurface
from mcphost.host.workspace import Walker, open_for_upload
from mcphost.surface import CallContext
from mcphost.testing import DevCenter
from tests.host.files.conftest import call, center_binding, local_binding, open_host
from tests.thorough import depth

# deep (make test-slow): transfers while a thread swaps the workspace under them.
pytestmark = pytest.mark.deep

INSIDE = b"inside bytes\n" * 64
SECRET = b"outside secret\n" * 64
REFUSED = {"path_through_symlink", "path_escapes_workspace", "path_changed"}


def lay_out(root: Path, outside: Path) -> None:
    (root / "race").mkdir()
    (root / "race" / "f.txt").write_bytes(INSIDE)
    (outside / "f.txt").write_bytes(SECRET)
    os.symlink(str(outside), root / ".lnk")
    (root / "leaf.txt").write_bytes(INSIDE)
    os.symlink(str(outside / "f.txt"), root / ".leaflnk")


_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def exchange(a: Path, b: Path) -> None:
    """renameat2(RENAME_EXCHANGE): swap two names atomically (neither is ever missing)."""
    if _libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE):
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error), str(a))


@contextmanager
def swapping(root: Path) -> Iterator[Counter[str]]:
    """Flip race/ <-> symlink and leaf.txt <-> symlink (atomically) until the block ends."""
    stop = threading.Event()
    flips: Counter[str] = Counter()

    def run() -> None:
        while not stop.is_set():
            exchange(root / "race", root / ".lnk")
            exchange(root / "leaf.txt", root / ".leaflnk")
            flips["swaps"] += 1

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield flips
    finally:
        stop.set()
        thread.join()


def outside_untouched(outside: Path) -> None:
    assert sorted(os.listdir(outside)) == ["f.txt", "secret.txt"]
    assert (outside / "f.txt").read_bytes() == SECRET


def seen_every_outcome(outcomes: Counter[str], flips: Counter[str]) -> bool:
    return (
        flips["swaps"] > 100
        and outcomes["opened"] > 0
        and outcomes["dest_ok"] > 0
        and sum(outcomes[c] for c in REFUSED) > 0
        and outcomes["dest_refused"] > 0
    )


@pytest.mark.thorough
def test_walk_under_swaps(workspace: Path, outside: Path) -> None:
    """4,000 walks under `make test-slow`; `make test` stops after 400 once every outcome (open,
    refuse, create, refuse to create) has been seen, and goes on to 4,000 while one is missing."""
    lay_out(workspace, outside)
    outcomes: Counter[str] = Counter()
    with swapping(workspace) as flips:
        for index in range(4000):
            if index >= depth(full=4000, quick=400) and seen_every_outcome(outcomes, flips):
                break
            given = "race/f.txt" if index % 2 else "leaf.txt"
            w = Walker(local_binding(workspace), given)
            try:
                _resolved, fd, _ = open_for_upload(w)
                assert os.pread(fd, len(INSIDE) + 1, 0) == INSIDE
                outcomes["opened"] += 1
            except ToolFailure as failure:
                assert failure.code in REFUSED, failure.text()
                outcomes[failure.code] += 1
            finally:
                w.close()
            w = Walker(local_binding(workspace), f"race/new-{index}.part")
            try:
                resolved = w.parent(create_missing=True)
                fd = os.open(
                    resolved.leaf,
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                    0o600,
                    dir_fd=resolved.parent_fd,
                )
                os.close(fd)
                os.unlink(resolved.leaf, dir_fd=resolved.parent_fd)
                outcomes["dest_ok"] += 1
            except ToolFailure as failure:
                assert failure.code in REFUSED, failure.text()
                outcomes["dest_refused"] += 1
            finally:
                w.close()
    print("walk under swaps:", dict(outcomes), dict(flips))
    outside_untouched(outside)
    assert seen_every_outcome(outcomes, flips), (dict(outcomes), dict(flips))


def seen_every_transfer_outcome(outcomes: Counter[str]) -> bool:
    return (
        outcomes["up_ok"] > 0
        and outcomes["down_ok"] > 0
        and outcomes["up_refused"] + outcomes["down_refused"] > 0
    )


@pytest.mark.thorough
@pytest.mark.anyio
async def test_transfers_under_swaps(center: DevCenter, workspace: Path, outside: Path) -> None:
    """300 uploads and downloads (ten at a time) under `make test-slow`; `make test` stops after
    100 once each outcome (an upload and a download done, one refused) has been seen, and goes on
    to 300 while one is missing."""
    lay_out(workspace, outside)
    (workspace / "payload.bin").write_bytes(INSIDE)
    surface = HostSurface(center_binding(center))
    ctx = CallContext(request_id=1)
    inside_sha = hashlib.sha256(INSIDE).hexdigest()
    outcomes: Counter[str] = Counter()
    try:
        uri = (await surface.call_tool("upload_file", {"path": "payload.bin"}, ctx)).structured
        assert uri is not None
        with swapping(workspace):

            async def one(index: int) -> None:
                path = "race/f.txt" if index % 2 else "leaf.txt"
                up = await surface.call_tool("upload_file", {"path": path}, ctx)
                outcomes["up_" + ("ok" if not up.is_error else "refused")] += 1
                if up.is_error:
                    assert any(f'"{c}"' in up.text for c in REFUSED), up.text
                else:
                    assert up.structured is not None and up.structured["sha256"] == inside_sha
                down = await surface.call_tool(
                    "download_file",
                    {"file": uri["file_uri"], "dest_path": f"race/d/{index}.bin"},
                    ctx,
                )
                outcomes["down_" + ("ok" if not down.is_error else "refused")] += 1
                if down.is_error:
                    assert any(f'"{c}"' in down.text for c in REFUSED), down.text

            for start in range(0, 300, 10):
                if start >= depth(full=300, quick=100) and seen_every_transfer_outcome(outcomes):
                    break
                await asyncio.gather(*(one(i) for i in range(start, start + 10)))
    finally:
        await surface.aclose()
    print("transfers under swaps:", dict(outcomes))
    outside_untouched(outside)
    assert seen_every_transfer_outcome(outcomes), dict(outcomes)
    for path in (workspace / "race" / "d").glob("*"):
        assert path.read_bytes() == INSIDE


@pytest.mark.anyio
async def test_real_host_under_swaps(center: DevCenter, workspace: Path, outside: Path) -> None:
    lay_out(workspace, outside)
    inside_sha = hashlib.sha256(INSIDE).hexdigest()
    seen: Counter[str] = Counter()
    async with open_host(center.binding_env("unix")) as client:
        with swapping(workspace):
            for index in range(60):
                path = "race/f.txt" if index % 2 else "leaf.txt"
                is_error, payload = await call(client, "upload_file", {"path": path})
                result: Any = payload
                if is_error:
                    assert result["error"] in REFUSED, result
                    seen["refused"] += 1
                else:
                    assert result["sha256"] == inside_sha
                    seen["ok"] += 1
    print("real host under swaps:", dict(seen))
    outside_untouched(outside)
    assert seen["ok"] + seen["refused"] == 60
