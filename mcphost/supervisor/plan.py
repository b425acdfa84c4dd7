"""The plan the supervisor runs from: a frozen `Fleet` of `AgentPlan`s, every default applied.

Owns: the plan types every other module of the supervisor imports (`CenterConfig`, `AgentDefaults`,
`AgentPlan`, `Fleet`; frozen dataclasses; a single value's type, a listen address or a size, is
`mcphost.supervisor.values`'s), how a plan is made from the defaults and an agent's own values
(`apply_defaults`), the runner an agent gets (`resolve_runner`) and the combinations that cannot
work (`runner_problem`), the rules every plan keeps wherever it came from (the bundle-name bound
`is_fleet_bundle`, the variables the supervisor owns `RESERVED_ENV_PREFIXES`), the plans of the
agents the center assigns (`plan_from_center`, `fleet_with_agents`), and the checks of a whole
fleet against this machine (`check_sandbox`, `check_users`). The fleet file and its loader are
`mcphost.supervisor.fleet`, above this module: it reads the file, then builds its `Fleet` here.

- `runner`: `"auto"` (default), `"process"`, `"tmux"` or `"acp"`, resolved in the plan
  (`resolve_runner`) to one of the last three: `auto` is `tmux` for an interactive client (`claude`, `codex`)
  without a `command` (its default command is the interactive program, which needs a
  terminal), else `process`. A tmux agent runs as one session of its bundle's tmux server
  (hosted by the supervisor as the bundle's relay), or of a tmux server of its own without a
  bundle; a pane's gate becomes the agent's user, its own uid or `user`'s, before it runs
  anything (mcphost/gate.py, `main`), though the tmux server runs as the supervisor's; `process`
  refuses an interactive client without a `command` (stdin would be /dev/null: the client
  exits at once). `acp` runs the agent as an Agent Client Protocol agent on stdio (its command,
  or for `claude` / `codex` their ACP adapters), driven by its bundle's relay (agents/acp.py);
  it needs a bundle. `policy`: the relay policy id of the agent's bundle member (None: the
  policies file's default, else the built-in).
- `sandbox`: `"auto"` (default: the fence of fence.py) or `"none"` (opt out). `check_sandbox`
  refuses `"auto"` at load where this machine cannot build the fence (fail closed).
- With `[center] fleet = "center"` the center assigns the agents: each is planned from
  `[defaults]` alone (`plan_from_center`), its id held to the agent-id grammar and a bundle the
  center names to the fleet's bundle grammar.

Equality is the reload contract: loading an unchanged file gives equal `Fleet`s, and an
`AgentPlan` compares equal exactly when nothing about how its agent runs changed. Of a changed
plan, only the fields outside the ones the fleet model declares live (`fleet.IN_PLACE`, given to
`needs_restart`) need a restart: the restart policy, its timings, `stop_grace` and the log limits
are the runner's to apply to the running agent.

`check_users` is the one check outside the file: every `user` must exist in this machine's user
database, and be the supervisor's own or the supervisor must run as root (it switches in the
child; refuse at load, not at spawn). `mcphost supervise` calls it at start, reload before
applying anything. `user_uid` is the uid an agent runs as (that database again).

Must never: import the fleet file's loader (`mcphost.supervisor.fleet`: the loader builds
plans, never the reverse), read a file or `os.environ`,
or show a token (a plan holds the token file's path, never its content). `check_users` and
`user_uid` are the only readers of the user database.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from mcphost.admin.target import AdminTarget
from mcphost.names import (
    AGENT_ID_EXPECTED,
    SESSION_ID_EXPECTED,
    is_agent_id,
    is_bundle_name,
    is_session_id,
)
from mcphost.settings import SettingError
from mcphost.supervisor.uids import DEFAULT_RANGE, UidRange
from mcphost.supervisor.values import Listen

Client = Literal["claude", "codex", "command"]
Runner = Literal["auto", "process", "tmux", "acp"]
INTERACTIVE: tuple[Client, ...] = ("claude", "codex")  # their default command needs a terminal
Restart = Literal["always", "on-failure", "never"]
Sandbox = Literal["auto", "none"]  # the fence (fence.py): on by default, "none" opts out
# How an agent's client reaches its two surfaces: "pump" (a stdio entry running the attach pump,
# one process per session) or "http" (MCP's streamable HTTP on the supervisor's loopback
# listener, serving/streamable.py: no process; only for an agent with a uid of its own)
Transport = Literal["pump", "http"]
FleetSource = Literal["file", "center"]

RESERVED_ENV_PREFIXES = ("AC_MCP_", "MCPHOST_", "AGENTMUX_")

# A bundle name is a directory (`<state>/relay/bundles/<b>/`), a file (`config/bundles/<b>.toml`
# and its `.<b>.toml.tmp`: NAME_MAX is 255 bytes) and the namespace of a relay principal
# `<session>@<b>` (at most 256 characters, the session up to 31); agent ids are capped at 128
# by their grammar (mcphost.names), and bundle names are held to the same. The sockets under a
# bundle's directory need no bound of their own: tmux.py passes `tmux.sock` relative when the
# absolute path exceeds `sun_path`.
BUNDLE_NAME_MAX = 128
BUNDLE_EXPECTED = (
    f"a bundle name of letters, digits, '.', '_' and '-' (not '.' or '..'), at most "
    f"{BUNDLE_NAME_MAX} characters"
)


def is_fleet_bundle(name: str) -> bool:
    """A bundle name the supervisor can host: agentmux's grammar, at most `BUNDLE_NAME_MAX`."""
    return is_bundle_name(name) and len(name) <= BUNDLE_NAME_MAX


def clipped(value: str, keep: int = 60) -> str:
    """`repr(value)`, the first `keep` characters only (with the length) when it is longer."""
    if len(value) <= keep:
        return repr(value)
    return f"{value[:keep]!r}... ({len(value)} characters)"


def raise_all(problems: list[SettingError]) -> None:
    """Raise the first problem holding all of them (nothing when there are none)."""
    first = SettingError.gather(problems)
    if first is not None:
        raise first


# -- the values the supervisor uses --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CenterConfig:
    """The worker's one binding to the center. `token_file` is a path, never its content."""

    admin_url: AdminTarget
    pins: tuple[bytes, ...]
    token_file: str
    runtime_socket: str | None = None
    fleet: FleetSource = "file"
    poll_seconds: float = 30.0


@dataclass(frozen=True, slots=True)
class AgentDefaults:
    """`[defaults]` with the built-in defaults applied (`tier_tools=None`: the client's)."""

    client: Client = "claude"
    restart: Restart = "on-failure"
    tier_tools: bool | None = None
    command: tuple[str, ...] | None = None
    bundle: str | None = None
    user: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    restart_delay: float = 1.0
    restart_max_delay: float = 60.0
    max_restarts: int = 5
    restart_window: float = 60.0
    stop_grace: float = 10.0
    log_max_bytes: int = 1 << 20
    log_keep: int = 3
    runner: Runner = "auto"
    policy: str | None = None
    sandbox: Sandbox = "auto"
    tmp_size: int = 256 << 20  # bytes of each private tmpfs of a fenced agent (fence.py)
    # the agent's cgroup (cgroups.py): None is the documented default, "max" no limit
    memory_max: int | str | None = None
    pids_max: int | str | None = None
    cpu_weight: int | None = None
    mcp_transport: Transport = "pump"


@dataclass(frozen=True, slots=True)
class AgentPlan:
    """How one agent runs, every default applied. Equal plans: nothing to restart."""

    agent_id: str
    command: tuple[str, ...] | None
    client: Client
    restart: Restart
    tier_tools: bool
    bundle: str | None
    user: str | None
    env: tuple[tuple[str, str], ...]
    restart_delay: float
    restart_max_delay: float
    max_restarts: int
    restart_window: float
    stop_grace: float
    log_max_bytes: int
    log_keep: int
    runner: Runner = "process"  # resolved (`resolve_runner`): "process", "tmux" (a pane), "acp"
    policy: str | None = None  # the relay policy of the agent's bundle member
    sandbox: Sandbox = "auto"  # "auto": fenced (fence.py); "none": not
    tmp_size: int = 256 << 20  # bytes of each private tmpfs (/tmp, /var/tmp, /dev/shm) when fenced
    memory_max: int | str | None = None  # the agent's cgroup limits (cgroups.py); None: default
    pids_max: int | str | None = None
    cpu_weight: int | None = None
    mcp_transport: Transport = "pump"  # its attach entries: the pump, or HTTP (`Transport`)
    # the agent's own uid (and gid) from `[identity] uids` (uids.py), given by the reconciler to
    # every agent that wants one (`wants_own_uid`); None: `user`'s uid, or the supervisor's
    uid: int | None = None


def needs_restart(old: AgentPlan, new: AgentPlan, in_place: frozenset[str]) -> bool:
    """Does going from `old` to `new` change how the agent runs (a field outside `in_place`:
    the keys the fleet model declares a running agent's runner applies, `fleet.IN_PLACE`)?"""
    return any(
        getattr(old, field.name) != getattr(new, field.name)
        for field in dataclasses.fields(AgentPlan)
        if field.name not in in_place
    )


@dataclass(frozen=True, slots=True)
class Fleet:
    """The fleet in force. `agents` are in file order; equality is the reload contract.
    `page`, `metrics`: where the fleet page and `/metrics` listen (None: off, the default;
    a reload moves, opens or closes either)."""

    path: str
    center: CenterConfig
    agents: tuple[AgentPlan, ...]
    defaults: AgentDefaults = AgentDefaults()
    page: Listen | None = None
    metrics: Listen | None = None
    uids: UidRange = DEFAULT_RANGE  # `[identity] uids`: the agents' own uids (uids.py)


def _tier_default(client: Client) -> bool:
    """configgen's per-client default (Claude Code and Codex: the full catalog); `command`
    agents get the host's default (tiered)."""
    if client == "command":
        return True
    from configgen.clients import CLIENTS

    return CLIENTS[client].tier_tools_default


def apply_defaults(
    defaults: AgentDefaults, agent_id: str, overrides: Mapping[str, Any] | None = None
) -> AgentPlan:
    """The plan of `agent_id`: `defaults` with the agent's own values (`overrides`: the keys
    its table gives; None is not given, `env` merges over the default's) applied on top."""
    values: dict[str, Any] = {
        field.name: getattr(defaults, field.name) for field in dataclasses.fields(AgentDefaults)
    }
    for key, value in (overrides or {}).items():
        if key == "env" and value is not None:
            merged = dict(defaults.env)
            merged.update(value)
            value = tuple(sorted(merged.items()))
        if key in values and value is not None:
            values[key] = value
    if values["tier_tools"] is None:
        values["tier_tools"] = _tier_default(values["client"])
    values["runner"] = resolve_runner(values["runner"], values["client"], values["command"])
    return AgentPlan(agent_id=agent_id, **values)


def resolve_runner(runner: Runner, client: Client, command: tuple[str, ...] | None) -> Runner:
    """`auto` -> `tmux` for an interactive client without a command (its default command is
    the interactive program, which needs a terminal), else `process`; others as given."""
    if runner != "auto":
        return runner
    return "tmux" if client in INTERACTIVE and command is None else "process"


def runner_problem(plan: AgentPlan, requested: Runner) -> tuple[str, str, str] | None:
    """The runner combination that cannot work, as (key, value shown, expected), or None; the
    key is `runner` when it was set to the runner that cannot work, else the other key."""
    if plan.runner == "process" and plan.client in INTERACTIVE and plan.command is None:
        return (
            "runner",
            repr(plan.runner),
            f'runner = "auto" or "tmux" for client = "{plan.client}" without a command (its '
            "default command is the interactive program, which needs a terminal; a process "
            "agent's stdin is /dev/null), or a command that needs no terminal",
        )
    if plan.runner == "acp" and plan.bundle is None:
        return (
            "runner",
            repr(requested),
            'a bundle for an ACP agent (runner = "acp": it takes its work as prompt turns from '
            "its bundle's relay, so without one nothing could ever reach it); give it "
            'bundle = "...", or runner = "auto"',
        )
    return None


def plan_from_center(
    defaults: AgentDefaults, agent_id: str, *, bundle: str | None = None
) -> AgentPlan:
    """The plan of an agent the center assigned to this worker: `[defaults]` only (a `bundle`
    the center names replaces the default one). Raises `SettingError` for an id outside the
    grammar, naming it as the center's."""
    if not isinstance(agent_id, str) or not is_agent_id(agent_id):
        raise SettingError("the center's agent id", repr(agent_id), AGENT_ID_EXPECTED)
    if bundle is not None and (not isinstance(bundle, str) or not is_fleet_bundle(bundle)):
        shown = clipped(bundle) if isinstance(bundle, str) else repr(bundle)
        raise SettingError(f"the center's bundle for {agent_id}", shown, BUNDLE_EXPECTED)
    plan = apply_defaults(defaults, agent_id)
    if bundle is not None:
        plan = dataclasses.replace(plan, bundle=bundle)
    if plan.bundle is not None and not is_session_id(agent_id):
        raise SettingError(
            "the center's agent id",
            repr(agent_id),
            f"with a bundle, a relay session id: {SESSION_ID_EXPECTED}",
        )
    if plan.client == "command" and plan.command is None:
        raise SettingError(
            "defaults.command", None, 'a command: client = "command" runs exactly the command'
        )
    problem = runner_problem(plan, defaults.runner)
    if problem is not None:
        key, shown, expected = problem
        raise SettingError(f"defaults.{key}", shown, f"for agent {agent_id}: {expected}")
    return plan


def fleet_with_agents(fleet: Fleet, assigned: Iterable[str | Mapping[str, Any]]) -> Fleet:
    """`fleet` with the agents the center assigned (ids, or mappings with `agent_id` and an
    optional `bundle`), each planned from `fleet.defaults`; duplicates after the first dropped.
    Raises `SettingError` for a bad entry (then nothing is applied)."""
    plans: dict[str, AgentPlan] = {}
    for entry in assigned:
        if isinstance(entry, Mapping):
            agent_id = entry.get("agent_id", entry.get("id"))
            bundle = entry.get("bundle")
        else:
            agent_id, bundle = entry, None
        plan = plan_from_center(fleet.defaults, agent_id, bundle=bundle)
        plans.setdefault(plan.agent_id, plan)
    return dataclasses.replace(fleet, agents=tuple(plans.values()))


def check_sandbox(fleet: Fleet, missing: str | None) -> None:
    """Refuse `sandbox = "auto"` (the default) where the fence cannot be built: `missing` is
    what this machine lacks (confine/probe.py `Support.missing()`), None when nothing is. Fails closed with
    one `SettingError` per key that asks for the fence (`defaults.sandbox` when the agent has
    the default's)."""
    if missing is None:
        return
    keys: list[str] = []
    if fleet.defaults.sandbox == "auto" and (
        fleet.center.fleet == "center" or any(a.sandbox == "auto" for a in fleet.agents)
    ):
        keys.append("defaults.sandbox")
    if fleet.defaults.sandbox != "auto":
        keys.extend(
            f"agent[{index}].sandbox"
            for index, plan in enumerate(fleet.agents)
            if plan.sandbox == "auto"
        )
    raise_all(
        [
            SettingError(
                f"{fleet.path}: {key}",
                '"auto"',
                'sandbox = "none" to run agents unfenced on this machine',
                problem=f'is "auto" (the default), but this machine lacks {missing}',
            )
            for key in keys
        ]
    )


def user_keys(fleet: Fleet) -> list[tuple[str, str, tuple[AgentPlan, ...]]]:
    """Each `user` the fleet names, by the key that names it (`defaults.user` for the agents
    that have the default's, and for every agent a center assigns; else `agent[i].user`), with
    the file's agents that run as it (none yet for a center's fleet)."""
    keys: list[tuple[str, str, tuple[AgentPlan, ...]]] = []
    default = fleet.defaults.user
    if default is not None:
        agents = tuple(a for a in fleet.agents if a.user == default)
        if fleet.center.fleet == "center" or agents:
            keys.append(("defaults.user", default, agents))
    for index, plan in enumerate(fleet.agents):
        if plan.user is not None and plan.user != default:
            keys.append((f"agent[{index}].user", plan.user, (plan,)))
    return keys


def check_users(fleet: Fleet) -> None:
    """Refuse a `user` the supervisor could not run an agent as: no such user, or another uid
    while the supervisor is not root. Raises one `SettingError` naming each key (`agent[2].user`,
    or `defaults.user` when the agent has the default's)."""
    import pwd

    problems: list[SettingError] = []
    path = fleet.path
    for key, user, _ in user_keys(fleet):
        name = f"{path}: {key}"
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            problems.append(
                SettingError(
                    name,
                    repr(user),
                    "an existing user name",
                    problem=f"is {user!r}: no such user on this machine",
                )
            )
            continue
        same = entry.pw_uid == os.geteuid() and entry.pw_gid == os.getegid()
        if not same and os.geteuid() != 0:
            problems.append(
                SettingError(
                    name,
                    repr(user),
                    "no user = ... unless the supervisor runs as root (it switches the agent to "
                    "that user when it spawns it)",
                    problem=f"is {user!r} (uid {entry.pw_uid}), but the supervisor runs as uid "
                    f"{os.geteuid()}, not root",
                )
            )
    if any(wants_own_uid(plan) for plan in fleet.agents) or fleet.center.fleet == "center":
        from mcphost.supervisor.uids import RANGE_EXPECTED, users_in_range

        clash = users_in_range(fleet.uids) if os.geteuid() == 0 else []
        if clash:
            problems.append(
                SettingError(
                    f"{path}: identity.uids",
                    repr(str(fleet.uids)),
                    RANGE_EXPECTED,
                    problem=f"is {str(fleet.uids)!r}, which holds " + ", ".join(clash[:3]),
                )
            )
    raise_all(problems)


def user_uid(user: str | None) -> int:
    """The uid an agent with `user` runs as: that user's, or the supervisor's own."""
    if user is None:
        return os.getuid()
    import pwd

    return pwd.getpwnam(user).pw_uid


def wants_own_uid(plan: AgentPlan) -> bool:
    """Does the agent run as a uid of its own from `[identity] uids` (uids.py)? Every agent of
    a root supervisor that names no `user` does; `user = "root"` is the only way to run one as
    uid 0. An unprivileged supervisor's agents share its uid (it cannot switch)."""
    return plan.user is None and os.geteuid() == 0


def agent_uid(plan: AgentPlan) -> int:
    """The uid the agent runs as: its own (`plan.uid`), its `user`'s, or the supervisor's."""
    return plan.uid if plan.uid is not None else user_uid(plan.user)


def identity_lines(fleet: Fleet) -> list[str]:
    """`--check`'s lines on whom the agents run as: their own uids (a root supervisor's), a
    warning for each agent that runs as root (`user = "root"`), or the uid they share (an
    unprivileged supervisor's)."""
    own = [plan.agent_id for plan in fleet.agents if wants_own_uid(plan)]
    lines = []
    if os.geteuid() != 0:
        lines.append(
            f"identity: the agents share the supervisor's uid {os.geteuid()} (uids of their own "
            "need a root supervisor; subordinate uids from /etc/subuid are not used yet): only "
            "the fence stands between them, and `ctl status` shows FENCE ... (shared uid)"
        )
    elif own or fleet.center.fleet == "center":
        lines.append(
            f"identity: {len(own)} agent(s) run as uids of their own from [identity] uids = "
            f"{str(fleet.uids)!r} (no user of this machine; kept per agent in the state): the "
            "kernel's permissions stand between them and behind the fence"
        )
    for index, plan in enumerate(fleet.agents):
        if plan.user is not None and user_uid(plan.user) == 0:
            key = "defaults.user" if plan.user == fleet.defaults.user else f"agent[{index}].user"
            lines.append(
                f"identity: warning: {key} ({plan.agent_id}) runs it as root, uid 0 outside its "
                "fence (it may remount the cgroups and shed its limits, read root-only files): "
                "remove `user` to give it a uid of its own"
            )
    return lines


def runs_apart(plan: AgentPlan) -> bool:
    """Does the agent run as another uid than the supervisor's (so the state directory and
    the attach sockets must let it pass: startup.py, supervisor.py)?"""
    return wants_own_uid(plan) or (plan.user is not None and user_uid(plan.user) != os.geteuid())
