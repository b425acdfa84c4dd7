"""Where things are and who we are: roots, association, bundle membership, socket and PSK paths.

Owns: the inscriptions root (flag, else `<state root>/inscriptions`), the association (bundle >
session precedence, membership check) and reading the session PSK. The configuration layers, the
state root, the TOML reader, the socket and PSK paths are agentmux's conventions
(`mcphost.agentmux.layers`), shared with the relay (the supervisor's relay reads the operator's
layers the same way); a bundle's members are the bundle file's, read by its one reader in its
lenient mode (`mcphost.agentmux.bundlefile.LENIENT`), the relay's reader in its strict one.

Precedence (agentmux's; the roots' in `mcphost.agentmux.layers`):
- bundle: `--bundle` > `AGENTMUX_BUNDLE` > `mcp.toml` `bundle_name` > `--default-bundle`;
  session: `--session-name` > `AGENTMUX_SESSION` > `mcp.toml` `session_name` > the member whose
  `directory` contains the working directory.

Names are path segments, so both follow agentmux's grammars (`mcphost.names`) before any path
is built: a bundle id `[A-Za-z0-9._-]+` (not `.`/`..`), a session id an ASCII letter then
letters, digits, `-` or `_`, at most 31 characters. A bundle file with a member id outside the grammar (`../../x`) is an
invalid configuration as a whole (as upstream refuses it), a session name outside it is refused,
and `psk_path` answers None for either, so no PSK is ever read from outside `sessions/<id>/`.

An association that was asked for explicitly (flag or env) but cannot be built becomes a
retained *fault*: the server still starts, and relay-backed tools report the fault's code. An
implicit one that fails leaves the server plainly unassociated.

Flags and `AGENTMUX_*` are read by `mcphost.agentmux.settings.AgentmuxSettings` (pydantic-settings,
imported lazily by `resolve` through `layers.settings`).

Must never: log or return the PSK; write anything; import heavy modules at module level (tomllib
and the settings model are imported only when used).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mcphost.agentmux import bundlefile, layers
from mcphost.agentmux.bundlefile import Session
from mcphost.agentmux.layers import ConfigError, configuration_roots, state_root
from mcphost.agentmux.wire import SOCKET_TRUST, RelayError
from mcphost.names import SESSION_ID_EXPECTED, is_bundle_name, is_session_id

__all__ = ["ConfigError", "Layout", "configuration_roots", "resolve", "state_root"]


@dataclass(frozen=True, slots=True)
class Fault:
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Layout:
    """Everything the relay tools know about their place on this machine, resolved once."""

    configuration_roots: tuple[Path, ...]
    state_root: Path
    inscriptions_root: Path
    bundle: str | None = None
    session: str | None = None
    reason: str = "unassociated"
    fault: Fault | None = None
    members: tuple[Session, ...] = field(default=())

    @property
    def associated(self) -> bool:
        return self.bundle is not None and self.session is not None and self.fault is None

    @property
    def socket_path(self) -> Path:
        return layers.socket_path(self.state_root)

    @property
    def principal_id(self) -> str:
        return f"{self.session}@{self.bundle}"

    def psk_path(self) -> Path | None:
        return layers.session_psk_path(self.state_root, self.bundle, self.session)

    def identity_token(self) -> str:
        """The session PSK (trimmed) if its file exists and is non-empty, else `socket-trust`."""
        path = self.psk_path()
        if path is None:
            return SOCKET_TRUST
        try:
            token = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return SOCKET_TRUST
        return token or SOCKET_TRUST

    def configured_bundles(self) -> list[str]:
        """Every bundle id across the configuration layers, sorted lexicographically."""
        return layers.bundle_ids(self.configuration_roots)


# -- membership ------------------------------------------------------------------------------


def load_members(roots: Sequence[Path], bundle: str) -> tuple[Session, ...] | None:
    """The bundle's members in file order, or None when no layer configures the bundle: the
    bundle file's lenient reading (`bundlefile.LENIENT`: what it forgives, and why, is said
    there). A `RelayError` when even that cannot read it (a member id outside the grammar, an
    unreadable or invalid file)."""
    found = bundlefile.load_bundle(roots, bundle, reading=bundlefile.LENIENT)
    return None if found is None else found.sessions


# -- association -----------------------------------------------------------------------------


def _mcp_overrides(roots: Sequence[Path]) -> dict[str, str]:
    try:
        found = layers.first_file(roots, "mcp.toml")
    except ConfigError:
        return {}
    doc: dict[str, Any] = found[1] if found is not None else {}
    out: dict[str, str] = {}
    for key in ("bundle_name", "session_name"):
        value = doc.get(key, doc.get(key.replace("_", "-")))
        if isinstance(value, str) and value:
            out[key] = value
    return out


def _session_from_directory(members: Sequence[Session], cwd: str) -> str | None:
    here = os.path.realpath(cwd)
    matches = []
    for member in members:
        if not member.directory:
            continue
        directory = os.path.realpath(os.path.expanduser(member.directory))
        if here == directory or here.startswith(directory.rstrip("/") + "/"):
            matches.append(member.id)
    if len(matches) > 1:
        raise ConfigError(
            "validation_ambiguous_sender",
            f"working directory {here} matches several sessions: {', '.join(matches)}",
        )
    return matches[0] if matches else None


def resolve(
    *,
    bundle_flag: str | None = None,
    session_flag: str | None = None,
    default_bundle: str | None = None,
    configuration_flags: Sequence[str] = (),
    state_flag: str | None = None,
    inscriptions_flag: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> Layout:
    """Resolve roots and association. Never raises: failures become a `Fault` or unassociation."""
    env = os.environ if env is None else env
    settings = layers.settings(
        env,
        bundle=bundle_flag,
        session=session_flag,
        configuration_directory=tuple(configuration_flags),
        state_directory=state_flag,
    )
    roots = layers.roots_of(settings, env)
    state = layers.state_root_of(settings, env)
    inscriptions = (
        layers.absolute(inscriptions_flag) if inscriptions_flag else state / "inscriptions"
    )
    base = Layout(configuration_roots=roots, state_root=state, inscriptions_root=inscriptions)

    overrides = _mcp_overrides(roots)
    bundle = settings.bundle  # flag or AGENTMUX_BUNDLE: explicit
    explicit = bundle is not None
    bundle = bundle or overrides.get("bundle_name") or default_bundle
    session = settings.session  # flag or AGENTMUX_SESSION
    explicit = explicit or session is not None
    session = session or overrides.get("session_name")

    def fail(code: str, message: str) -> Layout:
        if explicit:
            return replace(
                base, bundle=bundle, session=session, reason="fault", fault=Fault(code, message)
            )
        return replace(base, reason="unassociated")

    if bundle is None:
        if session is not None:
            return fail(
                "validation_unknown_bundle",
                "a session was given but no bundle; pass --bundle or set AGENTMUX_BUNDLE",
            )
        return replace(base, reason="no_bundle")
    if not is_bundle_name(bundle):
        return fail("validation_invalid_params", "bundle_name contains unsupported characters")
    if session is not None and not is_session_id(session):
        return fail(
            "validation_invalid_params",
            f"session_name {session!r} is not a session id: expected {SESSION_ID_EXPECTED}",
        )
    try:
        members = load_members(roots, bundle)
    except RelayError as exc:
        return fail(exc.code, exc.message)
    if members is None:
        where = ", ".join(str(r / "bundles") for r in roots)
        return fail(
            "validation_unknown_bundle", f"bundle '{bundle}' is not configured under {where}"
        )
    if session is None:
        try:
            session = _session_from_directory(members, cwd or os.getcwd())
        except ConfigError as exc:
            return fail(exc.code, exc.message)
        if session is None:
            return replace(base, bundle=bundle, members=members, reason="no_session")
    if session not in {m.id for m in members}:
        return fail(
            "validation_unknown_sender",
            f"session '{session}' is not a member of bundle '{bundle}'",
        )
    return replace(base, bundle=bundle, session=session, members=members, reason="associated")
