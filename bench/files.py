"""File-transfer benchmark: upload_file / download_file through the host vs a raw copy.

Moves a generated file (1 GiB by default) through the real `mcphost host` (driven over stdio
with plain JSON-RPC) against the reference center on a Unix socket, and the same bytes with a
bare aiohttp client over the same socket doing the same HTTP steps (no MCP, no containment, no
client-side hashing, no fsync): that is the raw-copy baseline. Reports medians, the ratio
host/raw, and the host's peak RSS (VmHWM) after moving the file both ways next to its peak
after one tiny call, so any per-byte memory growth shows.

Run alone with `python -m bench.files`; `make bench` calls `section(out)`.
Knobs: BENCH_FILE_MB (default 1024), BENCH_FILE_RUNS (default 3).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import RawMcp, peak_rss_mb
from mcphost.testing import DevCenter

SIZE_MB = int(os.environ.get("BENCH_FILE_MB", "1024"))
RUNS = int(os.environ.get("BENCH_FILE_RUNS", "3"))
CHUNK = 1 << 20


def _generate(path: Path, size_mb: int) -> None:
    block = os.urandom(CHUNK)
    with path.open("wb") as out:
        for index in range(size_mb):
            out.write(block[index % CHUNK :] + block[: index % CHUNK])


class _Raw:
    """The baseline: the same HTTP steps with a bare aiohttp client over the same socket."""

    def __init__(self, center: DevCenter) -> None:
        import aiohttp

        assert center.socket_path is not None
        self.agent = center.agent_id
        self.session = aiohttp.ClientSession(
            base_url="http://center",
            connector=aiohttp.UnixConnector(path=str(center.socket_path)),
            headers={"Authorization": f"Bearer {center.token}"},
            timeout=aiohttp.ClientTimeout(total=None),
        )

    async def upload(self, path: Path, size: int, *, verify: bool = False) -> str:
        async with self.session.post(
            "/admin/agent-tools/upload_file",
            json={
                "agent_id": self.agent,
                "filename": path.name,
                "content_type": "application/octet-stream",
                "size": size,
            },
        ) as reply:
            transfer_id = (await reply.json())["transfer_id"]

        digest = hashlib.sha256()

        async def body() -> Any:
            with path.open("rb", buffering=0) as source:
                while chunk := source.read(CHUNK):
                    if verify:
                        digest.update(chunk)
                    yield chunk

        async with self.session.put(
            f"/admin/files/transfer/{transfer_id}",
            params={"agent_id": self.agent},
            data=body(),
            headers={"Content-Length": str(size), "Content-Type": "application/octet-stream"},
        ) as reply:
            sha = (await reply.json())["sha256"]  # the plain raw copy trusts the center's hash
        if verify:
            sha = digest.hexdigest()
        async with self.session.post(
            f"/admin/files/transfer/{transfer_id}/complete",
            json={"agent_id": self.agent, "sha256": sha, "size": size},
        ) as reply:
            return str((await reply.json())["file_uri"])

    async def download(self, file_uri: str, dest: Path, *, verify: bool = False) -> None:
        file_id = file_uri.removeprefix("ac://files/")
        async with self.session.get(
            f"/admin/files/{file_id}", params={"agent_id": self.agent}
        ) as reply:
            reply.raise_for_status()
            digest = hashlib.sha256()
            with dest.open("wb", buffering=0) as out:
                async for chunk in reply.content.iter_chunked(CHUNK):
                    if verify:
                        digest.update(chunk)
                    out.write(chunk)
                if verify:
                    os.fsync(out.fileno())

    async def close(self) -> None:
        await self.session.close()


def _fmt(samples: list[float], size: int) -> tuple[float, str]:
    rates = [size / s / 1e6 for s in samples]
    median = statistics.median(rates)
    return median, f"{median:.0f} MB/s ({min(rates):.0f}–{max(rates):.0f}, n={len(rates)})"


async def section(out: list[str]) -> None:
    """Append the file-transfer table to `out` (the `make bench` hook)."""
    with tempfile.TemporaryDirectory(prefix="mcphost-bench-files-") as tmp:
        center = DevCenter.start(Path(tmp), unix=True, control=False)
        try:
            await _measure(center, out)
        finally:
            center.close()


async def _measure(center: DevCenter, out: list[str]) -> None:
    root = center.agent_root
    source = root / "bench.bin"
    _generate(source, SIZE_MB)
    size = source.stat().st_size
    timings: dict[str, list[float]] = {
        key: [] for key in ("raw_up", "raw_down", "eq_up", "eq_down", "host_up", "host_down")
    }

    raw = _Raw(center)
    host = RawMcp([sys.executable, "-m", "mcphost.cli", "host"], center.binding_env("unix"))
    await host.start()
    try:
        (root / "tiny.txt").write_text("tiny\n")
        tiny = await host.call_json("upload_file", {"path": "tiny.txt"})
        await host.call_json("download_file", {"file": tiny["file_uri"], "dest_path": "tiny.copy"})
        rss_idle = peak_rss_mb(host.pid)
        uri = ""
        for _ in range(RUNS):
            started = time.perf_counter()
            uri = await raw.upload(source, size)
            timings["raw_up"].append(time.perf_counter() - started)
            dest = root / "raw.copy"
            started = time.perf_counter()
            await raw.download(uri, dest)
            timings["raw_down"].append(time.perf_counter() - started)
            dest.unlink()
            started = time.perf_counter()
            uri = await raw.upload(source, size, verify=True)
            timings["eq_up"].append(time.perf_counter() - started)
            started = time.perf_counter()
            await raw.download(uri, dest, verify=True)
            timings["eq_down"].append(time.perf_counter() - started)
            dest.unlink()

            started = time.perf_counter()
            up = await host.call_json("upload_file", {"path": "bench.bin"})
            timings["host_up"].append(time.perf_counter() - started)
            started = time.perf_counter()
            down = await host.call_json(
                "download_file", {"file": up["file_uri"], "dest_path": "host.copy"}
            )
            timings["host_down"].append(time.perf_counter() - started)
            assert down["sha256"] == up["sha256"] and down["size"] == size
            (root / "host.copy").unlink()
        rss_peak = peak_rss_mb(host.pid)
    finally:
        await host.close()
        await raw.close()
        source.unlink(missing_ok=True)

    raw_up, raw_up_text = _fmt(timings["raw_up"], size)
    raw_down, raw_down_text = _fmt(timings["raw_down"], size)
    eq_up, eq_up_text = _fmt(timings["eq_up"], size)
    eq_down, eq_down_text = _fmt(timings["eq_down"], size)
    host_up, host_up_text = _fmt(timings["host_up"], size)
    host_down, host_down_text = _fmt(timings["host_down"], size)
    out += [
        f"## 5. File transfer ({size >> 20} MiB over the Unix socket, medians of {RUNS})",
        "",
        "Raw copy: the same HTTP steps with a bare aiohttp client (no MCP, no containment, no "
        "client-side SHA-256, no fsync). Equal-work copy: the same, plus SHA-256 inline and "
        "fsync (what the host must do). Host: upload_file / download_file through `mcphost "
        "host` (descriptor walk, SHA-256 in the same pass, temp file + fsync + rename).",
        "",
        "| direction | raw copy | equal-work copy | host | host / raw | host / equal-work |",
        "|---|---|---|---|---|---|",
        f"| upload | {raw_up_text} | {eq_up_text} | {host_up_text} | {host_up / raw_up:.2f}× "
        f"| {host_up / eq_up:.2f}× |",
        f"| download | {raw_down_text} | {eq_down_text} | {host_down_text} "
        f"| {host_down / raw_down:.2f}× | {host_down / eq_down:.2f}× |",
        "",
        "| host peak RSS (VmHWM) | MB |",
        "|---|---|",
        f"| after one tiny upload + download | {rss_idle:.1f} |",
        f"| after moving {size >> 20} MiB each way ×{RUNS} | {rss_peak:.1f} "
        f"(+{rss_peak - rss_idle:.1f}) |",
        "",
    ]


def run(report: list[str]) -> None:
    """Synchronous entry point: append the table to `report`."""
    asyncio.run(section(report))


if __name__ == "__main__":
    lines: list[str] = []
    run(lines)
    print("\n".join(lines))
