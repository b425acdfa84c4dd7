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
- `program_problems`: each fenced agent with a `command` (and each without one whose client's
  program the host has) finds its program as the fenced agent will (`fence.resolve` over that
  very fence, with the `PATH` of the environment it is spawned with, `homes.agent_env`: its
  `env`'s, else the supervisor's): `--check` prints one line per agent that will not, naming
  the key, the agent, the program, what the fence hides and, where the host has the program,
  the one command that puts it where every agent sees it (`_one_line_fix`). At
  start and reload the agent is still started: its spawn fails with the same words in
  `ctl status` (`Fence.wrap` refuses it), and succeeds once the program is where it can see it.
  It prints one line too per argument that names a path the host has and the fence hides
  (`fence.hidden_arguments`: a script beside the fleet file, the token's or an admin socket's,
  under the operator's home), with the code `argument_hidden_by_fence`, the argument's
  position, what hides it and where to put it instead; the spawn is not refused (an argument
  may be data that only looks like a path), the agent's own program then says it cannot open it.
- `check_reach`: each `user =` agent's user can run what its MCP client starts for the attach
  entries (the supervisor's interpreter, its standard library, the pump `mcphost/attach.py`)
  and pass the state directory's parent to the attach sockets: a checkout or virtualenv in a
  private directory (`/root`, 0700) would leave it `running` with no session, forever. Load
  and reload refuse it (`SettingError`, exit 2), one line per key naming the agents, the user
  and the path that stops it. `unreachable` decides by walking each path component as the
  kernel would for that uid and its groups (mode and owner, symlinks followed) in the agent's
  view: inside its fence, a directory the fence makes (a cover, a private tmpfs, a mount
  point's parent) has the mode `FencePlan.made` says and belongs to the supervisor, which runs
  bubblewrap, and what the fence does not bind back is not there; a component with a POSIX ACL
  is given the benefit of the doubt (only a certain refusal is reported).

The path rule reads mode bits; `--check` also asks the kernel, with a real probe of each group
of alike agents as their uid in their fence (reachprobe.py, which plans with `agent_fence`,
`own_uid` and `pump_needs` from here).

Must never: spawn a process of its own (`probe.probe`, which `for_agent` uses, has looked at the
machine once before: cli.py and `startup.open_ground` call it first), change anything on disk, or
take anything from an agent (it reads the fleet, this process's own paths, and stats of the
host's files).
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from mcphost.gate import Switch
from mcphost.settings import SettingError
from mcphost.supervisor.agents import signin
from mcphost.supervisor.agents.homes import AttachPoints, Home, agent_argv, agent_env, home_paths
from mcphost.supervisor.confine import fence as fences
from mcphost.supervisor.confine.kernel import Credentials, resolve_user, switch_of
from mcphost.supervisor.confine.probe import Support
from mcphost.supervisor.plan import (
    AgentPlan,
    Fleet,
    apply_defaults,
    raise_all,
    user_keys,
    wants_own_uid,
)
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
    support: Support | None = None,
    env: Mapping[str, str] | None = None,
    cgroups: tuple[str, ...] = (),
) -> fences.Fence | None:
    """The agent's fence (fence.py): its home and attach sockets visible, the state, the token
    and fleet files, the runtime directories, the cgroups but `cgroups` (the agent's own, read
    only) and every directory the operator's sign-in is read from in `env` (the supervisor's
    environment, default this process's: `signin.sources`, as `read_operator` reads it)
    hidden; the install tree of its program, found on the `PATH` it is spawned with, back
    read-only where the operator's home hides it (`fence.install_trees`, `vendor_trees`);
    None with `sandbox = "none"`. `home`: its layout (`home_paths` when not given).
    `check_sandbox` refused "auto" at load where it cannot be built; `check_users`, a user it
    cannot switch to."""
    if plan.sandbox == "none":
        return None
    state = os.path.abspath(state_dir)
    if home is None:
        home = home_paths(state, plan.agent_id, plan.client)
    attach = attach_points(state)
    switch = switch_of(resolve_user(plan.user, own_uid(fleet, plan)))
    supervisor_env = os.environ if env is None else env
    program = agent_argv(plan, home)[0]
    path = agent_env(supervisor_env, plan, home).get("PATH", os.defpath)
    return fences.for_agent(
        state_dir=state,
        home=home.root,
        workspace=home.workspace,
        sockets=tuple(s for s in (attach.center_socket, attach.relay_socket) if s),
        secrets=secrets(fleet),
        env=dict(plan.env),
        switch=switch,
        pump=attach.script,
        tmp_size=plan.tmp_size,
        support=support,
        reaches=None if switch is None else lambda folder: passes(folder, switch),
        signin=signin.sources(supervisor_env).directories(),
        cgroups=cgroups,
        programs=fences.install_trees(program, path, untrusted=agent_written(state, plan)),
        homes=fences.operator_homes(supervisor_env),
    )


def agent_written(state_dir: str, plan: AgentPlan) -> tuple[str, ...]:
    """Where fenced agents write on the host, so where the supervisor follows no link when it
    looks for an agent's program (`fence.install_trees`): the state directory (every home) and
    the agent's fleet-given `HOME`/`CLAUDE_CONFIG_DIR`. (A fenced agent's `/tmp` is its own
    tmpfs; a link another user plants in the host's `/tmp` is followed only where the
    operator's `PATH` or command points there, and then only to an executable regular file.)"""
    given = (dict(plan.env).get(k, "") for k in ("HOME", "CLAUDE_CONFIG_DIR"))
    return (os.path.abspath(state_dir), *(os.path.normpath(g) for g in given if os.path.isabs(g)))


def own_uid(fleet: Fleet, plan: AgentPlan) -> int | None:
    """The agent's own uid (`plan.uid`, once the reconciler gave it one); before that, for the
    load-time checks, the range's first: every uid of the range is in no group and owns nothing
    outside the homes, so each passes where the others do."""
    if plan.uid is not None or not wants_own_uid(plan):
        return plan.uid
    return fleet.uids.first


def passes(folder: str, switch: Switch) -> bool:
    """Can `switch`'s uid look up `folder` and everything beneath it (on the host's tree)?"""
    gids = frozenset((switch.gid, *switch.groups))
    return unreachable(folder, switch.uid, gids, SEARCH) is None


def program_problems(fleet: Fleet, state_dir: str, env: Mapping[str, str]) -> list[str]:
    """One line per fenced agent with a `command` that will not find its program inside its
    fence (`env`: the supervisor's environment, which the agent's is made from): the key that
    gives the command, the agent, and `fence.resolve`'s words (the program, the agent's PATH,
    what the fence hides of it). An agent without a `command` runs its client's program
    (`agent_argv`): it is named (by its `client` key) only when the host has that program and
    the fence hides it (Claude Code's old local install in `~/.claude/local`, a sign-in
    directory); a client not installed at all is the spawn's to name."""
    lines = []
    for index, plan in enumerate(fleet.agents):
        if plan.sandbox == "none":
            continue
        home = home_paths(state_dir, plan.agent_id, plan.client)
        program = agent_argv(plan, home)[0]
        path = agent_env(env, plan, home).get("PATH", os.defpath)
        if plan.command is None:
            if not fences.install_trees(program, path, depth=0):  # not there: the spawn's
                continue
            own = plan.client != fleet.defaults.client
            key = f"agent[{index}].client" if own else "defaults.client"
        else:
            own = plan.command != fleet.defaults.command
            key = f"agent[{index}].command" if own else "defaults.command"
        fence = agent_fence(fleet, state_dir, plan, home, env=env)
        assert fence is not None
        try:
            fences.resolve(fence.plan, program, path)
        except FileNotFoundError as exc:
            lines.append(
                f"{key} ({plan.agent_id}): {exc.strerror}: install it where the fence shows "
                f"it (not under {', '.join(fences.PRIVATE)}, /run or the state directory) or "
                f"name it by a path the agent can see{_one_line_fix(program, path)}"
            )
        for position, argument, cover in fences.hidden_arguments(
            fence.plan, agent_argv(plan, home)
        ):
            lines.append(
                f"{key} ({plan.agent_id}): {ARGUMENT_HIDDEN}: argument {position} {argument} "
                f"is hidden by the fence (under {cover}, {_what_hides(cover, fleet, state_dir)}"
                "), so the agent cannot open it: move it where the agent can see it (outside "
                "that directory, /tmp, /run and the operator's home, e.g. under /opt or /srv "
                "in a directory of its own) and name it there"
            )
    return lines


def _one_line_fix(program: str, path: str) -> str:
    """For a program the host has where the fence will not bring it back (in a sign-in
    directory, beside a secret, under /tmp): the one command that puts it where every agent
    sees it, as the end of `program_problems`' line ("" when the host has it nowhere)."""
    trees = fences.install_trees(program, path, depth=0)
    if not trees:
        return ""
    tree = trees[0]
    if os.path.isdir(tree) and "/node_modules/" in tree:  # an npm package: the global install
        package = tree.split("/node_modules/", 1)[1]
        return f"; e.g. as root: npm install -g {package} (it goes to /usr/local)"
    name = os.path.basename(program)
    return f"; e.g. as root: install -m 0755 {tree} /usr/local/bin/{name}"


ARGUMENT_HIDDEN = "argument_hidden_by_fence"  # --check's code for an argument the fence hides


def _what_hides(cover: str, fleet: Fleet, state_dir: str) -> str:
    """What the fence's `cover` is, for the operator: the directory of which secret, the state
    directory, the operator's home, a runtime or private directory."""
    center = fleet.center
    named = [
        (fleet.path, "the fleet file's directory"),
        (center.token_file, "the token file's directory"),
        (center.runtime_socket, "the center's runtime socket's directory"),
        (center.admin_url.path if center.admin_url.kind == "unix" else None, ""),
    ]
    found = [
        what or "the unix: admin socket's directory"
        for path, what in named
        if path and os.path.dirname(os.path.abspath(path)) == cover
    ]
    if found:
        return " and ".join(dict.fromkeys(found)) + ", which no agent sees"
    if cover in fences.PRIVATE:
        return "each agent has a private, empty one"
    if fences.beneath(cover, os.path.abspath(state_dir)):
        return "the supervisor's state directory, which no agent sees"
    return "a directory no agent sees (the operator's home and sign-in, /run, the cgroups)"


# -- what a user can reach --------------------------------------------------------------------

READ, SEARCH = 4, 1  # permission bits of one class (SEARCH: execute, for a file)
_VERB = {READ: "readable", SEARCH: "searchable"}
MAX_LINKS = 40  # the kernel's bound on symlinks followed in one lookup


@dataclass(frozen=True, slots=True)
class Blocked:
    """Where a path lookup stops for a user, and why (one phrase)."""

    path: str
    why: str

    def __str__(self) -> str:
        return f"{self.path} {self.why}"


def _refuses(path: str, uid: int, gids: frozenset[int], need: int) -> str | None:
    """Why the kernel would refuse `need` on `path` to `uid`/`gids` (None: it would allow it,
    or that cannot be told here: a POSIX ACL, a failing stat)."""
    if uid == 0:
        return None
    try:
        info = os.stat(path)
    except OSError:
        return None
    if _has_acl(path):
        return None
    directory = stat.S_ISDIR(info.st_mode)
    return _denies(info.st_mode, info.st_uid, info.st_gid, uid, gids, need, directory)


def _denies(
    mode: int,
    owner: int,
    group: int,
    uid: int,
    gids: frozenset[int],
    need: int,
    directory: bool = True,
) -> str | None:
    """Why the permission bits `mode` of a file of `owner`:`group` refuse `need` to `uid`
    (not 0) with `gids`: the owner's class, else the group's, else the others' decides."""
    shift = 6 if owner == uid else 3 if group in gids else 0
    if (mode >> shift) & need == need:
        return None
    verb = "executable" if need == SEARCH and not directory else _VERB[need]
    return f"(mode {stat.S_IMODE(mode):04o}, owner uid {owner}) is not {verb} by uid {uid}"


def _has_acl(path: str) -> bool:
    try:
        os.getxattr(path, "system.posix_acl_access")
    except OSError:
        return False
    return True


def unreachable(
    path: str,
    uid: int,
    gids: frozenset[int],
    need: int,
    view: fences.FencePlan | None = None,
) -> Blocked | None:
    """Where looking up `path` (absolute) and then `need` (READ or SEARCH) on it stops for
    `uid` with `gids`, as its process sees the tree (`view`: its fence; None: the host's);
    None when nothing certainly stops it."""
    pending = [part for part in path.split("/") if part]
    current, links = "/", 0

    def refused(where: str, want: int) -> Blocked | None:
        made = view.made(where) if view is not None else None
        if made is None:
            why = _refuses(where, uid, gids, want)
        else:  # bubblewrap's own directory, owned by the supervisor that runs it
            why = _denies(made, os.geteuid(), os.getegid(), uid, gids, want)
            why = why and f"(made by the fence, {why[1:]}"
        return None if why is None else Blocked(where, why)

    while pending:
        name = pending.pop(0)
        if name == ".":
            continue
        stop = refused(current, SEARCH)
        if stop is not None:
            return stop
        if name == "..":
            current = os.path.dirname(current)
            continue
        step = os.path.join(current, name)
        if view is not None and view.made(step) is not None:
            current = step
            continue
        if view is not None and view.hidden_by(step) is not None:
            return Blocked(step, f"is hidden by the fence (under {view.hidden_by(step)})")
        try:
            info = os.lstat(step)
        except FileNotFoundError:
            return Blocked(step, "does not exist")
        except OSError:
            return None
        if stat.S_ISLNK(info.st_mode):
            links += 1
            if links > MAX_LINKS:
                return None
            target = os.readlink(step)
            if target.startswith("/"):
                current = "/"
            pending[:0] = [part for part in target.split("/") if part]
            continue
        current = step
    return refused(current, need)


Need = tuple[str, str, int]  # (what it is, for the operator; its path; READ or SEARCH)


def pump_needs(state_dir: str, fenced: bool) -> tuple[Need, ...]:
    """What an attach entry needs of its agent's user: run the supervisor's interpreter, read
    its standard library and the pump, and reach the attach sockets' directory: inside a fence
    `<state>/run` as the fence shows it; outside, the state directory's parent (the supervisor
    makes `<state>` and `run/` passable itself, 0711)."""
    import sysconfig

    state = os.path.abspath(state_dir)
    attach = attach_points(state)
    stdlib = os.path.join(sysconfig.get_paths()["stdlib"], "os.py")
    sockets = os.path.dirname(attach.center_socket) if fenced else os.path.dirname(state)
    return (
        (f"the supervisor's interpreter {attach.interpreter}", attach.interpreter, SEARCH),
        (f"its standard library {os.path.dirname(stdlib)}", stdlib, READ),
        (f"the pump {attach.script}", attach.script, READ),
        (f"the attach sockets under {state}", sockets, SEARCH),
    )


def _switched(fleet: Fleet) -> list[tuple[str, str, str, Credentials, tuple[AgentPlan, ...]]]:
    """Each set of agents that run as another uid than ours: (key, value shown, who they run
    as, their credentials, the agents), one per `user` key (`user_keys`) and one for the
    agents that run as uids of their own (`[identity] uids`, represented by the range's first:
    `own_uid`)."""
    found = []
    for key, user, plans in user_keys(fleet):
        creds = resolve_user(user)  # check_users: it exists, and we may switch to it
        if creds is not None and creds.uid != 0:
            found.append((key, repr(user), f"uid {creds.uid}", creds, plans))
    own = tuple(plan for plan in fleet.agents if wants_own_uid(plan))
    if own or (
        fleet.center.fleet == "center" and fleet.defaults.user is None and os.geteuid() == 0
    ):
        creds = Credentials(None, fleet.uids.first, fleet.uids.first, ())
        who = f"uids of their own, from {fleet.uids}"
        found.append(("identity.uids", repr(str(fleet.uids)), who, creds, own))
    return found


def check_reach(
    fleet: Fleet,
    state_dir: str,
    needs: Callable[[str, bool], tuple[Need, ...]] = pump_needs,
) -> None:
    """Refuse agents of another uid (`user =`, or their own) that cannot start their attach
    entries (`needs(state_dir, fenced)`; see the module docstring): one `SettingError` per key,
    naming the agents, the uid and the path that stops it."""
    state = os.path.abspath(state_dir)
    problems = []
    needed: dict[bool, tuple[Need, ...]] = {}  # the same for every agent: asked once per kind
    for key, shown, who, creds, plans in _switched(fleet):
        gids = frozenset((creds.gid, *creds.groups))
        agents = plans or (apply_defaults(fleet.defaults, "any-agent"),)
        stops: dict[str, list[str]] = {}
        stopped: list[str] = []  # the agents it stops (a fenced one may pass where others do not)
        for plan in agents:
            fence = agent_fence(fleet, state, plan)
            view = fence.plan if fence is not None else None
            fenced = view is not None
            if fenced not in needed:
                needed[fenced] = needs(state, fenced)
            for what, path, need in needed[fenced]:
                stop = unreachable(path, creds.uid, gids, need, view)
                if stop is None:
                    continue
                if plan.agent_id not in stopped:
                    stopped.append(plan.agent_id)
                if what not in stops.setdefault(str(stop), []):
                    stops[str(stop)].append(what)
        if not stops:
            continue
        names = ", ".join(stopped) if plans else "every agent the center assigns"
        where = "; ".join(f"{stop}, on the way to {', '.join(w)}" for stop, w in stops.items())
        expected = (
            "a user who can run the supervisor's interpreter, read the pump and pass the "
            "state directory's parent: install mcphost and keep the state where that user "
            "can (e.g. a virtualenv under /opt, not in a private directory such as /root), "
            "or give that user access"
        )
        if creds.user is None:
            expected += (
                '; or fence these agents (sandbox = "auto": the fence brings the supervisor\'s '
                'own programs back), or run them as root (user = "root")'
            )
        if any("(made by the fence" in stop for stop in stops):
            expected += (
                "; a directory the fence makes (bubblewrap, run as root, creates it "
                f"{fences.MOUNT_PARENT_MODE:04o}) lets no switched user through, so such an "
                'agent needs sandbox = "none" until the fence gives it passable directories'
            )
        problems.append(
            SettingError(
                f"{fleet.path}: {key}",
                shown,
                expected,
                problem=f"is {shown} ({who}; agents: {names}), who cannot start the attach "
                f"entries of their MCP clients: {where}",
            )
        )
    raise_all(problems)
