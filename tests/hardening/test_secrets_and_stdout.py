"""Token hygiene and stdout purity.

Token: every error path we can reach — refused arguments, unknown tools, center error statuses,
a timeout, an oversized reply, a wrong token, a wrong pin, a center that is down, file-tool
refusals, bad bindings, `mcphost check` (text and --json) — is driven with debug logging, and
stdout (tool results), stderr, and the event-record file are searched for the token (whole,
and its secret tail): zero hits.

stdout: a host under debug logging and center failures, and a bare wire-core server whose tools
raise and print to stdout in every way Python allows, both keep stdout strictly JSON-RPC.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from mcphost.testing import DevCenter
from tests.blackbox.test_host import WRONG_PIN
from tests.hardening.conftest import RawHost, host_env, run_in_process, strict_json

# deep (make test-slow): the token on every error path and output.
pytestmark = [pytest.mark.deep, pytest.mark.timeout(180)]

FIGURES = {"error_paths": 0, "outputs_searched": 0, "token_hits": 0}


def needles(token: str) -> list[bytes]:
    return [token.encode(), token[-16:].encode()]


def assert_no_token(blob: bytes, token: str, what: str) -> None:
    FIGURES["outputs_searched"] += 1
    for needle in needles(token):
        if needle in blob:
            FIGURES["token_hits"] += 1
            raise AssertionError(f"the token leaked into {what}")


ERROR_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("get_my_work", {"agent_id": "agent-2"}),
    ("get_task", {}),
    ("get_task", {"task_id": 7}),
    ("no_such_tool", {}),
    ("get_task", {"task_id": "t-missing"}),
    ("get_issue", {"issue_id": "i-2"}),
    ("fork_executor", {"task_id": "t-1"}),
    ("upload_file", {"path": "../../etc/passwd"}),
    ("upload_file", {"path": "/etc/passwd"}),
    ("upload_file", {"path": "missing.txt"}),
    ("download_file", {"file": "not-a-uri", "dest_path": "x"}),
    ("download_file", {"file": "ac://files/f-nope", "dest_path": "../x"}),
    ("search_tools", {"names": 3}),
]


def drive(host: RawHost, calls: list[tuple[str, dict[str, Any]]]) -> None:
    for tool, args in calls:
        host.call(tool, args, timeout=20)
        FIGURES["error_paths"] += 1


def run_check(env: dict[str, str], *flags: str) -> bytes:
    proc = subprocess.run(
        [sys.executable, "-m", "mcphost.cli", "check", *flags],
        env=env,
        capture_output=True,
        timeout=60,
    )
    FIGURES["error_paths"] += 1
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("scenario", ["center_up", "wrong_token", "wrong_pin", "center_down"])
def test_no_error_path_reveals_the_token(center: DevCenter, tmp_path: Path, scenario: str) -> None:
    token = center.token
    overrides: dict[str, str | None] = {"AC_MCP_RUNTIME_SOCKET": None}
    transport = "unix"
    if scenario == "wrong_token":
        token = "acat_wrong-but-secret-0123456789abcdef"
        overrides["AC_MCP_WORKER_TOKEN"] = token
    elif scenario == "wrong_pin":
        transport = "tcp"
        overrides["AC_MCP_SERVER_FINGERPRINT"] = WRONG_PIN
    elif scenario == "center_down":
        overrides["AC_MCP_ADMIN_URL"] = f"unix:{tmp_path}/gone.sock"
    binding = center.binding_env(transport, **overrides)  # type: ignore[arg-type]
    log_file = tmp_path / "events.jsonl"
    env = host_env(
        binding,
        MCPHOST_LOG_LEVEL="debug",
        MCPHOST_LOG_FILE=str(log_file),
        MCPHOST_CALL_TIMEOUT_SECONDS="0.5",
    )
    faults = {
        "status": {"get_my_work": (401, "auth_unknown"), "heartbeat": (500, "internal")},
        "delay_ms": {"complete_task": 2000},
        "big_result_bytes": {"get_task": 17 * 1024 * 1024, "get_issue": 200_000},
    }
    with center.faults(**faults), RawHost(env) as host:
        host.initialize()
        drive(host, ERROR_CALLS)
        drive(
            host,
            [
                ("get_my_work", {}),
                ("heartbeat", {"task_id": "t-1"}),
                ("complete_task", {"task_id": "t-1"}),
                ("get_task", {"task_id": "t-1"}),
                ("get_issue", {"issue_id": "i-1"}),
            ],
        )
        assert host.close() == 0
        assert not host.bad_lines
        assert_no_token(host.all_output(), token, f"host stdout/stderr ({scenario})")
    for flags in ((), ("--json",)):
        assert_no_token(run_check(env, *flags), token, f"mcphost check {flags} ({scenario})")
    assert log_file.stat().st_size > 0
    records = log_file.read_bytes()  # the host's records, and any the checks wrote
    for line in records.splitlines():
        strict_json(line)  # every event record is one JSON object per line
    assert_no_token(records, token, f"event records ({scenario})")


def test_bad_bindings_never_echo_the_token(center: DevCenter, tmp_path: Path) -> None:
    """The first case runs as real processes; the rest through the same `main()` in this process
    (`run_in_process`: same environment, exit code and output streams, no interpreter start-up)."""
    token = center.token
    token_file = tmp_path / "token"
    token_file.write_text(token)
    token_file.chmod(0o644)
    cases: list[dict[str, str | None]] = [
        {"AC_MCP_GENERATION": "-3"},
        {"AC_MCP_ADMIN_URL": "https://center:443"},
        {"AC_MCP_SERVER_FINGERPRINT": "sha256:00"},
        {"AC_MCP_WORKER_TOKEN_FILE": str(token_file)},  # both set
        {"AC_MCP_WORKER_TOKEN": None, "AC_MCP_WORKER_TOKEN_FILE": str(token_file)},  # mode 0644
        {"AC_MCP_AGENT_ID": f"a {token}"[:40]},  # whitespace in the id
    ]
    for index, overrides in enumerate(cases):
        env = host_env(center.binding_env("tcp", **overrides))  # type: ignore[arg-type]
        for args in (["host"], ["check"], ["check", "--json"]):
            if index == 0:
                proc = subprocess.run(
                    [sys.executable, "-m", "mcphost.cli", *args],
                    env=env,
                    capture_output=True,
                    timeout=30,
                )
            else:
                proc = run_in_process(args, env)
            FIGURES["error_paths"] += 1
            assert proc.returncode == 2, (overrides, proc.stderr)
            blob = proc.stdout + proc.stderr
            if "AC_MCP_AGENT_ID" in overrides:
                continue  # the operator put token text in the id variable: shown as given
            assert_no_token(blob, token, f"bad binding {overrides} / {args}")
    print(f"\ntoken hygiene figures: {FIGURES}")


WIRE_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from mcphost import events
    from mcphost.surface import ToolResult, ToolSpec
    from mcphost.mcpserve.stdio import run

    class Noisy:
        name = "noisy"; version = "1"; instructions = None; list_changed = False
        def list_tools(self):
            return [ToolSpec(n, n, {"type": "object"}) for n in ("raise", "print", "ok")]
        async def call_tool(self, name, arguments, ctx):
            print("plain print, block-buffered")
            print("flushed print", flush=True)
            sys.stdout.write("sys.stdout.write\\n")
            sys.stdout.buffer.write(b"buffer write\\n")
            os.write(1, b"os.write to fd 1\\n")
            events.emit("noisy.debug", level="debug", name=name)
            if name == "raise":
                raise RuntimeError("handler blew up")
            if name == "exit":
                raise SystemExit(3)
            return ToolResult(text="fine")
        async def aclose(self):
            print("print during shutdown")

    print("banner before serving")
    sys.exit(run(Noisy))
    """
)


def test_stdout_stays_json_rpc_when_handlers_raise_and_print() -> None:
    env = host_env({}, MCPHOST_LOG_LEVEL="debug")
    host = RawHost(env, args=["-c", WIRE_SCRIPT])
    host.initialize()
    answers = [host.call(name, {}) for name in ("ok", "raise", "print", "raise", "ok")]
    assert answers[0] == (False, "fine")
    assert answers[1][1]["rpc_error"]["data"]["code"] == "internal_unexpected_failure"
    assert "handler blew up" not in json.dumps(answers[1])  # logged on stderr, not echoed
    host.alive()
    assert host.close() == 0
    assert not host.bad_lines, host.bad_lines
    err = bytes(host.stderr)
    assert b"os.write to fd 1" in err and b"flushed print" in err and b"mcp.call.unexpected" in err
    assert b"banner before serving" in err  # printed (buffered) before serving: still stderr


def test_host_stdout_under_debug_and_center_failures(center: DevCenter) -> None:
    env = host_env(center.binding_env("unix"), MCPHOST_LOG_LEVEL="debug")
    with center.faults(status={"*": (503, "unavailable")}), RawHost(env) as host:
        host.initialize()
        drive(host, [*ERROR_CALLS, ("get_my_work", {}), ("search_tools", {"query": "task"})])
        host.write(b"\x00garbage\n{not json\n")
        host.alive()
        assert host.close() == 0
    assert not host.bad_lines and len(host.messages) >= len(ERROR_CALLS) + 4
    assert b'"level": "debug"' in host.stderr
