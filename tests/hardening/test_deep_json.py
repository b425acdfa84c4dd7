"""A center reply nested deeper than Python can parse is a classified error, never a crash.

A scripted center on a real Unix socket answers with 100,000 nested arrays: as a 2xx JSON tool
reply over the 64 KiB result budget (the host parses it to cut it), as an error body, and as the
reply that opens an upload session. Each must come back with a stable code (no
`internal_unexpected_failure`, no `RecursionError` anywhere in the output) and the host must go
on serving.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.hardening.conftest import RawHost, host_env
from tests.hardening.scripted_center import Answer, Request, ScriptedServer

# deep (make test-slow): nesting bombs from the center.
pytestmark = [pytest.mark.deep, pytest.mark.timeout(120)]

DEEP = b"[" * 100_000 + b"]" * 100_000
DEEP_SMALL = b"[" * 30_000 + b"]" * 30_000  # an error body within the 64 KiB error-body cap


@dataclass
class Script:
    answers: dict[str, Answer] = field(default_factory=dict)

    def respond(self, request: Request) -> Answer:
        return self.answers.get(request.path.split("?")[0], Answer(200, b'{"tasks": []}'))


@pytest.fixture(scope="module")
def deep() -> Iterator[tuple[RawHost, Script]]:
    script = Script()
    short = Path(tempfile.mkdtemp(prefix="mcph-dj-"))
    workspace = short / "workspace"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("hello\n")
    server = ScriptedServer(script.respond, unix_path=str(short / "admin.sock"))
    binding = {
        "AC_MCP_AGENT_ID": "agent-1",
        "AC_MCP_ADMIN_URL": f"unix:{server.unix_path}",
        "AC_MCP_WORKER_TOKEN": "acat_deep-json-secret-77aa",
        "AC_MCP_AGENT_ROOT": str(workspace),
    }
    host = RawHost(host_env(binding, MCPHOST_CALL_TIMEOUT_SECONDS="10"))
    try:
        host.initialize()
        yield host, script
        host.alive()
        assert host.close() == 0
        assert b"RecursionError" not in host.all_output()
        assert b"internal_unexpected_failure" not in host.all_output()
    finally:
        server.close()
        shutil.rmtree(short, ignore_errors=True)


def test_a_deeply_nested_success_reply_is_a_protocol_error(
    deep: tuple[RawHost, Script],
) -> None:
    host, script = deep
    script.answers["/admin/agent-tools/get_my_work"] = Answer(200, DEEP)
    is_error, result = host.call("get_my_work", {})
    assert is_error and isinstance(result, dict), result
    assert result["error"] == "admin_protocol_error", result
    assert result["details"]["reason"] == "json_nesting_too_deep"
    assert result["details"]["reply_bytes"] == len(DEEP)
    assert "report this reply" in result["message"]
    host.alive()


def test_a_deeply_nested_error_body_keeps_its_status(deep: tuple[RawHost, Script]) -> None:
    host, script = deep
    script.answers["/admin/agent-tools/get_my_work"] = Answer(500, DEEP_SMALL)
    is_error, result = host.call("get_my_work", {})
    assert is_error and isinstance(result, dict), result
    assert result["error"] == "admin_http_error" and result["status"] == 500, result


def test_a_deeply_nested_upload_session_reply_is_a_protocol_error(
    deep: tuple[RawHost, Script],
) -> None:
    host, script = deep
    script.answers["/admin/agent-tools/upload_file"] = Answer(200, DEEP)
    is_error, result = host.call("upload_file", {"path": "notes.txt"})
    assert is_error and isinstance(result, dict), result
    assert result["error"] == "admin_protocol_error", result
    assert result["details"]["reason"] == "json_nesting_too_deep", result
