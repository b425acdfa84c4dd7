"""Per-agent homes: `<state>/agents/<id>/` with its workspace and the client's MCP config of
*attach* entries, the agent's log directory `<state>/logs/<id>/` (outside the home); the
workspace held open for the supervisor's file tools (`HeldWorkspace`); and the argv and environment an agent is spawned with
(`agent_argv`: the plan's command with `{mcp_config}`, `{workspace}`, `{home}`, `{agent_id}`
expanded from the home, else the client's default command).

Owns:
- the layout (`home_paths`, pure): `<state>/agents/<id>/` (0700), `workspace/` (0700; the
  agent's cwd and `AC_MCP_AGENT_ROOT`), and the config: `mcp.json` for `claude` and `command`
  agents, `codex/config.toml` for `codex` agents (`CODEX_HOME`); and the agent's logs,
  `<state>/logs/<id>/` (0700, the supervisor's: never inside a home, which the agent owns
  and could rearrange under the supervisor's log rotation).
- `prepare_home`: creates or repairs that layout and writes the config (configgen's attach
  entries: the interpreter, `-I -S`, the pump, the socket; or, for an agent whose plan says
  `mcp_transport = "http"`, HTTP entries naming the supervisor's loopback listener, its URL
  only; nothing else) atomically, 0600.
  Every directory is opened without following a symlink, beneath the one above it, and the
  config is written through that open directory (`/proc/self/fd/N/...`), so a symlink an agent
  plants in its own home never redirects a write, even when the supervisor runs as root. A
  symlink or a non-directory where a directory belongs is refused (`HomeError`); a directory of
  ours with a wider mode is narrowed to 0700; one owned by anybody else is refused. The relay
  entry is written only when the plan has a bundle and there is a relay socket.
- A codex agent whose `env` gives `OPENAI_BASE_URL`: the same address as `openai_base_url` at
  the top of its `config.toml` (Codex reads the setting, not the variable).
- A codex agent whose `env` gives `OPENAI_API_KEY`: `codex/auth.json` (0600, the agent's) as
  `codex login --with-api-key` writes it (`{"auth_mode": "apikey", "OPENAI_API_KEY": ...}`),
  rewritten at each preparation: Codex's TUI reads its sign-in from `CODEX_HOME`, not from the
  environment, and would otherwise stop at its sign-in screen. Only that key, only in that
  agent's own home; without one, the operator's sign-in (next point), else nothing is written
  (an `auth.json` already there, e.g. the agent's own sign-in, is left as it is).
- The sign-in of a default agent (signin.py says why and what): a fenced claude agent whose
  `env` gives neither `HOME` nor `CLAUDE_CONFIG_DIR` gets `<home>/.claude.json` (its own record,
  merged with onboarding done, its workspace trusted, its key approved, or the operator's
  sign-in keys) and, signed in as the operator, `<home>/.claude/.credentials.json`; a codex
  agent without `OPENAI_API_KEY` in its `env` gets a copy of the operator's `auth.json`. Each is
  written fresh at each preparation from the `Operator` the caller read (`signin.read_operator`,
  once per preparation of the fleet), 0600, the agent's, by descriptor like the config; the
  agent's own record is read beneath the home without following a symlink and bounded in size.
- Every claude and codex agent's own MCP servers (its attach entries) preapproved, so that an
  agent never stops at a permission prompt for them (a tmux agent runs unattended; an ACP
  agent's other questions, a command or a file write, wait for a peer's `choose`): a codex
  agent's entries carry `default_tools_approval_mode = "approve"` (configgen); a claude agent
  whose Claude Code keeps its config in its home (`signin.claude_home_is_its_own`) gets
  `mcp__<server>` for each in `permissions.allow` of `<home>/.claude/settings.json` (0600, by
  descriptor, merged into the agent's own settings as its `.claude.json` is), and the default
  `claude` command gives the same rules as `--allowedTools` (an unfenced agent's settings are
  the operator's own, never written). Never a bypass of either client's approvals or sandbox,
  and no rule for any other server or tool.
- With `plan.user` (another uid; the supervisor must be privileged): the home, its workspace,
  the codex and `.claude` directories, the config and the sign-in belong to that user (the
  agent writes there); the logs stay the supervisor's; `<state>/agents/` becomes 0711 so that
  user can reach its home (ids are not listable).
- `hold_home`: `prepare_home` keeping the workspace descriptor it opened (`HeldWorkspace`). The
  supervisor opens nothing in the workspace by path after that: each center session's file
  tools resolve beneath a dup of it, and every process started as the agent starts in it
  (`/proc/self/fd/N` as the spawn's cwd, which the kernel resolves to that very directory
  even in the child before the user switch). An agent that moves its workspace away and
  plants a symlink (or another directory) in its place only moves its own directory: the
  supervisor keeps serving the directory it created, wherever it now is, until the home is
  prepared again (a fleet change for that agent), which refuses the symlink (`HomeError`).
- `agent_env`: the supervisor's environment minus every `AC_MCP_*`, `MCPHOST_*` and
  `AGENTMUX_*` variable (identity, token and settings are the supervisor's) and minus systemd's
  per-service handles (`NOTIFY_SOCKET`, `LISTEN_*`, `WATCHDOG_*`), plus the plan's `env`, plus
  `CODEX_HOME` for codex agents; a fenced agent (fence.py) whose `env` gives no `HOME` gets its
  home as `HOME` (the fence lets it write only there and where its `env` points), and loses a
  `CLAUDE_CONFIG_DIR` inherited from the supervisor (the operator's own config, read-only
  behind the fence, with the operator's history) unless its `env` gives one.

Must never: write the token, the token file's path or the admin URL into a home or an agent's
environment (this module is never given them), follow a symlink inside a home, put a file of
the supervisor's (its logs) inside a home, write a config wider than 0600, or write a key the
fleet did not give that very agent or a sign-in signin.py did not select for it.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from configgen import AgentConfig, AttachBinding, ConfigError, HttpBinding, render, write_private
from configgen.clients import claude_permission_rules, dump_json
from mcphost.errors import CodedFailure
from mcphost.names import is_agent_id
from mcphost.supervisor.agents import signin
from mcphost.supervisor.agents.signin import Operator
from mcphost.supervisor.plan import RESERVED_ENV_PREFIXES, AgentPlan

AGENTS = "agents"
WORKSPACE = "workspace"
LOGS = "logs"
MCP_JSON = "mcp.json"
CODEX_DIR = "codex"
CODEX_CONFIG = "config.toml"
CODEX_AUTH = "auth.json"
CODEX_KEY_ENV = "OPENAI_API_KEY"
CODEX_BASE_URL_ENV = "OPENAI_BASE_URL"
CODEX_BASE_URL_KEY = "openai_base_url"  # Codex's own setting for the model API's address
# The ACP adapters a `runner = "acp"` agent of these clients runs by default (their npm
# packages' programs: @zed-industries/claude-code-acp and @zed-industries/codex-acp)
ACP_ADAPTERS = {"claude": "claude-code-acp", "codex": "codex-acp"}
# The clients told to run their own attach entries' tools without asking (a `command` agent's
# client is unknown: nothing to tell it)
APPROVING_CLIENTS = ("claude", "codex")
CLAUDE_SETTINGS = "settings.json"  # Claude Code's user settings, beneath `$HOME/.claude`
# systemd hands these to the service; an agent must not talk to systemd as the supervisor.
_SERVICE_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
_SERVICE_ENV_PREFIXES = ("LISTEN_",)


class HeldWorkspace:
    """An agent's workspace as the `O_DIRECTORY` descriptor `hold_home` opened (never through a
    symlink, beneath the home, beneath `<state>/agents`), held while the agent is in the fleet.

    Why the held directory and not a refusal once the path changed: it is the directory the
    supervisor created and gave the agent (the agent's own, checked when it was opened), so
    serving it wherever the agent moved it grants the agent nothing it does not already have,
    and everything beneath it is still walked with `O_NOFOLLOW`; a swap then only breaks the
    agent's own view of its workspace path, never the supervisor's."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path  # how it is shown (AC_MCP_AGENT_ROOT); never opened

    def dup(self) -> int:
        """A new descriptor of the same directory (not inherited by children), for one session."""
        return os.dup(self.fd)

    @property
    def cwd(self) -> str:
        """A path naming the held directory itself, in this process and in a child between
        fork and exec (the fd is inherited until exec): a spawn's `cwd`."""
        return f"/proc/self/fd/{self.fd}"

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class HomeError(CodedFailure):
    """A home that cannot be prepared safely; `str()` says which path and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__("home_unsafe", message)


@dataclass(frozen=True, slots=True)
class Home:
    """Where one agent lives. `mcp_config` is the file its client reads (`{mcp_config}`)."""

    root: str
    workspace: str
    logs: str
    mcp_config: str
    codex_home: str | None = None


@dataclass(frozen=True, slots=True)
class AttachPoints:
    """What attach entries run: `interpreter -I -S script <socket>` (absolute paths), or the
    HTTP listener they name (`http_base`)."""

    interpreter: str
    script: str
    center_socket: str
    relay_socket: str | None = None
    # the HTTP listener's base URL (`http://127.0.0.1:PORT/mcp/`, serving/streamable.py) while
    # it listens: an agent whose plan says `mcp_transport = "http"` gets `<base>center` and
    # `<base>relay` entries instead of the pump's
    http_base: str | None = None


def home_paths(state_dir: str, agent_id: str, client: str) -> Home:
    """The layout of `agent_id`'s home under `state_dir` (pure)."""
    if not is_agent_id(agent_id):
        raise HomeError(f"agent id {agent_id!r} is not a safe directory name")
    state = os.path.abspath(state_dir)
    root = os.path.join(state, AGENTS, agent_id)
    if client == "codex":
        codex = os.path.join(root, CODEX_DIR)
        config = os.path.join(codex, CODEX_CONFIG)
    else:
        codex, config = None, os.path.join(root, MCP_JSON)
    return Home(
        root=root,
        workspace=os.path.join(root, WORKSPACE),
        logs=os.path.join(state, LOGS, agent_id),
        mcp_config=config,
        codex_home=codex,
    )


def attach_config(plan: AgentPlan, attach: AttachPoints) -> AgentConfig:
    """The configgen input for `plan`: attach entries only, preapproved for a claude or codex
    agent (its own tools; every other question of its still asks) (pure)."""
    if plan.mcp_transport == "http":
        if attach.http_base is None:
            raise HomeError("mcp_transport is http but the supervisor's HTTP listener is not up")
        return AgentConfig(
            center=HttpBinding(attach.http_base + "center"),
            relay=HttpBinding(attach.http_base + "relay") if plan.bundle is not None else None,
            approve_attach_tools=plan.client in APPROVING_CLIENTS,
        )
    relay = None
    if plan.bundle is not None and attach.relay_socket is not None:
        relay = AttachBinding(attach.relay_socket)
    return AgentConfig(
        center=AttachBinding(attach.center_socket),
        relay=relay,
        python=attach.interpreter,
        attach_script=attach.script,
        approve_attach_tools=plan.client in APPROVING_CLIENTS,
    )


def own_tool_rules(plan: AgentPlan) -> list[str]:
    """Claude Code's rules that preapprove every tool of `plan`'s own attach entries (the
    center's; the relay's when it is in a bundle) (pure)."""
    relay = AttachBinding("/") if plan.bundle is not None else None
    # the rules depend on the entries' names only
    names = AttachPoints(sys.executable, "/", "/", http_base="http://127.0.0.1:1/mcp/")
    return claude_permission_rules(dataclasses.replace(attach_config(plan, names), relay=relay))


def config_bytes(plan: AgentPlan, attach: AttachPoints) -> bytes:
    """The bytes of `plan`'s client config (pure): Codex TOML, else Claude's `mcpServers`.

    A codex agent whose `env` gives `OPENAI_BASE_URL` gets it as the config's top-level
    `openai_base_url` too: Codex (0.171) takes its model API's address only from that setting
    and ignores the variable, so without it the agent's `env` would silently not apply."""
    if plan.client != "codex":
        return render("claude", attach_config(plan, attach))
    servers = render("codex", attach_config(plan, attach))
    base_url = dict(plan.env).get(CODEX_BASE_URL_ENV)
    if not base_url:
        return servers
    import tomli_w

    return tomli_w.dumps({CODEX_BASE_URL_KEY: base_url}).encode() + b"\n" + servers


def prepare_home(
    state_dir: str, plan: AgentPlan, attach: AttachPoints, operator: Operator | None = None
) -> Home:
    """Create or repair `plan`'s home under `state_dir` and write its config and sign-in (from
    `operator`, the supervisor user's own; None: nobody signed in); see the module docstring.
    Idempotent. Raises `HomeError` (or `ConfigError` for bad attach points)."""
    home, workspace = hold_home(state_dir, plan, attach, operator)
    workspace.close()
    return home


def hold_home(
    state_dir: str, plan: AgentPlan, attach: AttachPoints, operator: Operator | None = None
) -> tuple[Home, HeldWorkspace]:
    """`prepare_home`, keeping the workspace it opened (the caller closes it)."""
    operator = operator or Operator()
    home = home_paths(state_dir, plan.agent_id, plan.client)
    data = config_bytes(plan, attach)
    owner = _owner(plan)
    try:
        state_fd = os.open(_state_of(home), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise HomeError(f"cannot open the state directory: {exc}") from None
    fds: list[int] = [state_fd]
    workspace = -1
    try:
        logs_fd = _directory(state_fd, LOGS, os.path.dirname(home.logs), None)
        fds.append(logs_fd)
        fds.append(_directory(logs_fd, plan.agent_id, home.logs, None))
        agents_fd = _directory(
            state_fd,
            AGENTS,
            os.path.dirname(home.root),
            None,
            mode=0o711 if owner is not None else 0o700,
            also=(0o711,),
        )
        fds.append(agents_fd)
        root_fd = _directory(agents_fd, plan.agent_id, home.root, owner, tree=True)
        fds.append(root_fd)
        workspace = _directory(root_fd, WORKSPACE, home.workspace, owner)
        if home.codex_home is not None:
            codex_fd = _directory(root_fd, CODEX_DIR, home.codex_home, owner)
            fds.append(codex_fd)
            _write(codex_fd, CODEX_CONFIG, home.mcp_config, data, owner)
            auth = signin.codex_auth(plan, operator)
            if auth is not None:
                shown = os.path.join(home.codex_home, CODEX_AUTH)
                _write(codex_fd, CODEX_AUTH, shown, auth, owner)
        else:
            _write(root_fd, MCP_JSON, home.mcp_config, data, owner)
            _claude_sign_in(root_fd, home, state_dir, plan, operator, owner)
            _claude_settings(root_fd, home, plan, attach, owner)
    except BaseException:
        if workspace >= 0:
            os.close(workspace)
        raise
    finally:
        for fd in reversed(fds):
            os.close(fd)
    return home, HeldWorkspace(workspace, home.workspace)


def codex_auth_bytes(plan: AgentPlan) -> bytes | None:
    """`auth.json` for a codex agent whose `env` gives `OPENAI_API_KEY` (pure), else None."""
    if not dict(plan.env).get(CODEX_KEY_ENV):
        return None
    return signin.codex_auth(plan, Operator())


def _claude_sign_in(
    root_fd: int,
    home: Home,
    state_dir: str,
    plan: AgentPlan,
    operator: Operator,
    owner: tuple[int, int] | None,
) -> None:
    """Write what signin.py selects for a claude agent: `.claude.json` (merged into the one its
    Claude Code wrote, read here beneath the home without following a symlink) and
    `.claude/.credentials.json`."""
    if signin.claude_source(plan, operator) is None:
        return
    real = os.path.join(
        os.path.realpath(state_dir), AGENTS, plan.agent_id, WORKSPACE
    )  # the supervisor's own path: never walks into the home
    trusted = tuple(dict.fromkeys((home.workspace, real)))
    own = _read_own(root_fd, signin.CLAUDE_RECORD)
    record, credentials = signin.claude_files(plan, operator, trusted, own)
    if credentials is not None:
        folder = os.path.join(home.root, signin.CLAUDE_DIR)
        claude_fd = _directory(root_fd, signin.CLAUDE_DIR, folder, owner)
        try:
            shown = os.path.join(folder, signin.CLAUDE_CREDENTIALS)
            _write(claude_fd, signin.CLAUDE_CREDENTIALS, shown, credentials, owner)
        finally:
            os.close(claude_fd)
    if record is not None:
        shown = os.path.join(home.root, signin.CLAUDE_RECORD)
        _write(root_fd, signin.CLAUDE_RECORD, shown, record, owner)


def claude_settings_bytes(own: bytes | None, rules: Sequence[str]) -> bytes:
    """Claude Code's user settings with each of `rules` in `permissions.allow` once, merged into
    the agent's own settings `own` (whatever else it holds stays; a document that is not a JSON
    object is replaced) (pure)."""
    settings = signin.parse_object(own) or {}
    permissions = settings.get("permissions")
    permissions = dict(permissions) if isinstance(permissions, dict) else {}
    allow = permissions.get("allow")
    allow = list(allow) if isinstance(allow, list) else []
    allow += [rule for rule in rules if rule not in allow]
    settings["permissions"] = {**permissions, "allow": allow}
    return dump_json(settings)


def _claude_settings(
    root_fd: int, home: Home, plan: AgentPlan, attach: AttachPoints, owner: tuple[int, int] | None
) -> None:
    """A claude agent whose Claude Code keeps its config in its home: its own MCP servers'
    tools preapproved in `<home>/.claude/settings.json` (`claude_settings_bytes`, merged into
    the agent's own file, read beneath the home without following a symlink)."""
    rules = claude_permission_rules(attach_config(plan, attach))
    if not rules or not signin.claude_home_is_its_own(plan):
        return
    folder = os.path.join(home.root, signin.CLAUDE_DIR)
    claude_fd = _directory(root_fd, signin.CLAUDE_DIR, folder, owner)
    try:
        own = _read_own(claude_fd, CLAUDE_SETTINGS)
        shown = os.path.join(folder, CLAUDE_SETTINGS)
        _write(claude_fd, CLAUDE_SETTINGS, shown, claude_settings_bytes(own, rules), owner)
    finally:
        os.close(claude_fd)


def _read_own(dir_fd: int, name: str) -> bytes | None:
    """The agent's own file `name` beneath `dir_fd`: a regular file of at most
    `signin.MAX_BYTES`, opened without following a symlink (or blocking on a FIFO); else None."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > signin.MAX_BYTES:
            return None
        chunks = []
        size = 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > signin.MAX_BYTES:
                return None
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _state_of(home: Home) -> str:
    return os.path.dirname(os.path.dirname(home.root))


def agent_env(base: Mapping[str, str], plan: AgentPlan, home: Home) -> dict[str, str]:
    """The environment to spawn `plan`'s agent with (pure); see the module docstring."""
    env = {
        key: value
        for key, value in base.items()
        if not key.startswith(RESERVED_ENV_PREFIXES)
        and key not in _SERVICE_ENV
        and not key.startswith(_SERVICE_ENV_PREFIXES)
    }
    env.update(plan.env)
    given = dict(plan.env)
    if plan.sandbox != "none" and "HOME" not in given:
        env["HOME"] = home.root  # behind the fence the supervisor's HOME is read-only
        if "CLAUDE_CONFIG_DIR" not in given:
            env.pop("CLAUDE_CONFIG_DIR", None)  # the operator's: read-only, their history
    if plan.client == "codex" and home.codex_home is not None:
        env["CODEX_HOME"] = home.codex_home
    return env


# -- the edge: directories opened beneath each other, never through a symlink --------------


def _owner(plan: AgentPlan) -> tuple[int, int] | None:
    """(uid, gid) of the agent when it is not us: its own uid (`plan.uid`, its gid the same),
    or its `user`'s; None when the agent runs as we do."""
    if plan.uid is not None:
        return plan.uid, plan.uid
    user = plan.user
    if user is None:
        return None
    import pwd

    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise HomeError(f"user {user!r} does not exist on this machine") from None
    if entry.pw_uid == os.geteuid():
        return None
    return entry.pw_uid, entry.pw_gid


def _directory(
    parent_fd: int,
    name: str,
    shown: str,
    owner: tuple[int, int] | None,
    *,
    mode: int = 0o700,
    also: tuple[int, ...] = (),
    tree: bool = False,
) -> int:
    """Open (creating it) the directory `name` beneath `parent_fd` without following a
    symlink; hand it to `owner` (with `tree`, what it holds too: `_hand_over`); set its mode to
    `mode` unless it is already one of `also`."""
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    except FileExistsError:
        pass
    except OSError as exc:
        raise HomeError(f"cannot create {shown}: {exc.strerror}") from None
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=parent_fd)
    except OSError as exc:
        info = _lstat(parent_fd, name)
        if info is not None and stat.S_ISLNK(info.st_mode):
            raise HomeError(
                f"{shown} is a symlink; refusing to use it (remove it: the supervisor creates "
                "the directory itself)"
            ) from None
        if info is not None and not stat.S_ISDIR(info.st_mode):
            raise HomeError(f"{shown} exists and is not a directory; remove it") from None
        raise HomeError(f"cannot open {shown}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        allowed = {os.geteuid()} | ({owner[0]} if owner else set())
        if info.st_uid not in allowed:
            raise HomeError(
                f"{shown} belongs to uid {info.st_uid}, not to the supervisor or the agent's "
                "user; refusing to use it"
            )
        if owner is not None and info.st_uid != owner[0]:
            try:
                os.fchown(fd, owner[0], owner[1])
                if tree:
                    _hand_over(fd, owner)
            except PermissionError:
                raise HomeError(
                    f"cannot give {shown} to uid {owner[0]}: the supervisor must run as root "
                    "to run an agent as another user"
                ) from None
        current = stat.S_IMODE(info.st_mode)
        if current != mode and (current not in also or mode in also):
            try:
                os.fchmod(fd, mode)
            except PermissionError:
                raise HomeError(f"cannot set the mode of {shown} to {mode:04o}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def reclaim_home(state_dir: str, agent_id: str) -> None:
    """Give the home of an agent that left the fleet back to the supervisor, whole (`_hand_over`),
    so the uid it ran as, released (uids.py), reaches nothing of it when another agent gets
    that uid. Nothing happens when there is no such home; a home that is a symlink is refused
    (HomeError)."""
    try:
        agents_fd = os.open(
            os.path.join(state_dir, AGENTS), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
        )
    except FileNotFoundError:
        return
    try:
        fd = os.open(agent_id, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=agents_fd)  # fmt: skip
    except FileNotFoundError:
        return
    except OSError as exc:
        raise HomeError(f"cannot reclaim the home of {agent_id}: {exc.strerror}") from None
    finally:
        os.close(agents_fd)
    try:
        mine = (os.geteuid(), os.getegid())
        os.fchown(fd, *mine)
        _hand_over(fd, mine)
    finally:
        os.close(fd)


def _hand_over(fd: int, owner: tuple[int, int]) -> None:
    """Give everything beneath the open directory `fd` to `owner`: a home an agent of the
    supervisor's own uid used (before agents had uids of their own) becomes its own uid's, as
    systemd's `DynamicUser=` adjusts a state directory. By descriptor, never following a
    symlink (a link is handed over itself, not its target), and never a file with another
    link elsewhere (a hard link to a file outside the home must not change owner)."""
    for _, dirs, files, dir_fd in os.fwalk(dir_fd=fd, follow_symlinks=False):
        for name in (*dirs, *files):
            info = _lstat(dir_fd, name)
            if info is None or (not stat.S_ISDIR(info.st_mode) and info.st_nlink > 1):
                continue
            os.chown(name, owner[0], owner[1], dir_fd=dir_fd, follow_symlinks=False)


def _lstat(parent_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except OSError:
        return None


def _write(dir_fd: int, name: str, shown: str, data: bytes, owner: tuple[int, int] | None) -> None:
    """Write `data` as `name` in the open directory `dir_fd`, atomically and 0600, with
    configgen's `write_private` (through `/proc/self/fd`, so the path is never re-walked)."""
    try:
        write_private(f"/proc/self/fd/{dir_fd}/{name}", data)
    except ConfigError as exc:
        raise HomeError(
            f"{shown}: {exc}".replace(f"/proc/self/fd/{dir_fd}/{name}", shown)
        ) from None
    if owner is not None:
        os.chown(name, owner[0], owner[1], dir_fd=dir_fd, follow_symlinks=False)


def npm_platform() -> str:
    """This machine as npm names a platform package's suffix (`linux-x64`, `darwin-arm64`)."""
    machine = platform.machine().lower()
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64"}.get(machine, machine)
    return f"{sys.platform}-{arch}"


def codex_acp_native(wrapper: str) -> str | None:
    """The `codex-acp` binary that the npm package's node `wrapper` would run (its platform
    package `@zed-industries/codex-acp-<platform>`), or None: beside the wrapper in the same
    `bin` directory (npm links the platform package's own program there, `codex-acp-<platform>`),
    else the package's own layout around the wrapper's real path (a sibling package, or one
    nested in its `node_modules`, as a global install has it). The wrapper runs the binary as a
    child and forwards no signal, so a stop that reached only the wrapper would orphan it."""
    name = f"codex-acp-{npm_platform()}"
    package = os.path.dirname(os.path.dirname(os.path.realpath(wrapper)))
    for candidate in (
        os.path.join(os.path.dirname(wrapper), name),
        os.path.join(os.path.dirname(package), name, "bin", "codex-acp"),
        os.path.join(package, "node_modules", "@zed-industries", name, "bin", "codex-acp"),
    ):
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def agent_argv(plan: AgentPlan, home: Home) -> list[str]:
    """The argv to spawn: `plan.command` with its placeholders expanded, else the client's
    default (an ACP agent: its client's ACP adapter, `ACP_ADAPTERS`, which takes its MCP servers
    in ACP's `session/new`; for codex the platform binary the adapter's node wrapper would run,
    when it is found (`codex_acp_native`); `claude --mcp-config <mcp_config> --strict-mcp-config
    --allowedTools <own_tool_rules>`; `codex --disable
    daemon_auto_start`, which finds its config through CODEX_HOME: Codex would otherwise start
    a detached app-server daemon, which leaves the agent's process tree, so neither its MCP
    servers' identity nor the agent's stop could reach it). A program not found stays bare;
    the spawn then fails naming it."""
    values = {
        "mcp_config": home.mcp_config,
        "workspace": home.workspace,
        "home": home.root,
        "agent_id": plan.agent_id,
    }
    if plan.command is not None:
        return [item.format(**values) for item in plan.command]
    from configgen.launch import find_command

    if plan.runner == "acp" and plan.client in ACP_ADAPTERS:
        adapter = ACP_ADAPTERS[plan.client]
        found = find_command(adapter)
        if found is None:
            return [adapter]
        native = codex_acp_native(found) if plan.client == "codex" else None
        return [native or found]
    if plan.client == "claude":
        program = find_command("claude") or "claude"
        argv = [program, "--mcp-config", home.mcp_config, "--strict-mcp-config"]
        return [*argv, "--allowedTools", ",".join(own_tool_rules(plan))]
    if plan.client == "codex":
        return [find_command("codex") or "codex", "--disable", "daemon_auto_start"]
    raise ValueError(f'agent {plan.agent_id}: client = "command" needs a command')
