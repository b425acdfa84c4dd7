"""A small real center for cases the reference center will not produce: a hostile
`transfer_id`, and a download whose body is held open until the test releases it.

`StubCenter` is a real aiohttp server on a Unix socket, run on its own event loop in a thread.
It records every request exactly as it arrived (method, raw path, every query pair, in order),
so a test sees what the host put on the wire, not what a router made of it. It checks no token
and keeps no state beyond that log: it is a stand-in for a misbehaving center, not a center.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

FILE_ID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"


class StubCenter:
    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.transfer_id = "T1"
        self.download = b"stub download\n"
        self.hold_after = -1  # >= 0: send this many bytes, then wait for release()
        self.requests: list[dict[str, Any]] = []
        self.streaming = threading.Event()  # set once a held download has sent its first part
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None

    # -- the server ------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        entry = {
            "method": request.method,
            "raw_path": request.raw_path,
            "path": request.path,
            "query": [(k, v) for k, v in request.query.items()],
        }
        with self._lock:
            self.requests.append(entry)
        route = request.path
        if request.method == "POST" and route == "/admin/agent-tools/upload_file":
            return web.json_response(
                {"transfer_id": self.transfer_id, "file_uri": f"ac://files/{FILE_ID}"}
            )
        if request.method == "PUT":
            await request.read()
            return web.json_response({"written": True})
        if request.method == "POST" and route.endswith("/complete"):
            return web.json_response({"file_uri": f"ac://files/{FILE_ID}"})
        if request.method == "GET" and route.startswith("/admin/files/"):
            return await self._download(request)
        return web.json_response({"error": "not_found", "message": "stub center"}, status=404)

    async def _download(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = len(self.download)
        await response.prepare(request)
        if self.hold_after < 0:
            await response.write(self.download)
        else:
            await response.write(self.download[: self.hold_after])
            self.streaming.set()
            while not self._released.is_set():
                await asyncio.sleep(0.01)
            await response.write(self.download[self.hold_after :])
        await response.write_eof()
        return response

    def release(self) -> None:
        self._released.set()

    def seen(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.requests)

    # -- lifecycle -------------------------------------------------------------------------
    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.UnixSite(self._runner, str(self.socket_path))
        self._loop.run_until_complete(site.start())
        ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    @classmethod
    @contextmanager
    def start(cls, socket_path: Path) -> Iterator[StubCenter]:
        stub = cls(socket_path)
        ready = threading.Event()
        thread = threading.Thread(target=stub._run, args=(ready,), daemon=True)
        thread.start()
        assert ready.wait(30), "the stub center did not start"
        try:
            yield stub
        finally:
            stub.release()
            stub._loop.call_soon_threadsafe(stub._loop.stop)
            thread.join(30)

    def binding_env(self, agent_root: Path | str) -> dict[str, str]:
        return {
            "AC_MCP_AGENT_ID": "agent-1",
            "AC_MCP_ADMIN_URL": f"unix:{self.socket_path}",
            "AC_MCP_WORKER_TOKEN": "acat_stub_center_token_0123456789",
            "AC_MCP_AGENT_ROOT": str(agent_root),
        }
