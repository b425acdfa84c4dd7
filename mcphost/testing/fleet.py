"""Fleet files and stand-in agents for runs of a real `mcphost supervise` (tests, the demo).

Owns: `standin()` (the argv of the stand-in agent, mcphost/testing/standin_agent.py, run by the
current interpreter), `toml_value` and `fleet_toml` (a fleet file's text for a `DevCenter`),
and `left_running` (which processes still touch a directory, or carry a marker in their
environment: how a run proves it left nothing behind).
Must never: start or stop anything; it writes text and reads /proc, nothing else.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcphost import procfs

if TYPE_CHECKING:
    from mcphost.testing.devcenter import DevCenter

STANDIN = str(Path(__file__).resolve().parent / "standin_agent.py")


def standin(*flags: str) -> list[str]:
    """The stand-in agent's command for a fleet file: it is given the agent's MCP config."""
    return [sys.executable, STANDIN, "{mcp_config}", *flags]


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table, e.g. an agent's env
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def fleet_toml(
    center: DevCenter,
    token_file: Path,
    agents: Iterable[dict[str, Any]],
    center_keys: dict[str, Any] | None = None,
    **defaults: Any,
) -> str:
    """A fleet file binding the supervisor to `center` over its Unix socket: `[center]`, then
    `defaults` as `[defaults]`, then one `[[agent]]` table per agent, keys in the order given."""
    lines = [
        "[center]",
        f"admin_url = {toml_value(center.admin_url('unix'))}",
        f"token_file = {toml_value(str(token_file))}",
        *(f"{k} = {toml_value(v)}" for k, v in (center_keys or {}).items()),
        "",
        "[defaults]",
    ]
    lines += [f"{k} = {toml_value(v)}" for k, v in defaults.items()]
    for agent in agents:
        lines += ["", "[[agent]]"]
        lines += [f"{k} = {toml_value(v)}" for k, v in agent.items()]
    return "\n".join(lines) + "\n"


def left_running(directory: Path | str, marker: str | None = None) -> list[str]:
    """Processes other than this one whose argv names `directory`, whose working directory is
    in it, or (with `marker`) whose environment holds `marker`: "pid: argv" each. Zombies and
    processes we may not read are skipped."""
    root = os.path.realpath(directory)
    found = []
    for pid in procfs.scan():
        base = f"/proc/{pid}"
        try:
            if pid == os.getpid() or procfs.state_of(procfs.read_text(f"{base}/stat") or "") == "Z":
                continue
            with open(f"{base}/cmdline", "rb") as handle:
                argv = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
            cwd = os.readlink(f"{base}/cwd")
            environ = b""
            if marker is not None:
                with open(f"{base}/environ", "rb") as handle:
                    environ = handle.read()
        except (OSError, ValueError):
            continue
        in_dir = cwd == root or cwd.startswith(root + os.sep) or root in argv
        if in_dir or (marker is not None and marker.encode() in environ):
            found.append(f"{pid}: {argv or '?'}")
    return found
