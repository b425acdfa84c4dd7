"""The host as a process: start-up errors, stdout purity, shutdown on EOF and signals, `check`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from mcphost.testing import DevCenter
from tests.blackbox.conftest import HOST_ARGS
from tests.blackbox.test_host import WRONG_PIN
from tests.hardening.conftest import run_in_process

# deep (make test-slow): the host process's own life: bindings, signals, stdout.
pytestmark = pytest.mark.deep

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}


def spawn(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, *(args or HOST_ARGS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PATH": os.environ["PATH"], **env},
    )


def send(proc: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(message).encode() + b"\n")
    proc.stdin.flush()


def read(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read().decode() if proc.stderr else "no output"
    message: dict[str, Any] = json.loads(line)
    return message


@pytest.mark.parametrize(
    ("override", "variable", "run"),
    [
        ({"AC_MCP_AGENT_ID": None}, "AC_MCP_AGENT_ID", "process"),
        ({"AC_MCP_ADMIN_URL": "https://center:443"}, "AC_MCP_ADMIN_URL", "in_process"),
        ({"AC_MCP_GENERATION": "-3"}, "AC_MCP_GENERATION", "in_process"),
        ({"AC_MCP_TIER_TOOLS": "maybe"}, "AC_MCP_TIER_TOOLS", "in_process"),
        ({"AC_MCP_SERVER_FINGERPRINT": "sha256:00"}, "AC_MCP_SERVER_FINGERPRINT", "in_process"),
    ],
)
def test_bad_binding_exits_2_naming_the_variable(
    center: DevCenter, override: dict[str, str | None], variable: str, run: str
) -> None:
    """The first case is a real `mcphost host` process; the others run the same `main()` in this
    process (`run_in_process`: the same environment, exit code and output streams; these runs
    end while reading the binding, so a spawned interpreter would only add its start-up)."""
    env = center.binding_env("tcp", **override)  # type: ignore[arg-type]
    if run == "process":
        proc = spawn(env)
        out, err = proc.communicate(timeout=20)
        returncode = proc.returncode
    else:
        ran = run_in_process(HOST_ARGS[2:], {"PATH": os.environ["PATH"], **env})
        out, err, returncode = ran.stdout, ran.stderr, ran.returncode
    assert returncode == 2
    assert out == b""
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and variable in lines[0] and "expected" in lines[0]
    assert center.token not in err.decode()


@pytest.mark.parametrize("how", ["eof", "SIGTERM", "SIGINT"])
def test_shutdown_is_prompt_and_clean(center: DevCenter, how: str) -> None:
    proc = spawn(center.binding_env("unix"))
    send(proc, INIT)
    assert read(proc)["id"] == 1
    if how == "eof":
        assert proc.stdin is not None
        proc.stdin.close()
    else:
        proc.send_signal(getattr(signal, how))
    proc.wait(timeout=30)  # only a hang reaches this; `make bench` reports the exit time
    assert proc.returncode == 0


def test_every_stdout_line_is_json_rpc_even_under_debug_and_failures(center: DevCenter) -> None:
    env = center.binding_env("unix", AC_MCP_RUNTIME_SOCKET=None)
    env["MCPHOST_LOG_LEVEL"] = "debug"
    proc = spawn(env)
    send(proc, INIT)
    send(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    calls = [
        ("get_my_work", {}),
        ("get_task", {"task_id": "t-missing"}),
        ("fork_executor", {"task_id": "t-1"}),
        ("get_my_work", {"agent_id": "agent-2"}),
        ("nope", {}),
    ]
    for n, (tool, args) in enumerate(calls, start=2):
        send(
            proc,
            {
                "jsonrpc": "2.0",
                "id": n,
                "method": "tools/call",
                "params": {"name": tool, "arguments": args},
            },
        )
    proc.stdin.write(b"this is not json\n")  # type: ignore[union-attr]
    send(proc, {"jsonrpc": "2.0", "id": 99, "method": "no/such/method"})
    out, err = proc.communicate(timeout=20)
    lines = out.decode().splitlines()
    messages = [json.loads(line) for line in lines]
    assert all(m.get("jsonrpc") == "2.0" for m in messages)
    by_id = {m.get("id"): m for m in messages}
    assert set(range(1, 7)) <= set(by_id)
    assert by_id[99]["error"]["code"] == -32601
    assert any(m.get("error", {}).get("code") == -32700 for m in messages)
    assert b'"event": "mcp.tool.ok"' in err  # debug records went to stderr


def test_check_reports_ok_and_exit_0(center: DevCenter) -> None:
    for transport in ("unix", "tcp"):
        proc = spawn(center.binding_env(transport), "-m", "mcphost.cli", "check")
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err.decode()
        assert out == b"" and b"mcphost check: OK" in err
        assert center.token.encode() not in err


def test_check_reports_a_pin_mismatch_with_exit_1(center: DevCenter) -> None:
    env = center.binding_env("tcp", AC_MCP_SERVER_FINGERPRINT=WRONG_PIN)
    proc = spawn(env, "-m", "mcphost.cli", "check", "--json")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    report = json.loads(out)
    assert report["center"]["error"] == "admin_pin_mismatch"
    assert center.token.encode() not in out + err


@pytest.mark.parametrize("stdin", ["devnull", "file"])
def test_non_pipe_stdin_is_served_and_ends_at_eof(
    center: DevCenter, tmp_path: Any, stdin: str
) -> None:
    if stdin == "devnull":
        source = open(os.devnull, "rb")  # noqa: SIM115
    else:
        path = tmp_path / "requests.jsonl"
        path.write_text(
            json.dumps(INIT)
            + "\n"
            + json.dumps({"jsonrpc": "2.0", "id": 2, "method": "ping"})
            + "\n"
        )
        source = path.open("rb")
    with source:
        proc = subprocess.run(
            [sys.executable, *HOST_ARGS],
            stdin=source,
            capture_output=True,
            timeout=20,
            env={"PATH": os.environ["PATH"], **center.binding_env("unix")},
            check=False,
        )
    assert proc.returncode == 0
    replies = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [r["id"] for r in replies] == ([] if stdin == "devnull" else [1, 2])


def test_check_reports_a_missing_workspace_root(center: DevCenter, tmp_path: Any) -> None:
    env = center.binding_env("unix", AC_MCP_AGENT_ROOT=str(tmp_path / "gone"))
    proc = spawn(env, "-m", "mcphost.cli", "check", "--json")
    out, _err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    report = json.loads(out)
    assert report["center"]["ok"] is True
    assert report["workspace"].startswith("workspace_root_missing")
