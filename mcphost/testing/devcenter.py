"""`DevCenter`: run the real reference center as a subprocess for one test or one session.

Owns: the subprocess (`sys.executable -m mcphost.cli devcenter ...`), its state directory,
socket paths (moved to a short /tmp directory when the test path would exceed the Unix socket
path limit), the ready-file wait (with the center's stderr in the error), restarts that keep
the state, the socket paths and the TCP port, and convenience calls over the standard library.
Must never: leave a center running after `stop()`/`__exit__`, or read the center's database.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import mcphost
from mcphost import unixsock
from mcphost.testing.http import PinnedHTTPSConnection, Reply, UnixHTTPConnection, request

Transport = Literal["unix", "tcp"]


class DevCenterError(RuntimeError):
    """The center did not start, or exited unexpectedly."""


class DevCenter:
    """A running reference center. Use `DevCenter.start(dir, ...)` as a context manager."""

    def __init__(
        self,
        base: Path,
        *,
        unix: bool = True,
        tcp: bool = False,
        runtime_socket: bool = False,
        control: bool = True,
        startup_timeout: float | None = None,
    ) -> None:
        if not unix and not tcp:
            raise ValueError("a center needs unix=True, tcp=True or both")
        self.base = Path(base).resolve()
        self.base.mkdir(parents=True, exist_ok=True)
        self.state_dir = self.base / "state"
        self.ready_file = self.base / "ready.json"
        self.env_file = self.base / "agent-1.env"
        self.stderr_file = self.base / "devcenter.stderr.log"
        self.control = control
        # 20 s, stretched by the suite's MCPHOST_TEST_SLOWDOWN (tests/waiting.py) where one is set:
        # under a kernel test's software emulation a start takes four times as long
        slowdown = float(os.environ.get("MCPHOST_TEST_SLOWDOWN", "1") or 1)
        self.startup_timeout = 20.0 * slowdown if startup_timeout is None else startup_timeout
        sock_dir = self.base
        self._short_dir: Path | None = None
        if not unixsock.fits(str(self.base / "runtime.sock")):
            self._short_dir = Path(tempfile.mkdtemp(prefix="mcphost-dc-"))
            sock_dir = self._short_dir
        self.socket_path: Path | None = sock_dir / "admin.sock" if unix else None
        self.runtime_socket: Path | None = sock_dir / "runtime.sock" if runtime_socket else None
        self._tcp_spec: str | None = "127.0.0.1:0" if tcp else None
        self._proc: subprocess.Popen[bytes] | None = None
        self.ready: dict[str, Any] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def start(cls, base: Path, **options: Any) -> DevCenter:
        center = cls(base, **options)
        center._launch()
        return center

    def __enter__(self) -> DevCenter:
        if self._proc is None:
            self._launch()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def argv(self) -> list[str]:
        args = [sys.executable, "-m", "mcphost.cli", "devcenter", "--state", str(self.state_dir)]
        if self.socket_path:
            args += ["--unix", str(self.socket_path)]
        if self._tcp_spec:
            args += ["--tcp", self._tcp_spec]
        if self.runtime_socket:
            args += ["--runtime-socket", str(self.runtime_socket)]
        if self.control:
            args.append("--control")
        return [*args, "--env-file", str(self.env_file), "--ready-file", str(self.ready_file)]

    def _launch(self) -> None:
        self.ready_file.unlink(missing_ok=True)
        env = dict(os.environ)
        root = str(Path(mcphost.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        with self.stderr_file.open("ab") as err:
            self._proc = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
            )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.ready_file.exists():
                data = json.loads(self.ready_file.read_text())
                if data.get("pid") == self._proc.pid:
                    self.ready = data
                    if self.ready.get("tcp"):
                        self._tcp_spec = self.ready["tcp"]  # restarts keep the port
                    return
            code = self._proc.poll()
            if code is not None:
                self._proc = None
                raise DevCenterError(
                    f"the devcenter exited with {code} during start-up:\n{self.stderr_tail()}"
                )
            time.sleep(0.02)
        self.stop()
        raise DevCenterError(
            f"the devcenter was not ready after {self.startup_timeout:.0f}s (no {self.ready_file}):\n{self.stderr_tail()}"
        )

    def stderr_tail(self, lines: int = 40) -> str:
        try:
            text = self.stderr_file.read_text(errors="replace")
        except FileNotFoundError:
            return "(no stderr)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty stderr)"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait, SIGKILL if needed; returns the exit code (None if it was not running)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def restart(self) -> None:
        """Stop and start again with the same state, socket paths and TCP port."""
        self.stop()
        self._launch()

    def close(self) -> None:
        self.stop()
        if self._short_dir is not None:
            shutil.rmtree(self._short_dir, ignore_errors=True)

    # -- what a host needs ------------------------------------------------------------------

    @property
    def agent_id(self) -> str:
        return str(self.ready.get("agent_id", "agent-1"))

    @property
    def token(self) -> str:
        return self.worker_token("w-1")

    def worker_token(self, worker_id: str = "w-1") -> str:
        name = "worker-token" if worker_id == "w-1" else f"worker-token.{worker_id}"
        return (self.state_dir / name).read_text().strip()

    @property
    def fingerprint(self) -> str:
        return str(self.ready["fingerprint"])

    @property
    def tcp_address(self) -> tuple[str, int] | None:
        """(host, port) of the TLS listener, or None when TCP is not served."""
        spec = self.ready.get("tcp")
        if not spec:
            return None
        host, _, port = str(spec).rpartition(":")
        return host.strip("[]"), int(port)

    @property
    def agent_root(self) -> Path:
        return self.state_dir / "agents" / self.agent_id / "workspace"

    def admin_url(self, transport: Transport = "unix") -> str:
        if transport == "unix":
            if self.socket_path is None:
                raise ValueError("this center was started without unix=True")
            return f"unix:{self.socket_path}"
        if self.tcp_address is None:
            raise ValueError("this center was started without tcp=True")
        return f"tcp://{self.ready['tcp']}"

    def binding_env(self, transport: Transport = "unix", **overrides: str | None) -> dict[str, str]:
        """agent-1's AC_MCP_* bindings. Override by full name (`AC_MCP_AGENT_ID=...`) or short
        name (`agent_id=...`); an override of None removes the variable."""
        env = {
            "AC_MCP_AGENT_ID": self.agent_id,
            "AC_MCP_ADMIN_URL": self.admin_url(transport),
            "AC_MCP_WORKER_TOKEN": self.token,
            "AC_MCP_AGENT_ROOT": str(self.agent_root),
        }
        if self.tcp_address is not None:
            env["AC_MCP_SERVER_FINGERPRINT"] = self.fingerprint
        if self.runtime_socket is not None:
            env["AC_MCP_RUNTIME_SOCKET"] = str(self.runtime_socket)
        for key, value in overrides.items():
            name = key if key.upper().startswith("AC_MCP_") else f"AC_MCP_{key.upper()}"
            name = name.upper()
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env

    # -- talking to it ----------------------------------------------------------------------

    def _connection(
        self, transport: Transport | None
    ) -> UnixHTTPConnection | PinnedHTTPSConnection:
        if transport is None:
            transport = "unix" if self.socket_path else "tcp"
        if transport == "unix":
            if self.socket_path is None:
                raise ValueError("this center was started without unix=True")
            return UnixHTTPConnection(str(self.socket_path))
        address = self.tcp_address
        if address is None:
            raise ValueError("this center was started without tcp=True")
        return PinnedHTTPSConnection(address[0], address[1], self.fingerprint)

    def request(
        self,
        method: str,
        path: str,
        body: bytes | dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        *,
        transport: Transport | None = None,
    ) -> Reply:
        return request(self._connection(transport), method, path, body, headers)

    def call(
        self,
        tool: str,
        body: dict[str, Any] | None = None,
        *,
        agent_id: str | None = None,
        generation: int | None = None,
        token: str | None = None,
        transport: Transport | None = None,
    ) -> Reply:
        """POST /admin/agent-tools/<tool> as a host would (agent_id injected unless given in body)."""
        payload = {"agent_id": agent_id or self.agent_id, **(body or {})}
        headers = {"Authorization": f"Bearer {self.token if token is None else token}"}
        if generation is not None:
            headers["X-AC-MCP-Generation"] = str(generation)
        return self.request(
            "POST", f"/admin/agent-tools/{tool}", payload, headers, transport=transport
        )

    def _control(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        if not self.control:
            raise ValueError("this center was started without control=True")
        reply = self.request(method, path, body)
        if reply.status != 200:
            raise DevCenterError(f"{method} {path} -> {reply.status}: {reply.body[:500]!r}")
        return reply.json()

    def set_faults(
        self,
        *,
        delay_ms: dict[str, int] | None = None,
        status: dict[str, tuple[int, str] | list[Any]] | None = None,
        big_result_bytes: dict[str, int] | None = None,
    ) -> None:
        """Replace the fault table (keys are tool names, `transfer_put`, `transfer_complete`,
        `download`, or `*`)."""
        self._control(
            "POST",
            "/_devcenter/faults",
            {
                "delay_ms": delay_ms or {},
                "status": {k: list(v) for k, v in (status or {}).items()},
                "big_result_bytes": big_result_bytes or {},
            },
        )

    def clear_faults(self) -> None:
        self.set_faults()

    @contextmanager
    def faults(self, **table: Any) -> Iterator[None]:
        """`with center.faults(delay_ms={"*": 50}): ...` — cleared on exit."""
        self.set_faults(**table)
        try:
            yield
        finally:
            self.clear_faults()

    def add_worker(self, worker_id: str) -> str:
        """Create another worker (`w-3`, ...) through the control API; its token."""
        self._control("POST", "/_devcenter/workers", {"worker_id": worker_id})
        return self.worker_token(worker_id)

    def bind(self, worker_id: str, *agent_ids: str) -> None:
        """Create the agents on `worker_id`, or move them there (the center assigning them)."""
        self._control(
            "POST", "/_devcenter/agents", {"worker_id": worker_id, "agent_ids": list(agent_ids)}
        )

    def rotate_token(self, worker_id: str = "w-1", *, overlap_seconds: float = 0) -> str:
        """Rotate a worker's token (the new one is written to its token file, which
        `worker_token` reads); the old one is refused after `overlap_seconds`. The new token."""
        self._control(
            "POST", f"/_devcenter/workers/{worker_id}/token", {"overlap_seconds": overlap_seconds}
        )
        return self.worker_token(worker_id)

    def token_path(self, worker_id: str = "w-1") -> Path:
        """The worker's token file, as the center writes it (0600; rotations replace it)."""
        return self.state_dir / (
            "worker-token" if worker_id == "w-1" else f"worker-token.{worker_id}"
        )

    def requests(self, limit: int = 50) -> list[dict[str, Any]]:
        """The last admin requests, oldest first: {method, route, query, headers, body}."""
        return list(self._control("GET", f"/_devcenter/requests?limit={limit}"))

    def forks(self) -> list[dict[str, Any]]:
        """Recorded fork_executor requests (via the runtime socket, else the control API)."""
        if self.runtime_socket is not None:
            reply = request(UnixHTTPConnection(str(self.runtime_socket)), "GET", "/runtime/forks")
            return list(reply.json()["forks"])
        return list(self._control("GET", "/_devcenter/forks")["forks"])

    def fork(self, task_id: str, *, agent_id: str | None = None, **extra: Any) -> Reply:
        """POST /runtime/fork_executor as a host would."""
        if self.runtime_socket is None:
            raise ValueError("this center was started without runtime_socket=True")
        body = {"agent_id": agent_id or self.agent_id, "task_id": task_id, **extra}
        return request(
            UnixHTTPConnection(str(self.runtime_socket)), "POST", "/runtime/fork_executor", body
        )
