"""agentmux's configuration layers and state root, and the ONE reader of their TOML files.

Owns: the roots (flag > env > XDG > home), the TOML reader every caller shares (`load_toml`:
each file parsed once while it stays unchanged; `first_file`: first layer wins per file), the
bundle-id listing across layers (`bundle_ids`: `bundles/` is a union by id), and the paths under
the state root both sides agree on (`socket_path`, `session_psk_path`). The bundle file's one
reader (`bundlefile`: the relay's strict reading, the relay tools' lenient one) and the relay's
other files (`mcphost.relay.config`, `mcphost.relay.policy`) all read through here, so one file
is one document for all: agentmux's `configuration/paths.rs` warns that a bespoke lookup per
reader is how one override came to be honoured by one reader while its sibling stayed inert.

Precedence (agentmux's):
- configuration layers: `--configuration-directory` (repeatable) > `AGENTMUX_CONFIGURATION_DIRECTORY`
  (`:`-separated) > `$XDG_CONFIG_HOME/agentmux` > `~/.config/agentmux`; first layer wins per file,
  `bundles/` union by id. The first source that names a layer is the whole list (a blank part
  or an all-blank value names none; a relative `XDG_CONFIG_HOME` is ignored, as XDG says).
- state root: `--state-directory` > `AGENTMUX_STATE_DIRECTORY` > `$XDG_STATE_HOME/agentmux` >
  `~/.local/state/agentmux`.

Flags and `AGENTMUX_*` are read by `mcphost.agentmux.settings.AgentmuxSettings` (pydantic-settings,
imported lazily); `XDG_*` and `HOME` are only fallbacks and read here.

Must never: import `mcphost.relay` or `mcphost.relaytools` (both sides stand on this); write
anything; build a path from a name outside the grammars of `mcphost.names`; import heavy modules
at module level (tomllib and the settings model are imported only when used).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcphost.errors import CodedFailure
from mcphost.names import is_bundle_name, is_session_id

if TYPE_CHECKING:
    from mcphost.agentmux.settings import AgentmuxSettings

SOCKET_NAME = "relay.sock"


# -- roots -----------------------------------------------------------------------------------


def settings(env: Mapping[str, str], **flags: Any) -> AgentmuxSettings:
    """Flags > `AGENTMUX_*`, read by the settings model (imported here: it costs start-up)."""
    from mcphost.agentmux.settings import AgentmuxSettings

    return AgentmuxSettings.from_env(env, **flags)


def configuration_roots(flags: Sequence[str], env: Mapping[str, str]) -> tuple[Path, ...]:
    return roots_of(settings(env, configuration_directory=tuple(flags)), env)


def state_root(flag: str | None, env: Mapping[str, str]) -> Path:
    return state_root_of(settings(env, state_directory=flag), env)


def roots_of(settings: AgentmuxSettings, env: Mapping[str, str]) -> tuple[Path, ...]:
    """The configuration layers named by `settings`, else the XDG/home default."""
    layers = tuple(absolute(p) for p in settings.configuration_directory if p.strip())
    return layers or (_xdg(env, "XDG_CONFIG_HOME", ".config") / "agentmux",)


def state_root_of(settings: AgentmuxSettings, env: Mapping[str, str]) -> Path:
    """The state root named by `settings`, else the XDG/home default."""
    if settings.state_directory:
        return absolute(settings.state_directory)
    return _xdg(env, "XDG_STATE_HOME", ".local/state") / "agentmux"


def _xdg(env: Mapping[str, str], name: str, fallback: str) -> Path:
    value = env.get(name)
    if value and os.path.isabs(value):
        return Path(value)
    home = env.get("HOME") or os.path.expanduser("~")
    return Path(home) / fallback


def absolute(path: str) -> Path:
    return Path(os.path.abspath(os.path.expanduser(path)))


# -- paths under the state root --------------------------------------------------------------


def socket_path(state: Path) -> Path:
    return state / SOCKET_NAME


def session_psk_path(state: Path, bundle: str | None, session: str | None) -> Path | None:
    """`<state>/bundles/<b>/sessions/<s>/identity.psk`; None when either name is missing or
    outside its grammar (never a path built from such a name)."""
    if bundle is None or session is None:
        return None
    if not is_bundle_name(bundle) or not is_session_id(session):
        return None
    return state / "bundles" / bundle / "sessions" / session / "identity.psk"


# -- the TOML reader -------------------------------------------------------------------------


class ConfigError(CodedFailure):
    """A layer's file that cannot be read or parsed: `code`, `message` (no details), and the
    file's `path`."""

    def __init__(self, code: str, message: str, path: Path | None = None) -> None:
        super().__init__(code, message)
        self.path = path


# Parsed TOML by path, with the stamp it was parsed at: the relay reads the same few files on
# every request, and parsing is most of a request's cost. Bounded: cleared when it grows past
# `_PARSED_MAX` entries (paths come from configured names, so it rarely holds more than a few).
_PARSED: dict[Path, tuple[tuple[int, ...], dict[str, Any]]] = {}
_PARSED_MAX = 256
# A file changed within this long of its last read may share its mtime with the previous
# content (coarse file-system clocks), so it is parsed again until it is older than that.
_SETTLED_NS = 2_000_000_000


def load_toml(path: Path) -> dict[str, Any] | None:
    """The parsed file, None if it does not exist; `ConfigError` if unreadable or invalid.

    A file read again unchanged (same device, inode, size, mtime and ctime, and settled for
    `_SETTLED_NS`) is not parsed again: the same document is returned, which callers must not
    modify. A file replaced by rename (a new inode) or edited in place is parsed afresh."""
    import tomllib

    try:
        with open(path, "rb") as file:
            info = os.fstat(file.fileno())
            stamp = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
            cached = _PARSED.get(path)
            if cached is not None and cached[0] == stamp:
                return cached[1]
            data = file.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(
            "validation_unreadable_configuration_layer", f"cannot read {path}: {exc}", path
        ) from exc
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(
            "validation_invalid_arguments", f"bundle configuration is invalid: {path}: {exc}", path
        ) from exc
    if time.time_ns() - max(info.st_mtime_ns, info.st_ctime_ns) > _SETTLED_NS:
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[path] = (stamp, doc)
    return doc


def first_file(roots: Sequence[Path], relative: str) -> tuple[Path, dict[str, Any]] | None:
    """The first layer's `relative` file, parsed, with its path; None when no layer has it.
    `ConfigError` for the first layer whose file is unreadable or invalid."""
    for root in roots:
        path = root / relative
        doc = load_toml(path)
        if doc is not None:
            return path, doc
    return None


def bundle_ids(roots: Sequence[Path]) -> list[str]:
    """Every bundle id across the configuration layers (union by id), sorted lexicographically."""
    ids: set[str] = set()
    for root in roots:
        try:
            names = os.listdir(root / "bundles")
        except OSError:
            continue
        for name in names:
            stem = name[:-5] if name.endswith(".toml") else ""
            if is_bundle_name(stem):
                ids.add(stem)
    return sorted(ids)
