"""What each agent of a fleet will reach on this machine, worked out from the fleet and the state
directory alone, before anything runs: `mcphost supervise` at load and in `--check`, a reload,
and the supervisor itself when it spawns.

Owns:
- the attach points under a state directory (`attach_points`: the pump, `interpreter -I -S
  script`, and the sockets `<state>/run/center.sock` and `relay.sock`) and the control socket
  (`CONTROL`);
- the one bound on the state directory's length (`state_problem`): the sockets under it that are
  reached by their path as it is (`socket_paths`: the control socket, which `mcphost ctl`
  connects to, and the attach sockets, which the pump, stdlib only, connects to) must each fit
  `sun_path` (`mcphost.unixsock.fits`, `SUN_PATH_MAX` bytes). The relay's socket and the tmux
  servers' need no bound: they are reached through their directory when too long
  (`unixsock.address`, relay/tmux.py); the homes and the gate FIFOs are no sockets;
- the fence the supervisor gives an agent (`agent_fence`, with `secrets`: what no agent may
  reach): `Supervisor` spawns with it, and the checks here plan with the very same call, so the
  check and the spawn never disagree.
- `program_problems`: each fenced agent with a `command` finds its program as the fenced agent
  will (`fence.resolve` over that very fence, with the `PATH` of the environment it is spawned
  with, `homes.agent_env`: its `env`'s, else the supervisor's): `--check` prints one line per
  agent that will not, naming the key, the agent, the program and what the fence hides. At
  start and reload the agent is still started: its spawn fails with the same words in
  `ctl status` (`Fence.wrap` refuses it), and succeeds once the program is where it can see it.

Must never: spawn a process, change anything on disk, or take anything from an agent (it reads
the fleet, this process's own paths, and stats of the host's files).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from mcphost.supervisor import fence as fences
from mcphost.supervisor.homes import AttachPoints, Home, agent_argv, agent_env, home_paths
from mcphost.supervisor.kernel import resolve_user, switch_of
from mcphost.supervisor.plan import AgentPlan, Fleet
from mcphost.unixsock import SUN_PATH_MAX

CONTROL = "control.sock"  # <state>/control.sock, `mcphost ctl`'s way in
RUN = "run"  # <state>/run/: the attach sockets


def attach_points(state_dir: str) -> AttachPoints:
    """What every attach entry under `state_dir` runs: this interpreter, the installed pump
    (configgen's rule), and the two attach sockets."""
    from configgen import attach_script

    state = os.path.abspath(state_dir)
    return AttachPoints(
        interpreter=sys.executable,
        script=attach_script(),  # inside the installed package
        center_socket=os.path.join(state, RUN, "center.sock"),
        relay_socket=os.path.join(state, RUN, "relay.sock"),
    )


def socket_paths(state_dir: str) -> tuple[str, ...]:
    """The sockets under `state_dir` that are reached by their path as it is (see the module
    docstring): each must fit `sun_path`."""
    attach = attach_points(state_dir)
    paths = [os.path.join(os.path.abspath(state_dir), CONTROL), attach.center_socket]
    return (*paths, *([attach.relay_socket] if attach.relay_socket else []))


def state_problem(state_dir: str) -> str | None:
    """Why `state_dir` cannot be the supervisor's state directory by its path alone, as the
    `expected` part of one operator line (None: it can): it must be absolute, and short enough
    for every socket of `socket_paths` to fit a Unix socket path."""
    if not state_dir or not os.path.isabs(state_dir) or "\0" in state_dir:
        return "an absolute path: the supervisor's state directory"
    state = os.path.abspath(state_dir)
    longest = max(socket_paths(state), key=lambda p: len(os.fsencode(p)))
    size, own = len(os.fsencode(longest)), len(os.fsencode(state))
    if size <= SUN_PATH_MAX:
        return None
    shown = "<state>" + longest[len(state) :]
    return (
        f"a path of at most {SUN_PATH_MAX - (size - own)} bytes (it has {own}), so that "
        f"{shown} fits the {SUN_PATH_MAX} bytes of a Unix socket path (it would have {size})"
    )


def secrets(fleet: Fleet) -> tuple[str, ...]:
    """What no agent may reach: the token and fleet files, the center's runtime socket and
    its admin socket (fence.py hides each one's directory)."""
    center = fleet.center
    found = [center.token_file, fleet.path]
    if center.runtime_socket:
        found.append(center.runtime_socket)
    if center.admin_url.kind == "unix":
        found.append(center.admin_url.path)
    return tuple(os.path.abspath(p) for p in found)


def agent_fence(
    fleet: Fleet,
    state_dir: str,
    plan: AgentPlan,
    home: Home | None = None,
    *,
    support: fences.Support | None = None,
) -> fences.Fence | None:
    """The agent's fence (fence.py): its home and attach sockets visible, the state, the token
    and fleet files and the runtime directories hidden; None with `sandbox = "none"`. `home`:
    its layout (`home_paths` when not given). `check_sandbox` refused "auto" at load where it
    cannot be built; `check_users`, a user it cannot switch to."""
    if plan.sandbox == "none":
        return None
    state = os.path.abspath(state_dir)
    if home is None:
        home = home_paths(state, plan.agent_id, plan.client)
    attach = attach_points(state)
    return fences.for_agent(
        state_dir=state,
        home=home.root,
        workspace=home.workspace,
        sockets=tuple(s for s in (attach.center_socket, attach.relay_socket) if s),
        secrets=secrets(fleet),
        env=dict(plan.env),
        switch=switch_of(resolve_user(plan.user)),
        pump=attach.script,
        tmp_size=plan.tmp_size,
        support=support,
    )


def program_problems(fleet: Fleet, state_dir: str, env: Mapping[str, str]) -> list[str]:
    """One line per fenced agent with a `command` that will not find its program inside its
    fence (`env`: the supervisor's environment, which the agent's is made from): the key that
    gives the command, the agent, and `fence.resolve`'s words (the program, the agent's PATH,
    what the fence hides of it)."""
    lines = []
    for index, plan in enumerate(fleet.agents):
        if plan.command is None or plan.sandbox == "none":
            continue
        home = home_paths(state_dir, plan.agent_id, plan.client)
        fence = agent_fence(fleet, state_dir, plan, home)
        assert fence is not None
        program = agent_argv(plan, home)[0]
        path = agent_env(env, plan, home).get("PATH", os.defpath)
        try:
            fences.resolve(fence.plan, program, path)
        except FileNotFoundError as exc:
            own = plan.command != fleet.defaults.command
            key = f"agent[{index}].command" if own else "defaults.command"
            lines.append(
                f"{key} ({plan.agent_id}): {exc.strerror}: install it where the fence shows "
                "it (not under /tmp, /run or the state directory) or name it by a path the "
                "agent can see"
            )
    return lines
