"""A real headless Chromium driven over the DevTools protocol, for the fleet page's test.

Owns: starting Debian's `chromium` (headless, a throwaway profile) with `--remote-debugging-pipe`
(the protocol as NUL-terminated JSON on the browser's fds 3 and 4: no port, no websocket, no
client library), one page target in flat session mode, commands (`send`), the events the browser
sent (`events`), and stopping the browser with everything it started.

Why the protocol and not Playwright: Playwright drives the same protocol through a Node driver it
ships (about 100 MB with its wheel) and wants a browser build of its own; the few commands this
test needs (navigate, evaluate, the network's bodies, a screenshot) are a page of code here.

Must never: load anything but the page under test (the profile is fresh, background networking,
extensions and component updates are off).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from tests.waiting import until

CHROMIUM = "chromium"  # Debian's package and program (the Makefile's `system` target installs it)
FLAGS = (
    "--headless=new", "--remote-debugging-pipe", "--no-first-run", "--no-default-browser-check",
    "--disable-gpu", "--disable-dev-shm-usage", "--disable-extensions",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--mute-audio", "--password-store=basic",
)  # fmt: skip


def chromium_missing() -> str | None:
    """Why the browser test cannot run here (None: it can)."""
    if shutil.which(CHROMIUM) is None:
        return (
            "chromium is not installed: `make system` installs Debian's chromium package "
            "(apt-get, as root); elsewhere install it to run the fleet page's browser test"
        )
    return None


class DevToolsError(AssertionError):
    pass


class Chromium:
    """One headless browser with one page (`session`); `close()` ends it."""

    def __init__(self, width: int = 1400, height: int = 640) -> None:
        self.profile = tempfile.mkdtemp(prefix="mcphost-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        sandbox = ("--no-sandbox",) if os.geteuid() == 0 else ()  # Chromium refuses root else
        script = (
            f"exec 3<&{to_browser_r} 4>&{from_browser_w} {to_browser_r}<&- {from_browser_w}>&-; "
            'exec "$@"'
        )
        self.proc = subprocess.Popen(
            ["bash", "-c", script, "bash", CHROMIUM, *FLAGS, *sandbox,
             f"--user-data-dir={self.profile}", "about:blank"],
            pass_fds=(to_browser_r, from_browser_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        attached = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})
        self.session: str = attached["sessionId"]
        for domain in ("Page", "Network", "Runtime"):
            self.page(f"{domain}.enable")
        self.page(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    # -- the wire ------------------------------------------------------------------------
    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_browser, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._lock:
                    self._lock.notify_all()
                return
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            with self._lock:
                for raw in messages:
                    message = json.loads(raw)
                    if "id" in message:
                        self._replies[message["id"]] = message
                    else:
                        self.events.append(message)
                self._lock.notify_all()

    def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        """One command; its result (a protocol error raises `DevToolsError`)."""
        with self._lock:
            self._next += 1
            ident = self._next
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        with self._lock:
            done = self._lock.wait_for(
                lambda: ident in self._replies or self.proc.poll() is not None, timeout=60
            )
            reply = self._replies.pop(ident, None)
        if not done or reply is None:
            raise DevToolsError(f"{method}: no reply (browser exit status {self.proc.poll()})")
        if "error" in reply:
            raise DevToolsError(f"{method}: {reply['error']}")
        return dict(reply.get("result") or {})

    def page(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.send(method, params, session=self.session)

    def events_named(self, method: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e.get("method") == method]

    # -- what the test does -------------------------------------------------------------
    def navigate(self, url: str) -> None:
        reply = self.page("Page.navigate", {"url": url})
        if reply.get("errorText"):
            raise DevToolsError(f"navigate {url}: {reply['errorText']}")
        until(lambda: self.evaluate("document.readyState") == "complete", 30, "the page to load")

    def evaluate(self, expression: str) -> Any:
        """The value of `expression` in the page (JSON-able), exceptions raised."""
        reply = self.page(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in reply:
            raise DevToolsError(f"{expression}: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def bodies(self) -> list[tuple[str, str]]:
        """(url, body) of every response the page received whose body the browser still has."""
        out = []
        for event in self.events_named("Network.loadingFinished"):
            request = event["params"]["requestId"]
            try:
                reply = self.page("Network.getResponseBody", {"requestId": request})
            except DevToolsError:
                continue  # evicted, or a response without a body
            body = reply["body"]
            if reply.get("base64Encoded"):
                body = base64.b64decode(body).decode(errors="replace")
            out.append((self._url_of(request), body))
        return out

    def _url_of(self, request: str) -> str:
        for event in self.events_named("Network.responseReceived"):
            if event["params"]["requestId"] == request:
                return str(event["params"]["response"]["url"])
        return "?"

    def screenshot(self, path: Path) -> None:
        data = self.page("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data["data"]))

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the browser and every helper it started
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._reader.join(timeout=30)  # EOF once the browser is gone
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)
