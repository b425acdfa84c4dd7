"""`mcphost supervise --check`'s view of the center and the state directory, before anything runs.

Owns: `preflight`: the fleet's token file (read as the link reads it), one pinned, harmless call
through a client of its own (the health's probe route, its failure told by the health's
`diagnose` table), and whether `--state` can be the supervisor's state directory; one line per
problem, none when the supervisor would start and reach its center.

It stands above both `link` and `health` (neither imports it), so the two never import each other
back. Must never: show the token, or name an `AC_MCP_*` variable (supervised mode has none).
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

from mcphost.errors import ToolFailure
from mcphost.supervisor.center.health import PROBE_ROUTE, diagnose
from mcphost.supervisor.center.link import for_operator, read_token

if TYPE_CHECKING:
    from mcphost.supervisor.plan import Fleet


def _state_problem(state_dir: str) -> str | None:
    """What keeps `state_dir` from being the supervisor's state directory, if anything."""
    try:
        info = os.lstat(state_dir)
    except (FileNotFoundError, NotADirectoryError):
        # created with its missing parents (startup.own_dir): the nearest that exists decides
        missing = state_dir.rstrip("/")
        parent = os.path.dirname(missing) or "/"
        while not os.path.lexists(parent):
            missing, parent = parent, os.path.dirname(parent) or "/"
        if not os.path.isdir(parent):
            return f"cannot be created: {parent} is not a directory"
        if not os.access(parent, os.W_OK | os.X_OK):
            lacking = (
                "does not exist"
                if missing == state_dir.rstrip("/")
                else (f"does not exist, nor does {missing}")
            )
            return f"{lacking}, and {parent} is not writable, so it cannot be created"
        return None
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory (or is a symlink)"
    if info.st_uid != os.geteuid():
        return f"is owned by uid {info.st_uid}, not the supervisor's ({os.geteuid()})"
    return None


async def preflight(fleet: Fleet, state_dir: str) -> list[str]:
    """`mcphost supervise --check`: one line per problem (none: the supervisor would start and
    reach its center). The fleet file itself was validated by the caller."""
    from mcphost.admin.client import AdminClient, AdminRequest
    from mcphost.binding import BindingError
    from mcphost.host.check import probe

    problems: list[str] = []
    center = fleet.center
    state = _state_problem(state_dir)
    if state is not None:
        problems.append(f"--state {state_dir}: {state}")
    try:
        token, _ = read_token(center.token_file)
    except BindingError as exc:
        problems.append(f"[center] token_file {exc.problem}: expected {exc.expected}")
        return problems
    client = AdminClient(center.admin_url, token=token, pins=center.pins, on_failure=for_operator)
    try:
        result = await probe(client, AdminRequest("GET", PROBE_ROUTE))
    finally:
        await client.aclose()
    if not result["ok"]:
        failure = ToolFailure(result["error"], result["message"], result["details"])
        found = diagnose(failure, str(center.admin_url))
        key = f"[center] {found.fleet_key}" if found.fleet_key else "[center]"
        problems.append(f"{key}: {found.state}: {found.remedy}")
    return problems
