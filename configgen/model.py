"""The generator's input: one agent's center binding, its relay association, and the launch specs.

Owns: turning what a caller knows about an agent into validated, canonical values, using the
host's own grammar (`mcphost.binding`, `mcphost.admin.target`, `mcphost.admin.pinning`, and the
bundle and session-id grammars the relay tools check, in `mcphost.names`), so a config that
generates is a config the host and the relay tools accept; a bad token is refused with the host's
own message, which never shows it. Errors are `ConfigError`s whose message
names the offending variable or field and what is expected.

Pure: no I/O. In particular the token file named by `AC_MCP_WORKER_TOKEN_FILE` is *not* read
(the host reads it, and refuses it unless it is private); only its path is checked here.

Must never: put the token in a message or repr, or read identity from anywhere but its inputs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mcphost import binding as grammar
from mcphost.admin.pinning import format_pin
from mcphost.names import SESSION_ID_EXPECTED, is_bundle_name, is_session_id

CENTER_NAME = "agent-center"
RELAY_NAME = "agentmux"
# Present in the env of every server configgen writes; `merge` uses it to tell ours from a
# server the user wrote by hand. The value is the marker's format version.
MARKER = "MCPHOST_CONFIGGEN"
MARKER_VALUE = "1"

_SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


class ConfigError(ValueError):
    """Bad generator input. `str()` is the one-line operator message; `field` names the culprit."""

    def __init__(self, field_name: str, message: str) -> None:
        self.field = field_name
        super().__init__(message)


def _text(field_name: str, value: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise ConfigError(field_name, f"{field_name} must be a string, got {type(value).__name__}")
    if not value and not allow_empty:
        raise ConfigError(field_name, f"{field_name} is empty")
    if "\0" in value:
        raise ConfigError(field_name, f"{field_name} contains a NUL character")
    if _SURROGATE.search(value):
        raise ConfigError(field_name, f"{field_name} contains a lone surrogate (not valid Unicode)")
    return value


def _absolute_path(field_name: str, value: str) -> str:
    _text(field_name, value)
    if not value.startswith("/"):
        raise ConfigError(field_name, f"{field_name} is {value!r}: expected an absolute path")
    return value


def check_server_name(field_name: str, name: str) -> str:
    _text(field_name, name)
    if not _SERVER_NAME.fullmatch(name):
        raise ConfigError(
            field_name,
            f"{field_name} is {name!r}: expected 1-64 characters from A-Z a-z 0-9 _ - "
            "(clients rename other characters, which can make two servers collide)",
        )
    return name


def check_command(field_name: str, command: str) -> str:
    """An absolute path, or a bare program name found on the client's PATH; never `./x`."""
    _text(field_name, command)
    if "/" in command and not command.startswith("/"):
        raise ConfigError(
            field_name,
            f"{field_name} is {command!r}: expected an absolute path (a relative path depends "
            "on the directory the client starts servers in)",
        )
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in command):
        raise ConfigError(field_name, f"{field_name} is {command!r}: contains control characters")
    return command


@dataclass(frozen=True, slots=True)
class CenterBinding:
    """The center host's `AC_MCP_*` bindings, validated and in canonical form.

    Build it with keywords (`CenterBinding(agent_id=..., admin_url=..., token_file=...)`) or from
    an environment mapping (`CenterBinding.from_env(os.environ)`). `tier_tools=None` means "the
    client's default": false for Codex (its tool search only indexes the startup catalog),
    true elsewhere.
    """

    agent_id: str
    admin_url: str
    token: str = field(default="", repr=False)
    token_file: str | None = None
    fingerprint: str = ""
    agent_root: str | None = None
    runtime_socket: str | None = None
    tier_tools: bool | None = None
    generation: int = 0

    def __post_init__(self) -> None:
        env = self._raw_env()
        for name, value in env.items():
            _text(name, value, allow_empty=True)
        try:
            # The token file is checked for shape only; the host reads it (and checks its mode).
            parsed = grammar.AgentBinding.from_env(env, read_token_file=False)
        except grammar.BindingError as exc:
            raise ConfigError(exc.variable, str(exc)) from None
        # Store canonical forms: what the host would normalise to anyway.
        set_ = object.__setattr__
        set_(self, "agent_id", parsed.agent_id)
        set_(self, "admin_url", str(parsed.target))
        set_(self, "token", parsed.token.reveal())
        set_(self, "token_file", parsed.token_file)
        set_(self, "fingerprint", ",".join(format_pin(pin) for pin in parsed.pins))
        set_(self, "agent_root", parsed.agent_root)
        set_(self, "runtime_socket", parsed.runtime_socket)
        set_(self, "generation", parsed.generation)

    def _raw_env(self) -> dict[str, str]:
        if self.tier_tools is not None and not isinstance(self.tier_tools, bool):
            raise ConfigError(grammar.TIER_TOOLS, f"{grammar.TIER_TOOLS} must be true or false")
        if isinstance(self.generation, bool) or not isinstance(self.generation, int):
            raise ConfigError(
                grammar.GENERATION, f"{grammar.GENERATION} must be an integer (0, 1, 2, ...)"
            )
        if self.generation < 0:
            raise ConfigError(
                grammar.GENERATION,
                f"{grammar.GENERATION} is {self.generation}: expected a non-negative integer",
            )
        raw = {
            grammar.AGENT_ID: self.agent_id,
            grammar.ADMIN_URL: self.admin_url,
            grammar.WORKER_TOKEN: self.token,
            grammar.WORKER_TOKEN_FILE: self.token_file or "",
            grammar.SERVER_FINGERPRINT: self.fingerprint,
            grammar.AGENT_ROOT: self.agent_root or "",
            grammar.RUNTIME_SOCKET: self.runtime_socket or "",
            grammar.GENERATION: str(self.generation),
        }
        for name, value in raw.items():
            if not isinstance(value, str):
                raise ConfigError(name, f"{name} must be a string, got {type(value).__name__}")
        return raw

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CenterBinding:
        """Bindings from `AC_MCP_*` variables, with the host's grammar (the token file unread)."""

        def get(name: str) -> str:
            return env.get(name, "").strip()

        raw_tier = get(grammar.TIER_TOOLS)
        try:
            tier = grammar.parse_bool(grammar.TIER_TOOLS, raw_tier, default=True)
            generation = grammar.parse_generation(get(grammar.GENERATION))
        except grammar.BindingError as exc:
            raise ConfigError(exc.variable, str(exc)) from None
        return cls(
            agent_id=get(grammar.AGENT_ID),
            admin_url=get(grammar.ADMIN_URL),
            token=get(grammar.WORKER_TOKEN),
            token_file=get(grammar.WORKER_TOKEN_FILE) or None,
            fingerprint=get(grammar.SERVER_FINGERPRINT),
            agent_root=get(grammar.AGENT_ROOT) or None,
            runtime_socket=get(grammar.RUNTIME_SOCKET) or None,
            tier_tools=tier if raw_tier else None,
            generation=generation,
        )

    def env(self, *, tier_tools_default: bool) -> dict[str, str]:
        """The `AC_MCP_*` environment the host is started with (sorted; unset values left out)."""
        tier = self.tier_tools if self.tier_tools is not None else tier_tools_default
        env = {
            grammar.AGENT_ID: self.agent_id,
            grammar.ADMIN_URL: self.admin_url,
            grammar.GENERATION: str(self.generation),
            grammar.TIER_TOOLS: "true" if tier else "false",
        }
        optional = {
            grammar.WORKER_TOKEN: self.token,
            grammar.WORKER_TOKEN_FILE: self.token_file or "",
            grammar.SERVER_FINGERPRINT: self.fingerprint,
            grammar.AGENT_ROOT: self.agent_root or "",
            grammar.RUNTIME_SOCKET: self.runtime_socket or "",
        }
        env.update({name: value for name, value in optional.items() if value})
        return dict(sorted(env.items()))


@dataclass(frozen=True, slots=True)
class RelayBinding:
    """The relay association: which bundle and session the relay tools speak for.

    `upstream=True` launches upstream's `agentmux host mcp` instead of `mcphost relay-tools`;
    both take the same flags.
    """

    bundle: str
    session_name: str
    configuration_directories: Sequence[str] = ()
    state_directory: str | None = None
    inscriptions_directory: str | None = None
    upstream: bool = False

    def __post_init__(self) -> None:
        for name, value in (
            ("relay bundle", self.bundle),
            ("relay session name", self.session_name),
        ):
            _text(name, value)
            if value != value.strip() or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
                raise ConfigError(
                    name,
                    f"{name} is {value!r}: expected no surrounding space or control characters",
                )
        if not is_bundle_name(self.bundle):
            raise ConfigError(
                "relay bundle",
                f"relay bundle is {self.bundle!r}: expected a bundle name of letters, digits, "
                "'.', '_' and '-' (the relay tools refuse anything else at start)",
            )
        if not is_session_id(self.session_name):
            raise ConfigError(
                "relay session name",
                f"relay session name is {self.session_name!r}: expected a session id: "
                f"{SESSION_ID_EXPECTED} (the relay tools refuse anything else at start)",
            )
        if isinstance(self.configuration_directories, str):
            raise ConfigError(
                "relay configuration directories",
                "relay configuration directories must be a list of paths, not one string",
            )
        dirs = tuple(self.configuration_directories)
        for directory in dirs:
            _absolute_path("relay configuration directory", directory)
        object.__setattr__(self, "configuration_directories", dirs)
        if self.state_directory is not None:
            _absolute_path("relay state directory", self.state_directory)
        if self.inscriptions_directory is not None:
            _absolute_path("relay inscriptions directory", self.inscriptions_directory)

    def args(self) -> list[str]:
        """The flags both `mcphost relay-tools` and `agentmux host mcp` take.

        A bundle name starting with `-` is written `--flag=value`: as a separate word both
        argparse and clap would take it for an option and refuse to start. (A session id starts
        with a letter, so it never needs this; the code does not rely on that.)
        """
        args: list[str] = []
        for flag, value in (("--bundle", self.bundle), ("--session-name", self.session_name)):
            args += [f"{flag}={value}"] if value.startswith("-") else [flag, value]
        for directory in self.configuration_directories:
            args += ["--configuration-directory", directory]
        if self.state_directory is not None:
            args += ["--state-directory", self.state_directory]
        if self.inscriptions_directory is not None:
            args += ["--inscriptions-directory", self.inscriptions_directory]
        return args


# AF_UNIX `sun_path` holds 108 bytes including the terminating NUL.
SOCKET_PATH_MAX = 107


@dataclass(frozen=True, slots=True)
class AttachBinding:
    """An *attach* entry: the server is a thin pump (`mcphost/attach.py`) between the client's
    stdio and a supervisor's attach socket (one socket per surface: center tools, relay tools).

    The entry carries no identity and no secret: the supervisor tells agents apart by the
    kernel's peer credentials of the connecting pump, so the config holds only the socket path.
    It is launched as `<python> -I -S <attach script> <socket>` (see `AgentConfig.python` and
    `AgentConfig.attach_script`).
    """

    socket: str

    def __post_init__(self) -> None:
        _absolute_path("attach socket", self.socket)
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in self.socket):
            raise ConfigError(
                "attach socket", f"attach socket is {self.socket!r}: contains control characters"
            )
        if len(self.socket.encode("utf-8", "surrogatepass")) > SOCKET_PATH_MAX:
            raise ConfigError(
                "attach socket",
                f"attach socket is {self.socket!r}: longer than {SOCKET_PATH_MAX} bytes, the "
                "most a Unix socket path can hold; use a shorter state directory",
            )


_LOOPBACK_HTTP = re.compile(r"http://(127\.0\.0\.1|localhost|\[::1\]):[0-9]{1,5}/[!-~]*")


@dataclass(frozen=True, slots=True)
class HttpBinding:
    """An *HTTP* entry: the client speaks MCP's streamable HTTP to `url`, a supervisor's
    loopback listener (`mcphost/supervisor/serving/streamable.py`), with no process between.

    Like an attach entry it carries no identity and no secret: the supervisor tells agents apart
    by the kernel's word on who owns the connection (each agent has a uid of its own), so the
    config holds only the address. Only a loopback `http://` URL is accepted.
    """

    url: str

    def __post_init__(self) -> None:
        _text("http url", self.url)
        if not _LOOPBACK_HTTP.fullmatch(self.url):
            raise ConfigError(
                "http url",
                f"http url is {self.url!r}: expected http://127.0.0.1:PORT/PATH (a loopback "
                "address, printable ASCII)",
            )


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Everything one agent's client config is made from.

    `mcphost` / `agentmux` are the commands that start the servers: absolute paths (see
    `configgen.launch.resolve_commands`, which fills them in) or bare names found on PATH.
    Either surface may instead be an `AttachBinding` (a supervisor's attach socket); attach
    entries run `python` (an absolute interpreter path, default `sys.executable`) with
    `-I -S attach_script` (absolute, default the installed `mcphost/attach.py`).
    Timeouts are in seconds; clients that take them get them (Codex, Gemini).
    `approve_attach_tools`: the client is told to run the attach entries' tools without asking
    (`Server.preapproved`); a supervisor sets it for its ACP agents, whose every question
    otherwise waits for a peer's `choose`. It never applies to any other entry.
    """

    center: CenterBinding | AttachBinding | HttpBinding | None = None
    relay: RelayBinding | AttachBinding | HttpBinding | None = None
    mcphost: str | None = None
    agentmux: str | None = None
    python: str | None = None
    attach_script: str | None = None
    center_name: str = CENTER_NAME
    relay_name: str = RELAY_NAME
    startup_timeout_sec: int = 30
    tool_timeout_sec: int = 300
    approve_attach_tools: bool = False

    def __post_init__(self) -> None:
        if self.center is None and self.relay is None:
            raise ConfigError(
                "servers", "nothing to generate: give center bindings, a relay, or both"
            )
        if self.center is not None and not isinstance(
            self.center, CenterBinding | AttachBinding | HttpBinding
        ):
            raise ConfigError(
                "center", "center must be a CenterBinding, an AttachBinding or an HttpBinding"
            )
        if self.relay is not None and not isinstance(
            self.relay, RelayBinding | AttachBinding | HttpBinding
        ):
            raise ConfigError(
                "relay", "relay must be a RelayBinding, an AttachBinding or an HttpBinding"
            )
        check_server_name("center server name", self.center_name)
        check_server_name("relay server name", self.relay_name)
        if (
            self.center is not None
            and self.relay is not None
            and self.center_name == self.relay_name
        ):
            raise ConfigError(
                "relay server name",
                f"the center and relay servers are both named {self.center_name!r}: give them "
                "different names",
            )
        for name, seconds in (
            ("startup timeout", self.startup_timeout_sec),
            ("tool timeout", self.tool_timeout_sec),
        ):
            if (
                isinstance(seconds, bool)
                or not isinstance(seconds, int)
                or not 1 <= seconds <= 86400
            ):
                raise ConfigError(name, f"{name} is {seconds!r}: expected whole seconds, 1-86400")
        if self.mcphost is not None:
            check_command("mcphost command", self.mcphost)
        if self.agentmux is not None:
            check_command("agentmux command", self.agentmux)
        if self.python is not None:
            _absolute_path("attach python", self.python)
            check_command("attach python", self.python)
        if self.attach_script is not None:
            _absolute_path("attach script", self.attach_script)
            check_command("attach script", self.attach_script)

    @property
    def needs_mcphost(self) -> bool:
        return isinstance(self.center, CenterBinding) or (
            isinstance(self.relay, RelayBinding) and not self.relay.upstream
        )

    @property
    def needs_agentmux(self) -> bool:
        return isinstance(self.relay, RelayBinding) and self.relay.upstream

    @property
    def needs_attach(self) -> bool:
        return isinstance(self.center, AttachBinding) or isinstance(self.relay, AttachBinding)


@dataclass(frozen=True, slots=True)
class Server:
    """One stdio server entry, client-neutral: what to run and with which environment.
    `preapproved`: the client should run its tools without asking (only an attach entry, whose
    tools are the agent's own, and only when its config says `approve_attach_tools`)."""

    command: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    preapproved: bool = False
    url: str | None = None  # an HTTP entry (`HttpBinding`): no command, no args, no env


def servers(config: AgentConfig, *, tier_tools_default: bool = True) -> dict[str, Server]:
    """The servers of `config`, by name, in name order. Pure."""
    out: dict[str, Server] = {}
    prefix: tuple[str, ...]
    if isinstance(config.center, HttpBinding):
        out[config.center_name] = _http_server(config, config.center)
    elif isinstance(config.center, AttachBinding):
        out[config.center_name] = _attach_server(config, config.center)
    elif config.center is not None:
        if config.mcphost is None:
            raise ConfigError(
                "mcphost command",
                "the mcphost command is not set: pass an absolute path (or use "
                "configgen.generate, which finds the installed script)",
            )
        env = config.center.env(tier_tools_default=tier_tools_default)
        env[MARKER] = MARKER_VALUE
        out[config.center_name] = Server(config.mcphost, ("host",), dict(sorted(env.items())))
    if isinstance(config.relay, HttpBinding):
        out[config.relay_name] = _http_server(config, config.relay)
    elif isinstance(config.relay, AttachBinding):
        out[config.relay_name] = _attach_server(config, config.relay)
    elif config.relay is not None:
        if config.relay.upstream:
            if config.agentmux is None:
                raise ConfigError(
                    "agentmux command",
                    "the relay is upstream agentmux but the agentmux command is not set",
                )
            command, prefix = config.agentmux, ("host", "mcp")
        else:
            if config.mcphost is None:
                raise ConfigError("mcphost command", "the mcphost command is not set")
            command, prefix = config.mcphost, ("relay-tools",)
        out[config.relay_name] = Server(
            command, (*prefix, *config.relay.args()), {MARKER: MARKER_VALUE}
        )
    return dict(sorted(out.items()))


def _attach_server(config: AgentConfig, attach: AttachBinding) -> Server:
    """`<python> -I -S <attach script> <socket>`, with only the marker in its env: no identity,
    no token, no token file, no admin URL (the supervisor identifies the pump by the kernel)."""
    if config.python is None or config.attach_script is None:
        raise ConfigError(
            "attach python" if config.python is None else "attach script",
            "an attach entry needs the interpreter and the attach script: pass absolute paths "
            "(or use configgen.generate, which uses sys.executable and mcphost/attach.py)",
        )
    args = ("-I", "-S", config.attach_script, attach.socket)
    return Server(
        config.python, args, {MARKER: MARKER_VALUE}, preapproved=config.approve_attach_tools
    )


def _http_server(config: AgentConfig, http: HttpBinding) -> Server:
    """An HTTP entry: the URL only (no identity, no token: the supervisor asks the kernel)."""
    return Server("", (), {}, preapproved=config.approve_attach_tools, url=http.url)
