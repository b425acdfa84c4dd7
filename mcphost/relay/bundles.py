"""What the relay reads from the configuration layers: bundles, coders, users and relay settings.

Owns: the relay's strict reading of `bundles/<id>.toml`, `coders.toml`, `users.toml` and
`relay.toml` (reference `agentmux-relay.md` §3.1): kebab-case keys, `deny_unknown_fields` (an
unknown key, a snake_case spelling of a kebab key included, is an error), `format-version = 1`
when present, types and ranges checked, every error a `RelayError` whose message names the file
and the key (`sessions[1].coder`) and whose details are `{"path", "cause"}`; the shared helpers
that `policy` uses for `policies.toml` (`first_file`, `Table`); the precedence of the two
relay booleans (flag > `AGENTMUX_RELAY_*` env, exactly `true`/`false` > file > default).

Read through agentmux's one reader (`mcphost.agentmux.layers`, which the relay tools read the
same files with): TOML loading (`first_file`), the bundle-id listing across layers (`bundle_ids`)
and the name grammars of `mcphost.names`. First layer wins per file; `bundles/` is a union by id
(the first layer holding `bundles/<id>.toml` wins). The relay tools' own reading
(`relaytools.layout.load_members`) is lenient where this one is strict: the relay refuses a file
the tools would half-read.

Codes: a malformed file is `validation_invalid_arguments` (layout's code for a bad bundle); an
unreadable layer `validation_unreadable_configuration_layer`; a bad group name
`validation_invalid_group_name` / `validation_reserved_group_name`; a bundle id outside the
grammar `validation_invalid_params`; a bundle no layer configures `validation_unknown_bundle`;
ACP and pty coders are recognised and validated; the relay answers
`runtime_session_type_not_implemented` for a member no registered member kind hosts
(`relay.members.KINDS`; ui/pubsub members: `validation_unsupported_operation`, requester.py).

Must never: write anything, import `mcphost.supervisor`, or build a path from a name outside the
grammars (bundle ids and session ids are checked before any path is made).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcphost.agentmux import layers
from mcphost.agentmux.wire import RelayError
from mcphost.names import SESSION_ID_EXPECTED, is_bundle_name, is_session_id

INVALID = "validation_invalid_arguments"
FORMAT_VERSION = 1
READINESS_TIMEOUT_DEFAULT_MS = 900_000
READINESS_TIMEOUT_RANGE_MS = (30_000, 3_600_000)
PROMPT_INSPECT_LINES_DEFAULT = 1
PENDING_MAX_DEFAULT = 256
PENDING_MAX_RANGE = (1, 4096)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
GROUP_NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")
RESERVED_GROUP = "ALL"
USER_NAMESPACE = "GLOBAL"
COMMAND_PLACEHOLDER = "{coder-session-id}"

# -- errors and tables -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Source:
    """One configuration file being read: where errors point."""

    path: Path
    label: str  # "bundle configuration", "coders configuration", ...

    def error(self, key: str, cause: str, code: str = INVALID) -> RelayError:
        text = f"{key}: {cause}" if key else cause
        return RelayError(
            code,
            f"{self.label} is invalid: {self.path}: {text}",
            {"path": str(self.path), "cause": text},
        )


class Table:
    """A TOML table read with `deny_unknown_fields`: each key taken once, `done()` refuses the rest.

    `where` is the table's key path (`sessions[0]`, `coders[1].tmux`) so errors name the key.
    """

    def __init__(self, source: Source, data: Mapping[str, Any], where: str = "") -> None:
        self.source = source
        self.data = data
        self.where = where
        self._seen: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def error(self, name: str, cause: str, code: str = INVALID) -> RelayError:
        return self.source.error(self.key(name), cause, code)

    def has(self, name: str) -> bool:
        return name in self.data

    def raw(self, name: str) -> Any:
        self._seen.add(name)
        return self.data.get(name)

    def string(self, name: str, *, required: bool = False, empty: bool = False) -> str | None:
        value = self.raw(name)
        if value is None:
            if required:
                raise self.error(name, "missing required field")
            return None
        if not isinstance(value, str):
            raise self.error(name, f"expected a string, got {_kind(value)}")
        if not empty and not value.strip():
            raise self.error(name, "must be non-empty")
        if "\x00" in value:
            raise self.error(name, "must not contain NUL")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self.raw(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(name, f"expected a boolean, got {_kind(value)}")
        return value

    def integer(self, name: str, *, low: int, high: int | None = None) -> int | None:
        value = self.raw(name)
        if value is None:
            return None
        if type(value) is not int:
            raise self.error(name, f"expected an integer, got {_kind(value)}")
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise self.error(name, f"must be {bound}, got {value}")
        return value

    def strings(self, name: str) -> tuple[str, ...]:
        value = self.raw(name)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(name, "expected an array of strings")
        return tuple(value)

    def table(self, name: str) -> Table | None:
        value = self.raw(name)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.error(name, f"expected a table, got {_kind(value)}")
        return Table(self.source, value, self.key(name))

    def tables(self, name: str) -> list[Table]:
        value = self.raw(name)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise self.error(name, "expected an array of tables")
        return [Table(self.source, v, f"{self.key(name)}[{i}]") for i, v in enumerate(value)]

    def environment(self, name: str = "environment") -> tuple[tuple[str, str], ...]:
        """`environment = [{name, value}]`: names unique, POSIX-shaped; values without NUL."""
        out: dict[str, str] = {}
        for entry in self.tables(name):
            var = entry.string("name", required=True)
            value = entry.string("value", required=True, empty=True)
            entry.done()
            assert var is not None and value is not None
            if not ENV_NAME.fullmatch(var):
                raise entry.error("name", f"{var!r} is not an environment variable name")
            if var in out:
                raise entry.error("name", f"{var!r} is set twice")
            out[var] = value
        return tuple(out.items())

    def format_version(self) -> None:
        value = self.raw("format-version")
        if value is not None and (type(value) is not int or value != FORMAT_VERSION):
            raise self.error("format-version", f"unsupported format version {value!r} (expected 1)")

    def done(self) -> None:
        for name in sorted(set(self.data) - self._seen):
            hint = ""
            if "_" in name and name.replace("_", "-") in self._seen:
                hint = f" (keys are kebab-case: {name.replace('_', '-')!r})"
            raise self.error(name, f"unknown field{hint}")


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def first_file(roots: Sequence[Path], relative: str) -> tuple[Path, dict[str, Any]] | None:
    """The first layer's `relative` file, parsed, with its path; None when no layer has it."""
    try:
        return layers.first_file(roots, relative)
    except layers.ConfigError as exc:
        path = exc.path
        cause = str(exc.__cause__) if exc.__cause__ is not None else exc.message
        raise RelayError(exc.code, exc.message, {"path": str(path), "cause": cause}) from None


def _open(roots: Sequence[Path], relative: str, label: str) -> Table | None:
    found = first_file(roots, relative)
    if found is None:
        return None
    path, doc = found
    top = Table(Source(path, label), doc)
    top.format_version()
    return top


# -- coders.toml -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TmuxCoder:
    """`[coders.tmux]`: how a tmux session is started and when its pane is ready for input."""

    initial_command: str
    resume_command: str | None = None
    prompt_regex: str | None = None
    prompt_inspect_lines: int = PROMPT_INSPECT_LINES_DEFAULT
    prompt_idle_column: int | None = None
    prime_timeout_ms: int | None = None
    readiness_timeout_ms: int = READINESS_TIMEOUT_DEFAULT_MS

    def command(self, coder_session_id: str | None) -> str:
        """`resume-command` (placeholder filled, shell-quoted) when a coder session id is set and
        a resume command exists, else `initial-command`."""
        if coder_session_id and self.resume_command:
            return self.resume_command.replace(COMMAND_PLACEHOLDER, shlex.quote(coder_session_id))
        return self.initial_command


@dataclass(frozen=True, slots=True)
class Coder:
    id: str
    transport: str  # "tmux" | "acp" | "pty"
    environment: tuple[tuple[str, str], ...] = ()
    tmux: TmuxCoder | None = None


def _tmux_keys(table: Table, *, pty: bool) -> TmuxCoder:
    initial = table.string("initial-command", required=True)
    assert initial is not None
    regex = table.string("prompt-regex")
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as exc:
            raise table.error("prompt-regex", f"not a valid regular expression: {exc}") from None
    inspect = table.integer("prompt-inspect-lines", low=1, high=1000)
    low, high = READINESS_TIMEOUT_RANGE_MS
    readiness = table.integer("readiness-timeout-ms", low=low, high=high)
    tmux = TmuxCoder(
        initial_command=initial,
        resume_command=table.string("resume-command"),
        prompt_regex=regex,
        prompt_inspect_lines=inspect if inspect is not None else PROMPT_INSPECT_LINES_DEFAULT,
        prompt_idle_column=table.integer("prompt-idle-column", low=0, high=10_000),
        prime_timeout_ms=table.integer("prime-timeout-ms", low=1),
        readiness_timeout_ms=readiness if readiness is not None else READINESS_TIMEOUT_DEFAULT_MS,
    )
    table.boolean("wedge-detection", False)  # recognised (older files), not acted on
    if pty:
        table.integer("cols", low=1, high=10_000)
        table.integer("rows", low=1, high=10_000)
        table.string("term-protocol")
    table.done()
    return tmux


def _acp_keys(table: Table) -> None:
    channel = table.string("channel", required=True)
    if channel not in ("stdio", "http"):
        raise table.error("channel", f'must be "stdio" or "http", got {channel!r}')
    command = table.string("command")
    url = table.string("url")
    table.environment("headers")
    table.integer("prime-timeout-ms", low=1)
    if channel == "stdio" and command is None:
        raise table.error("command", "required when channel is stdio")
    if channel == "http" and url is None:
        raise table.error("url", "required when channel is http")
    table.done()


def load_coders(roots: Sequence[Path]) -> dict[str, Coder]:
    """coder id -> Coder from the first layer's `coders.toml` ({} when no layer has one)."""
    top = _open(roots, "coders.toml", "coders configuration")
    if top is None:
        return {}
    coders: dict[str, Coder] = {}
    for entry in top.tables("coders"):
        coder_id = entry.string("id", required=True)
        assert coder_id is not None
        if coder_id in coders:
            raise entry.error("id", f"coder id {coder_id!r} is defined twice")
        environment = entry.environment()
        shapes = [name for name in ("tmux", "acp", "pty") if entry.has(name)]
        if len(shapes) != 1:
            raise entry.error("tmux", "exactly one of tmux, acp or pty must be set")
        transport = shapes[0]
        section = entry.table(transport)
        assert section is not None
        tmux = None
        if transport == "acp":
            _acp_keys(section)
        else:
            tmux = _tmux_keys(section, pty=transport == "pty")
        entry.done()
        coders[coder_id] = Coder(coder_id, transport, environment, tmux)
    top.done()
    return coders


# -- bundles/<id>.toml -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Session:
    """One `[[sessions]]` member of a bundle."""

    id: str
    directory: str | None
    kind: str  # "coder" | "ui" | "pubsub"
    transport: str  # "tmux" | "acp" | "pty" | "ui" | "pubsub"
    name: str | None = None
    policy: str | None = None
    coder: str | None = None
    coder_session_id: str | None = None
    environment: tuple[tuple[str, str], ...] = ()
    groups: tuple[str, ...] = ()

    def principal_id(self, bundle: str) -> str:
        return f"{self.id}@{bundle}"


@dataclass(frozen=True, slots=True)
class Bundle:
    id: str
    path: Path
    sessions: tuple[Session, ...]
    autostart: bool = False
    groups: tuple[str, ...] = ()
    environment: tuple[tuple[str, str], ...] = ()
    coders: Mapping[str, Coder] = field(default_factory=dict, repr=False, compare=False)

    def member(self, session_id: str) -> Session | None:
        for session in self.sessions:
            if session.id == session_id:
                return session
        return None

    def coder_for(self, session: Session) -> Coder | None:
        return self.coders.get(session.coder) if session.coder is not None else None


def _group(table: Table, key: str, name: str) -> str:
    if name.isupper() or name == RESERVED_GROUP:
        raise table.error(
            key, f"group {name!r} is reserved (uppercase names)", "validation_reserved_group_name"
        )
    if not GROUP_NAME.fullmatch(name):
        raise table.error(
            key,
            f"group {name!r} must be lowercase: a letter, then letters, digits, '-' or '_'",
            "validation_invalid_group_name",
        )
    return name


def _directory(table: Table, required: bool) -> str | None:
    directory = table.string("directory", required=required)
    if directory is not None and not os.path.isabs(os.path.expanduser(directory)):
        raise table.error("directory", f"must be an absolute path, got {directory!r}")
    return directory


def _session(entry: Table, coders: Mapping[str, Coder], declared: tuple[str, ...]) -> Session:
    session_id = entry.string("id", required=True)
    assert session_id is not None
    if not is_session_id(session_id):
        raise entry.error(
            "id", f"{session_id!r} is not a session id: expected {SESSION_ID_EXPECTED}"
        )
    markers = [name for name in ("ui", "pubsub") if entry.has(name)]
    shapes = markers + (["coder"] if entry.has("coder") else [])
    if len(shapes) != 1:
        raise entry.error("coder", "exactly one of coder, [sessions.ui] or [sessions.pubsub]")
    coder_id = entry.string("coder")
    coder_session_id = entry.string("coder-session-id")
    if coder_session_id is not None and coder_id is None:
        raise entry.error("coder-session-id", "only a coder session has a coder session id")
    for marker in markers:
        body = entry.table(marker)
        assert body is not None
        body.done()  # marker subtables have an empty body
    if coder_id is not None:
        coder = coders.get(coder_id)
        if coder is None:
            raise entry.error("coder", f"coder {coder_id!r} is not defined in coders.toml")
        kind, transport = "coder", coder.transport
    else:
        kind = transport = markers[0]
    groups = []
    for i, name in enumerate(entry.strings("groups")):
        _group(entry, f"groups[{i}]", name)
        if name not in declared:
            raise entry.error(
                f"groups[{i}]",
                f"group {name!r} is not declared in the bundle's groups",
                "validation_invalid_group_name",
            )
        groups.append(name)
    session = Session(
        id=session_id,
        directory=_directory(entry, required=kind == "coder"),
        kind=kind,
        transport=transport,
        name=entry.string("name"),
        policy=entry.string("policy"),
        coder=coder_id,
        coder_session_id=coder_session_id,
        environment=entry.environment(),
        groups=tuple(groups),
    )
    entry.done()
    return session


def _check_bundle_id(bundle_id: str) -> None:
    if not is_bundle_name(bundle_id):
        raise RelayError(
            "validation_invalid_params",
            "bundle_name contains unsupported characters",
            {"bundle_name": bundle_id},
        )


def load_bundle(
    roots: Sequence[Path], bundle_id: str, *, coders: Mapping[str, Coder] | None = None
) -> Bundle | None:
    """The bundle from the first layer holding `bundles/<id>.toml`, None when none does.

    `coders` defaults to `load_coders(roots)`; every member's coder must be defined there.
    """
    _check_bundle_id(bundle_id)
    top = _open(roots, f"bundles/{bundle_id}.toml", "bundle configuration")
    if top is None:
        return None
    if coders is None:
        coders = load_coders(roots)
    autostart = top.boolean("autostart", False)
    declared = tuple(_group(top, f"groups[{i}]", g) for i, g in enumerate(top.strings("groups")))
    if len(set(declared)) != len(declared):
        raise top.error("groups", "a group is declared twice", "validation_invalid_group_name")
    environment = top.environment()
    sessions: list[Session] = []
    ids: set[str] = set()
    names: set[str] = set()
    for entry in top.tables("sessions"):
        session = _session(entry, coders, declared)
        if session.id in ids:
            raise entry.error("id", f"session id {session.id!r} is used twice")
        if session.name is not None:
            if session.name in names:
                raise entry.error("name", f"session name {session.name!r} is used twice")
            names.add(session.name)
        ids.add(session.id)
        sessions.append(session)
    top.done()
    return Bundle(
        id=bundle_id,
        path=top.source.path,
        sessions=tuple(sessions),
        autostart=autostart,
        groups=declared,
        environment=environment,
        coders=dict(coders),
    )


def require_bundle(
    roots: Sequence[Path], bundle_id: str, *, coders: Mapping[str, Coder] | None = None
) -> Bundle:
    """`load_bundle`, with `validation_unknown_bundle` when no layer configures the bundle."""
    bundle = load_bundle(roots, bundle_id, coders=coders)
    if bundle is None:
        where = ", ".join(str(r / "bundles") for r in roots)
        raise RelayError(
            "validation_unknown_bundle",
            f"bundle '{bundle_id}' is not configured under {where}",
            {"bundle_name": bundle_id, "path": where},
        )
    return bundle


def bundle_ids(roots: Sequence[Path]) -> list[str]:
    """Every bundle id across the layers (union by id), sorted: the relay tools' own listing."""
    return layers.bundle_ids(roots)


# -- users.toml ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class User:
    """A relay-wide principal `<name>@GLOBAL` from `users.toml`."""

    id: str
    policy: str
    name: str | None = None
    transport: str = "ui"  # "ui" | "pubsub"


@dataclass(frozen=True, slots=True)
class Users:
    users: tuple[User, ...] = ()
    default_bundle: str | None = None
    default_session: str | None = None
    path: Path | None = None

    def get(self, principal_id: str) -> User | None:
        for user in self.users:
            if user.id == principal_id:
                return user
        return None


def load_users(roots: Sequence[Path]) -> Users:
    """The first layer's `users.toml` (no users when no layer has one)."""
    top = _open(roots, "users.toml", "users configuration")
    if top is None:
        return Users()
    default_bundle = top.string("default-bundle")
    if default_bundle is not None and not is_bundle_name(default_bundle):
        raise top.error("default-bundle", f"{default_bundle!r} is not a bundle id")
    default_session = top.string("default-session")
    users: list[User] = []
    for entry in top.tables("sessions"):
        user_id = entry.string("id", required=True)
        assert user_id is not None
        local, at, namespace = user_id.rpartition("@")
        if not at or namespace != USER_NAMESPACE or not is_session_id(local):
            raise entry.error(
                "id", f"{user_id!r} must be <name>@GLOBAL, the name {SESSION_ID_EXPECTED}"
            )
        if any(u.id == user_id for u in users):
            raise entry.error("id", f"user {user_id!r} is defined twice")
        policy = entry.string("policy", required=True)
        assert policy is not None
        markers = [m for m in ("ui", "pubsub") if entry.has(m)]
        if len(markers) > 1:
            raise entry.error("ui", "at most one of [sessions.ui] or [sessions.pubsub]")
        for marker in markers:
            body = entry.table(marker)
            assert body is not None
            body.done()
        users.append(User(user_id, policy, entry.string("name"), markers[0] if markers else "ui"))
        entry.done()
    top.done()
    return Users(tuple(users), default_bundle, default_session, top.source.path)


# -- relay.toml ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Peer:
    alias: str
    address: str
    connect_as: str


@dataclass(frozen=True, slots=True)
class RelaySettings:
    watch_bundles: bool = True
    require_session_credentials: bool = False
    choices_pending_max: int = PENDING_MAX_DEFAULT
    peers: tuple[Peer, ...] = ()
    path: Path | None = None


ENV_WATCH = "AGENTMUX_RELAY_WATCH_BUNDLES"
ENV_REQUIRE = "AGENTMUX_RELAY_REQUIRE_SESSION_CREDENTIALS"


def _env_bool(env: Mapping[str, str], name: str) -> bool | None:
    value = env.get(name)
    if value is None:
        return None
    if value not in ("true", "false"):
        raise RelayError(
            INVALID,
            f"{name} must be exactly 'true' or 'false'",
            {"variable": name, "value": value},
        )
    return value == "true"


def load_relay_settings(
    roots: Sequence[Path],
    env: Mapping[str, str] | None = None,
    *,
    watch_flag: bool | None = None,
    require_credentials_flag: bool | None = None,
) -> RelaySettings:
    """`relay.toml` from the first layer, with the two booleans' precedence applied:
    flag (`--no-watch` -> False, `--require-credentials` -> True) > env > file > default."""
    env = os.environ if env is None else env
    top = _open(roots, "relay.toml", "relay configuration")
    settings = RelaySettings()
    if top is not None:
        watch = top.boolean("watch-bundles", True)
        require = top.boolean("require-session-credentials", False)
        pending = PENDING_MAX_DEFAULT
        choices = top.table("choices")
        if choices is not None:
            low, high = PENDING_MAX_RANGE
            value = choices.integer("pending-max", low=low, high=high)
            pending = value if value is not None else PENDING_MAX_DEFAULT
            choices.done()
        peers: list[Peer] = []
        for entry in top.tables("peers"):
            alias = entry.string("alias", required=True)
            address = entry.string("address", required=True)
            connect_as = entry.string("connect-as", required=True)
            assert alias is not None and address is not None and connect_as is not None
            if not is_bundle_name(alias):
                raise entry.error("alias", f"{alias!r} is not a valid peer alias")
            if any(p.alias == alias for p in peers):
                raise entry.error("alias", f"peer alias {alias!r} is used twice")
            if not os.path.isabs(address):
                raise entry.error("address", "must be an absolute socket path")
            peers.append(Peer(alias, address, connect_as))
            entry.done()
        top.table("delivery")  # recognised (newer quotas/timeouts); not acted on
        top.done()
        settings = RelaySettings(watch, require, pending, tuple(peers), top.source.path)
    watch_env = _env_bool(env, ENV_WATCH)
    require_env = _env_bool(env, ENV_REQUIRE)
    watch = _first_set(watch_flag, watch_env, settings.watch_bundles)
    require = _first_set(
        require_credentials_flag, require_env, settings.require_session_credentials
    )
    return RelaySettings(
        watch, require, settings.choices_pending_max, settings.peers, settings.path
    )


def _first_set(*values: bool | None) -> bool:
    for value in values:
        if value is not None:
            return value
    return False
