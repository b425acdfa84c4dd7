"""What the relay reads from its configuration layers beside the bundle file: users and settings.

Owns: the relay's strict reading (agentmux's tables, `mcphost.agentmux.tables`: kebab-case,
`deny_unknown_fields`, every error a `RelayError` naming the file and the key) of `users.toml`
(the relay-wide principals `<name>@GLOBAL`) and `relay.toml` (reference `agentmux-relay.md`
§3.1), and the precedence of the two relay booleans (flag > `AGENTMUX_RELAY_*` env, exactly
`true`/`false` > file > default). First layer wins per file.

Not here: the bundle file (`bundles/<id>.toml` and `coders.toml`) has one home below both the
relay and the relay tools, `mcphost.agentmux.bundlefile`; `policies.toml` is `policy.py`'s.

Must never: write anything, or import `mcphost.supervisor`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mcphost.agentmux.tables import INVALID, open_table
from mcphost.agentmux.wire import RelayError
from mcphost.names import SESSION_ID_EXPECTED, is_bundle_name, is_session_id

PENDING_MAX_DEFAULT = 256
PENDING_MAX_RANGE = (1, 4096)
USER_NAMESPACE = "GLOBAL"

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
    top = open_table(roots, "users.toml", "users configuration")
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
    top = open_table(roots, "relay.toml", "relay configuration")
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
