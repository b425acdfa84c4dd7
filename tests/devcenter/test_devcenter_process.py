"""Black-box: the center as a process (`mcphost devcenter`): files it writes, TLS pinning,
restarts, shutdown, controls, OpenAPI."""

from __future__ import annotations

import json
import ssl
import stat
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from jsonschema import Draft7Validator

from mcphost.admin.pinning import format_pin, leaf_digest, parse_pin
from mcphost.devcenter import specs
from mcphost.testing import DevCenter, DevCenterError

# deep (make test-slow): the reference center as a process.
pytestmark = pytest.mark.deep


def test_state_files_and_bindings(devcenter: DevCenter) -> None:
    c = devcenter
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(c.state_dir / "worker-token") == 0o600
    assert mode(c.state_dir / "tls" / "key.pem") == 0o600
    assert mode(c.env_file) == 0o600
    assert mode(c.agent_root) == 0o700
    assert c.token.startswith("acat_")
    assert c.token not in (c.state_dir / "center.db").read_bytes().decode("latin-1")
    env = dict(line.split("=", 1) for line in c.env_file.read_text().splitlines())
    assert env == c.binding_env("unix")
    assert env["AC_MCP_ADMIN_URL"] == f"unix:{c.socket_path}"
    assert env["AC_MCP_SERVER_FINGERPRINT"] == c.fingerprint
    assert env["AC_MCP_RUNTIME_SOCKET"] == str(c.runtime_socket)
    ready = json.loads(c.ready_file.read_text())
    assert ready["agent_id"] == "agent-1" and ready["pid"] == c.pid
    assert ready["token_file"] == str(c.state_dir / "worker-token")
    tcp = c.binding_env("tcp", AC_MCP_AGENT_ID="agent-2", runtime_socket=None)
    assert tcp["AC_MCP_ADMIN_URL"] == f"tcp://127.0.0.1:{c.tcp_address[1]}"  # type: ignore[index]
    assert tcp["AC_MCP_AGENT_ID"] == "agent-2" and "AC_MCP_RUNTIME_SOCKET" not in tcp
    assert "listening" in c.stderr_tail()


def test_certificate(devcenter: DevCenter) -> None:
    cert = x509.load_pem_x509_certificate((devcenter.state_dir / "tls" / "cert.pem").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    assert 364 <= (cert.not_valid_after_utc - cert.not_valid_before_utc).days <= 366
    from cryptography.hazmat.primitives.serialization import Encoding

    assert devcenter.fingerprint == format_pin(leaf_digest(cert.public_bytes(Encoding.DER)))


def test_restart_keeps_everything(devcenter: DevCenter) -> None:
    c = devcenter
    before = (c.token, c.fingerprint, c.tcp_address, c.socket_path)
    task = c.call(
        "create_task", {"project_id": "p-1", "title": "survives", "assignee": "agent-1"}
    ).json()["task_id"]
    old_pid = c.pid
    c.restart()
    assert c.pid != old_pid
    assert (c.token, c.fingerprint, c.tcp_address, c.socket_path) == before
    assert [t["task_id"] for t in c.call("get_my_work").json()["tasks"]] == [task]
    assert c.call("get_my_work", transport="tcp").status == 200


def test_sigterm_stops_cleanly(tmp_path: Path) -> None:
    center = DevCenter.start(tmp_path / "c", unix=True, runtime_socket=True)
    assert center.socket_path is not None and center.socket_path.exists()
    assert center.stop() == 0
    assert not center.socket_path.exists()
    assert center.runtime_socket is not None and not center.runtime_socket.exists()
    assert "stopped" in center.stderr_tail()
    center.close()


def test_cli_refusals(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "mcphost.cli", "devcenter", "--state", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 2 and "--unix" in run.stderr and run.stdout == ""
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "state").write_text("a file where the state directory should be")
    with pytest.raises(DevCenterError, match="exited with 1 during start-up") as info:
        DevCenter.start(tmp_path / "broken")
    assert "cannot start" in str(info.value)


@pytest.mark.anyio
async def test_tls_with_aiohttp_fingerprint(devcenter: DevCenter) -> None:
    c = devcenter
    assert c.tcp_address is not None
    host, port = c.tcp_address
    url = f"https://{host}:{port}/admin/agent-tools/get_my_work"
    headers = {"Authorization": f"Bearer {c.token}", "X-AC-MCP-Generation": "1"}
    async with aiohttp.ClientSession() as session:
        pin = aiohttp.Fingerprint(parse_pin(c.fingerprint))
        async with session.post(
            url, json={"agent_id": "agent-1"}, headers=headers, ssl=pin
        ) as resp:
            assert resp.status == 200
            assert await resp.json() == {"tasks": []}
        async with session.post(
            url, json={"agent_id": "agent-x"}, headers=headers, ssl=pin
        ) as resp:
            assert resp.status == 403
            assert (await resp.json())["error"] == "agent_not_bound_to_worker"
        wrong = aiohttp.Fingerprint(bytes(32))
        with pytest.raises(aiohttp.ServerFingerprintMismatch):
            await session.post(url, json={"agent_id": "agent-1"}, headers=headers, ssl=wrong)
    # the CA path fails: self-signed, so only the pin can vouch for it
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.post(url, json={"agent_id": "agent-1"}, ssl=ssl.create_default_context())
    # what reached the center carried agent-1, the generation, and a redacted bearer
    seen = c.requests(3)
    first = next(r for r in seen if r["body"] == {"agent_id": "agent-1"})
    assert first["route"] == "/admin/agent-tools/get_my_work"
    assert first["headers"]["Authorization"] == "Bearer ***"
    assert first["headers"]["X-AC-MCP-Generation"] == "1"


def test_faults(devcenter_session: DevCenter) -> None:
    c = devcenter_session
    with c.faults(
        status={"get_my_work": (503, "center_down")}, big_result_bytes={"get_issue": 70_000}
    ):
        reply = c.call("get_my_work")
        assert (reply.status, reply.error) == (503, "center_down")
        issue = c.call("get_issue", {"issue_id": "i-1"})
        assert len(issue.json()["padding"]) == 70_000 and issue.json()["issue_id"] == "i-1"
        assert c.call("get_my_work", token="acat_nope").error == "auth_unknown"  # auth still first
    assert c.call("get_my_work").status == 200
    with c.faults(delay_ms={"*": 150}):
        started = time.monotonic()
        assert c.call("get_my_work").status == 200
        assert time.monotonic() - started >= 0.15
    reply = c.request("POST", "/_devcenter/faults", {"status": {"x": [200, "ok"]}})
    assert (reply.status, reply.error) == (400, "invalid_input")


def test_requests_log_shows_what_was_sent(devcenter_session: DevCenter) -> None:
    c = devcenter_session
    c.call("get_task", {"task_id": "t-log-probe"}, generation=0)
    last = c.requests(1)[0]
    assert last["route"] == "/admin/agent-tools/get_task"
    assert last["body"] == {"agent_id": "agent-1", "task_id": "t-log-probe"}
    assert last["query"] == {}
    assert c.token not in json.dumps(c.requests(100))


def test_requests_log_shows_the_query(devcenter_session: DevCenter) -> None:
    """Transfers carry the agent in the query string; the log keeps it (first value of a key)."""
    c = devcenter_session
    ulid = "01" + "A" * 24
    auth = {"Authorization": f"Bearer {c.token}"}
    reply = c.request(
        "GET", f"/admin/files/{ulid}?agent_id=agent-1&agent_id=agent-2&x=%20y", None, auth
    )
    assert reply.error == "not_found"
    last = c.requests(1)[0]
    assert (last["method"], last["route"]) == ("GET", f"/admin/files/{ulid}")
    assert last["query"] == {"agent_id": "agent-1", "x": " y"}
    assert last["headers"]["Authorization"] == "Bearer ***"


def test_forks(devcenter_session: DevCenter) -> None:
    c = devcenter_session
    reply = c.fork("t-fork-1", model="opus", context="ctx")
    assert reply.status == 202
    body = reply.json()
    assert body["ok"] is True and body["status"] == "accepted" and body["fork_id"].startswith("f-")
    assert (body["task_id"], body["agent_id"]) == ("t-fork-1", "agent-1")
    recorded = [f for f in c.forks() if f["fork_id"] == body["fork_id"]]
    assert recorded and recorded[0]["model"] == "opus" and recorded[0]["context"] == "ctx"
    assert c.fork("").error == "missing_task_id"
    assert c.fork("t-1", agent_id="agent-nobody").error == "not_found"
    assert c.fork("t-1", bogus=1).error == "invalid_input"


def test_openapi_and_healthz(devcenter_session: DevCenter) -> None:
    c = devcenter_session
    assert c.request("GET", "/healthz").json() == {"ok": True}
    doc = c.request("GET", "/openapi.json").json()
    assert doc["openapi"].startswith("3.0")
    paths = doc["paths"]
    for name, tool in specs.TOOLS.items():
        op = paths[f"/admin/agent-tools/{name}"]["post"]
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        assert schema["additionalProperties"] is False
        assert "agent_id" in schema["required"]
        assert set(schema["properties"]) == tool.allowed
        assert {"200", "400", "401"} <= set(op["responses"])
    assert {
        "/admin/files/transfer/{transfer_id}",
        "/admin/files/transfer/{transfer_id}/complete",
    } <= set(paths)
    assert "/admin/files/{file_id}" in paths
    assert doc["components"]["securitySchemes"]["workerToken"]["scheme"] == "bearer"
    for op in (m for item in paths.values() for m in item.values()):
        for response in op["responses"].values():
            for media in response.get("content", {}).values():
                Draft7Validator.check_schema(media["schema"])
        body = op.get("requestBody", {}).get("content", {}).get("application/json")
        if body:
            Draft7Validator.check_schema(body["schema"])
    # every routed tool is documented, and nothing undocumented answers
    assert len([p for p in paths if p.startswith("/admin/agent-tools/")]) == len(specs.TOOLS)
