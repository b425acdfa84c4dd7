"""`mcphost devcenter`: run the reference center on a Unix socket and/or TLS over TCP.

Owns: argument parsing, the state directory layout, listeners (admin on --unix/--tcp, the
runtime control socket), the env file and ready file (both written atomically), the stderr
summary, and graceful shutdown on SIGTERM/SIGINT (socket files removed, exit 0).
Must never: write to stdout, print a token, or serve plaintext HTTP on TCP.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import stat
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

from mcphost.cliargs import Parser
from mcphost.devcenter.app import admin_app, runtime_app
from mcphost.devcenter.center import Center
from mcphost.devcenter.store import SEED_AGENT, Store, token_file
from mcphost.devcenter.tls import ensure_identity
from mcphost.fsutil import write_atomic


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="mcphost devcenter", description="Run the reference center.")
    p.add_argument("--state", required=True, type=Path, help="state directory (created if missing)")
    p.add_argument("--unix", type=Path, help="serve the admin API on this Unix socket")
    p.add_argument("--tcp", help="serve the admin API with TLS on HOST:PORT (port 0 picks one)")
    p.add_argument(
        "--runtime-socket", type=Path, help="serve the runtime control API on this Unix socket"
    )
    p.add_argument("--env-file", type=Path, help="write agent-1's AC_MCP_* bindings here (0600)")
    p.add_argument("--ready-file", type=Path, help="write a JSON ready record here once listening")
    p.add_argument(
        "--control", action="store_true", help="mount /_devcenter/* (faults, request log)"
    )
    return p


def _split_hostport(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise SystemExit(f"mcphost devcenter: --tcp expects HOST:PORT, got {text!r}")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def _display_host(host: str) -> str:
    if host in ("0.0.0.0", "localhost", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _unlink_socket(path: Path) -> None:
    try:
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
    except FileNotFoundError:
        pass


def ensure_agent_root(state: Path) -> Path:
    """`<state>/agents/agent-1/workspace`, every level 0700."""
    root = state / "agents" / SEED_AGENT / "workspace"
    for level in (root.parent.parent, root.parent, root):
        level.mkdir(mode=0o700, exist_ok=True)
    return root


def binding_lines(
    *, state: Path, admin_url: str, token: str, fingerprint: str | None, runtime_socket: Path | None
) -> dict[str, str]:
    root = ensure_agent_root(state)
    env = {
        "AC_MCP_AGENT_ID": SEED_AGENT,
        "AC_MCP_ADMIN_URL": admin_url,
        "AC_MCP_WORKER_TOKEN": token,
    }
    if fingerprint:
        env["AC_MCP_SERVER_FINGERPRINT"] = fingerprint
    env["AC_MCP_AGENT_ROOT"] = str(root)
    if runtime_socket is not None:
        env["AC_MCP_RUNTIME_SOCKET"] = str(runtime_socket)
    return env


# How long requests still in flight at SIGTERM may take before they are cancelled (aiohttp's
# default is 60 s): a client that stopped sending mid-body must not hold a stopping center.
SHUTDOWN_GRACE = 2.0


async def serve(args: argparse.Namespace) -> int:
    # Handlers first: a SIGTERM sent as soon as the ready file appears must stop us cleanly.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    state: Path = args.state.resolve()
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    store = Store(state / "center.db")
    store.seed(state)
    center = Center(store, state)
    identity = ensure_identity(state)  # always, so the pin is known before TCP is ever enabled

    runners: list[web.AppRunner] = []
    sockets: list[Path] = []
    admin = web.AppRunner(
        admin_app(center, control=args.control),
        access_log=None,
        handle_signals=False,
        shutdown_timeout=SHUTDOWN_GRACE,
    )
    await admin.setup()
    runners.append(admin)
    unix_path: Path | None = None
    tcp_display: str | None = None
    if args.unix:
        unix_path = args.unix.resolve()
        _unlink_socket(unix_path)
        await web.UnixSite(admin, str(unix_path)).start()
        os.chmod(unix_path, 0o600)
        sockets.append(unix_path)
    if args.tcp:
        host, port = _split_hostport(args.tcp)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        await web.SockSite(admin, sock, ssl_context=identity.server_context()).start()
        tcp_display = f"{_display_host(host)}:{sock.getsockname()[1]}"
    runtime_path: Path | None = None
    if args.runtime_socket:
        runtime_path = args.runtime_socket.resolve()
        _unlink_socket(runtime_path)
        rt = web.AppRunner(
            runtime_app(center),
            access_log=None,
            handle_signals=False,
            shutdown_timeout=SHUTDOWN_GRACE,
        )
        await rt.setup()
        runners.append(rt)
        await web.UnixSite(rt, str(runtime_path)).start()
        os.chmod(runtime_path, 0o600)
        sockets.append(runtime_path)

    fingerprint = identity.fingerprint
    tok_file = token_file(state)
    if args.env_file:
        admin_url = f"unix:{unix_path}" if unix_path else f"tcp://{tcp_display}"
        env = binding_lines(
            state=state,
            admin_url=admin_url,
            token=tok_file.read_text().strip(),
            fingerprint=fingerprint if tcp_display else None,
            runtime_socket=runtime_path,
        )
        write_atomic(args.env_file, "".join(f"{k}={v}\n" for k, v in env.items()))
    else:
        ensure_agent_root(state)
    ready: dict[str, Any] = {
        "unix": str(unix_path) if unix_path else None,
        "tcp": tcp_display,
        "fingerprint": fingerprint,
        "runtime_socket": str(runtime_path) if runtime_path else None,
        "state": str(state),
        "agent_id": SEED_AGENT,
        "token_file": str(tok_file),
        "pid": os.getpid(),
    }
    if args.ready_file:
        write_atomic(args.ready_file, json.dumps(ready) + "\n", 0o644)
    summary = [f"mcphost devcenter: listening (pid {os.getpid()}, state {state})"]
    if unix_path:
        summary.append(f"  admin (unix):  unix:{unix_path}")
    if tcp_display:
        summary.append(f"  admin (tls):   tcp://{tcp_display}")
        summary.append(f"  fingerprint:   {fingerprint}")
    if runtime_path:
        summary.append(f"  runtime:       {runtime_path}")
    summary.append(f"  agent:         {SEED_AGENT}  (worker token in {tok_file})")
    if args.control:
        summary.append("  control:       /_devcenter/faults, /_devcenter/requests")
    print("\n".join(summary), file=sys.stderr, flush=True)

    try:
        await stop.wait()
    finally:
        for runner in runners:
            await runner.cleanup()
        for path in sockets:
            _unlink_socket(path)
        store.close()
    print("mcphost devcenter: stopped", file=sys.stderr, flush=True)
    return 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if not args.unix and not args.tcp:
        print(
            "mcphost devcenter: give at least one of --unix PATH or --tcp HOST:PORT",
            file=sys.stderr,
        )
        return 2
    try:
        return asyncio.run(serve(args))
    except OSError as exc:
        print(f"mcphost devcenter: cannot start: {exc}", file=sys.stderr)
        return 1
