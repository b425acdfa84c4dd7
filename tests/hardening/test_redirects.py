"""No redirect is ever followed, on any route: the pin holds for every byte the host sends.

A pinned TLS center (a real TLS server presenting a trustme certificate whose SHA-256 is the
pin) and a runtime socket (a real Unix socket) answer every request with a 3xx whose Location
points somewhere else: a plain-HTTP listener, or a TLS listener elsewhere that even presents the
pinned certificate. Both other listeners count accepted connections. For each of 301, 302, 303,
307 and 308 and each destination, a JSON tool (`create_task`), `fork_executor` (runtime socket)
and `download_file` must fail with `admin_redirect_refused` (status and Location in details),
the redirecting server must have seen exactly that one request, nothing may connect to the other
address, and the download must leave nothing in the workspace.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import ssl
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from mcphost.admin.pinning import format_pin
from tests.hardening.conftest import RawHost, host_env
from tests.hardening.scripted_center import Answer, Request, ScriptedServer

# deep (make test-slow): redirects from the center are refused.
pytestmark = [pytest.mark.deep, pytest.mark.timeout(180)]

TOKEN = "acat_redirect-secret-5b2e9d"
STATUSES = (301, 302, 303, 307, 308)
FILE_ID = "01HZZZZZZZZZZZZZZZZZZZZZZZ"


@dataclass
class Plan:
    status: int = 307
    destination: str = "http"


@dataclass
class World:
    host: RawHost
    plan: Plan
    center: ScriptedServer
    runtime: ScriptedServer
    others: dict[str, ScriptedServer]
    workspace: Path

    def location(self, path: str) -> str:
        other = self.others[self.plan.destination]
        return f"{self.plan.destination}://127.0.0.1:{other.port}{path}"


def pin_of(cert: trustme.LeafCert) -> str:
    der = ssl.PEM_cert_to_DER_cert(cert.cert_chain_pems[0].bytes().decode())
    return format_pin(hashlib.sha256(der).digest())


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    cert = trustme.CA().issue_cert("127.0.0.1")
    plan = Plan()
    leaked = Answer(200, b'{"leaked": true, "task_id": "T-evil", "file_id": "x"}')
    others = {
        "http": ScriptedServer(lambda request: leaked),
        "https": ScriptedServer(lambda request: leaked, cert=cert),  # even the pinned cert
    }
    holder: list[World] = []

    def redirect(request: Request) -> Answer:
        return Answer(
            plan.status,
            b'{"moved": true}',
            {"Content-Type": "application/json", "Location": holder[0].location(request.path)},
        )

    short = Path(tempfile.mkdtemp(prefix="mcph-rd-"))
    workspace = short / "workspace"
    workspace.mkdir()
    center = ScriptedServer(redirect, cert=cert)
    runtime = ScriptedServer(redirect, unix_path=str(short / "runtime.sock"))
    binding = {
        "AC_MCP_AGENT_ID": "agent-1",
        "AC_MCP_ADMIN_URL": f"tcp://127.0.0.1:{center.port}",
        "AC_MCP_WORKER_TOKEN": TOKEN,
        "AC_MCP_SERVER_FINGERPRINT": pin_of(cert),
        "AC_MCP_RUNTIME_SOCKET": str(short / "runtime.sock"),
        "AC_MCP_AGENT_ROOT": str(workspace),
    }
    host = RawHost(host_env(binding, MCPHOST_CALL_TIMEOUT_SECONDS="10"))
    try:
        host.initialize()
        holder.append(World(host, plan, center, runtime, others, workspace))
        yield holder[0]
        assert host.close() == 0
        assert TOKEN.encode() not in host.all_output()
    finally:
        for server in (center, runtime, *others.values()):
            server.close()
        shutil.rmtree(short, ignore_errors=True)


def call_redirected(
    world: World, server: ScriptedServer, status: int, destination: str, tool: str, args: dict
) -> dict:
    world.plan.status, world.plan.destination = status, destination
    before_requests = len(server.requests)
    before_other = {name: other.connections for name, other in world.others.items()}
    is_error, result = world.host.call(tool, args, timeout=30)
    assert is_error, f"a {status} redirect was followed: {result}"
    assert isinstance(result, dict) and result["error"] == "admin_redirect_refused", result
    sent = server.requests[before_requests:]
    assert len(sent) == 1, [(r.method, r.path) for r in sent]  # no second request, even here
    location = world.location(sent[0].path)
    assert result["details"]["status"] == status
    assert result["details"]["location"] == location
    assert "not followed" in result["message"]
    assert {name: o.connections for name, o in world.others.items()} == before_other, (
        "something connected to the redirect's address"
    )
    for other in world.others.values():
        assert TOKEN.encode() not in bytes(other.received)
    return result


@pytest.mark.parametrize("destination", ["http", "https"])
@pytest.mark.parametrize("status", STATUSES)
def test_a_json_tool_refuses_a_redirect(world: World, status: int, destination: str) -> None:
    result = call_redirected(
        world,
        world.center,
        status,
        destination,
        "create_task",
        {"project_id": "p-1", "title": "secret roadmap", "description": "do not leak"},
    )
    assert result["details"]["method"] == "POST"
    assert world.center.requests[-1].path == "/admin/agent-tools/create_task"


@pytest.mark.parametrize("destination", ["http", "https"])
@pytest.mark.parametrize("status", STATUSES)
def test_fork_executor_refuses_a_redirect_on_the_runtime_socket(
    world: World, status: int, destination: str
) -> None:
    call_redirected(world, world.runtime, status, destination, "fork_executor", {"task_id": "T-1"})
    assert world.runtime.requests[-1].path == "/runtime/fork_executor"


@pytest.mark.parametrize("destination", ["http", "https"])
@pytest.mark.parametrize("status", STATUSES)
def test_a_download_refuses_a_redirect_and_writes_nothing(
    world: World, status: int, destination: str
) -> None:
    result = call_redirected(
        world,
        world.center,
        status,
        destination,
        "download_file",
        {"file": f"ac://files/{FILE_ID}", "dest_path": "got/leaked.bin"},
    )
    assert result["details"]["method"] == "GET"
    assert world.center.requests[-1].path.startswith(f"/admin/files/{FILE_ID}")
    assert sorted(os.listdir(world.workspace)) == [], "the download left something behind"
