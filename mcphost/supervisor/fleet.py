"""The fleet file: `[center]`, `[defaults]` and `[[agent]]` (TOML) -> a frozen `Fleet`.

Owns: the fleet file's model and grammar on the settings base (`mcphost.settings`), its loader
(`load_fleet`) and the naming of every problem as the operator wrote it. The loader hands the
file's values to the plan (`mcphost.supervisor.plan`, below this module), which applies every
default to every agent (`AgentPlan`) and which the rest of the supervisor imports. Pure apart
from reading the fleet file `load_fleet` is given (a plan becomes an argv in
`mcphost.supervisor.agents.homes.agent_argv`, where the home's paths are).

Sources, highest precedence first: `cli` (a mapping `{"center": {key: value}}`, named
`--center-<key>` in messages), then the `MCPHOST_CENTER__<KEY>` variables of `env` (e.g.
`MCPHOST_CENTER__ADMIN_URL`, `MCPHOST_CENTER__TOKEN_FILE`), then the file. Only `[center]` can
be overridden: it is the worker's one binding, which a deployment may inject; `[defaults]` and
`[[agent]]` are the fleet itself and come from the file alone (no other `MCPHOST_*` variable is
read here; `MCPHOST_FLEET` and `MCPHOST_STATE` belong to `mcphost supervise`).

Every problem is a `SettingError` naming the file and key (`/etc/x.toml: agent[2].id`), the
variable or the flag, the value, and what is expected; all problems of one load are collected
(`.problems`): a value the models refuse never hides the rest, the cross-field checks still run
on the file with it taken out (a required one stood in for). An unknown key names the known
ones (and the closest). TOML syntax errors say so and name the file, line and column. The
checks:

- `[center]`: `admin_url` (`unix:/abs.sock` or `tcp://host:port`), `fingerprint` (one pin or
  several, comma-separated or a list; required for `tcp://`), `token_file` (an absolute path;
  checked for shape only, never read here: the supervisor reads it; a value that is not an
  absolute path is not shown, it may be the token), `runtime_socket` (absolute, optional),
  `fleet = "file" | "center"`, `poll_seconds`. With `fleet = "center"` the file has no
  `[[agent]]`: the center assigns them (the plan's `plan_from_center`, `fleet_with_agents`).
- `[metrics]` (optional; without it no endpoint) and `[page]` (optional; absent: no page, the
  read-only fleet page of page.py): `listen`, one form for both (`values.parse_listen`): a
  loopback `host:port` (an IP literal of `127.0.0.0/8` or `[::1]`, or `localhost`; port 0: a
  free one) or `unix:/abs.sock`. Anything else is refused here, naming `metrics.listen` or
  `page.listen`, never bound: neither endpoint has authentication, so whoever can connect sees it.
- agent ids: `mcphost.names.AGENT_ID` (a directory name and an `AC_MCP_AGENT_ID`), unique (a
  duplicate names both entries); with a bundle also a relay session id (the relay tools speak
  for the session named after the agent).
- `command`: a non-empty list of strings; the only placeholders are `{mcp_config}`,
  `{workspace}`, `{home}` and `{agent_id}` (`{{` / `}}` for literal braces), and no control
  character but tab, newline and carriage return (a DEL once made the relay's generated
  `coders.toml` unreadable for every bundle); `client = "command"` requires one. `env`: keys
  `[A-Z_][A-Z0-9_]*`, never `AC_MCP_*`, `MCPHOST_*` or `AGENTMUX_*` (the supervisor owns
  those), and no `CODEX_HOME` for a codex agent.
- `bundle`: agentmux's bundle grammar (`mcphost.names`), at most the plan's `BUNDLE_NAME_MAX`
  (128) characters (it names a directory, a file and a relay principal's namespace; agent ids
  are capped at 128 by their grammar). `user`: a user name.
- `runner`: `"auto"` (default), `"process"`, `"tmux"` or `"acp"`; a combination that cannot work (an
  interactive client in a process without a `command`, `user` with tmux) is refused, named at
  the key that asks for it (`mcphost.supervisor.plan` resolves and explains runners).
  `policy`: a relay policy id. `sandbox`: `"auto"` (default) or `"none"`.
- numbers: positive where a zero makes no sense; `restart_max_delay >= restart_delay`.

Every key declares what a reload does with a change of it (`reload_of`, `values.Reload`): the
reload's reply and dry run (reconcile.py) and docs/fleet-keys.md read that one declaration;
`IN_PLACE` (the agent keys a runner applies to a running agent) is made from it.

The checks of a loaded fleet against this machine (`check_users`, `check_sandbox`) are the
plan's: `mcphost supervise` calls them after `load_fleet`, at start and at reload.

Must never: read the token file or any file but the fleet file, read `os.environ` (the caller
passes `env`), or show a token (none is in the file; a non-absolute `token_file` is hidden).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import re
import string
from collections.abc import Mapping
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import SettingsConfigDict

from mcphost.admin.pinning import PinError, parse_pins
from mcphost.admin.target import AdminTarget, TargetError, parse_target
from mcphost.names import AGENT_ID_EXPECTED, SESSION_ID_EXPECTED, is_agent_id, is_session_id
from mcphost.settings import Invalid, SettingError, Settings
from mcphost.supervisor import uids, values
from mcphost.supervisor.plan import (
    BUNDLE_EXPECTED,
    RESERVED_ENV_PREFIXES,
    AgentDefaults,
    CenterConfig,
    Client,
    Fleet,
    FleetSource,
    Restart,
    Runner,
    Sandbox,
    Transport,
    apply_defaults,
    clipped,
    is_fleet_bundle,
    raise_all,
    runner_problem,
)

PLACEHOLDERS = ("mcp_config", "workspace", "home", "agent_id")
ENV_PREFIX = "MCPHOST_CENTER__"

_ENV_KEY = re.compile(r"[A-Z_][A-Z0-9_]*")
# C0 controls but tab, newline and carriage return (a script in an argument has those), DEL,
# and C1: nothing an argv needs, and what turns a generated file or a terminal into garbage.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
_POLICY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_POLICY_EXPECTED = (
    "a relay policy id (letters, digits, '_', '.', '-'; at most 64) defined in policies.toml "
    "or a starter preset (default, operator)"
)
_PLACEHOLDERS_SHOWN = ", ".join("{" + name + "}" for name in PLACEHOLDERS)
_COMMAND_EXPECTED = (
    "a non-empty list of strings (the program, then its arguments) whose only placeholders are "
    f"{_PLACEHOLDERS_SHOWN} (write {{{{ and }}}} for a literal brace)"
)
_ENV_EXPECTED = (
    'a table of NAME = "value" strings, each NAME matching [A-Z_][A-Z0-9_]* and not starting '
    "with AC_MCP_, MCPHOST_ or AGENTMUX_ (the supervisor sets those)"
)
_SECONDS = "a positive number of seconds"
_TARGET_EXPECTED = "unix:/absolute/path.sock or tcp://host:port"
_PIN_EXPECTED = (
    "the center's certificate pin(s): sha256:AB:CD:... (32 hex pairs) or 64 hex digits; "
    "several comma-separated or as a list"
)


# -- the file's sections (pydantic models; structure, types and per-field grammar) -----------


def _check_command(raw: object) -> object:
    if raw is None:
        return None
    if not isinstance(raw, list | tuple) or not raw:
        raise Invalid(_COMMAND_EXPECTED, repr(raw))
    for index, item in enumerate(raw):
        if not isinstance(item, str) or not item or "\0" in item:
            raise Invalid(_COMMAND_EXPECTED, repr(item), f"[{index}]")
        if _CONTROL.search(item):
            raise Invalid(
                "no control characters but tab, newline and carriage return (DEL and the like "
                "have no place in an argv)",
                clipped(item),
                f"[{index}]",
            )
        try:
            parts = list(string.Formatter().parse(item))
        except ValueError:
            raise Invalid(
                "no lone '{' or '}' (write {{ and }} for a literal brace; the placeholders are "
                f"{_PLACEHOLDERS_SHOWN})",
                repr(item),
                f"[{index}]",
            ) from None
        for _literal, name, spec, conversion in parts:
            if name is None:
                continue
            if name not in PLACEHOLDERS or spec or conversion:
                raise Invalid(
                    f"only the placeholders {_PLACEHOLDERS_SHOWN} (found "
                    f"{{{name}{'!' + conversion if conversion else ''}"
                    f"{':' + spec if spec else ''}}}; write {{{{ and }}}} for a literal brace)",
                    repr(item),
                    f"[{index}]",
                )
    return tuple(raw)


def _check_env(raw: object) -> object:
    if not isinstance(raw, Mapping):
        raise Invalid(_ENV_EXPECTED, repr(raw))
    for key, value in raw.items():
        if not isinstance(key, str) or not _ENV_KEY.fullmatch(key):
            raise Invalid(_ENV_EXPECTED, repr(key), f".{key}")
        if key.startswith(RESERVED_ENV_PREFIXES):
            raise Invalid(_ENV_EXPECTED, repr(key), f".{key}")
        if not isinstance(value, str) or "\0" in value:
            raise Invalid("a string without NUL characters", repr(value), f".{key}")
    return dict(raw)


def _check_bundle(raw: object) -> object:
    if isinstance(raw, str) and not is_fleet_bundle(raw):
        raise Invalid(BUNDLE_EXPECTED, clipped(raw))
    return raw


def _check_policy(raw: object) -> object:
    if isinstance(raw, str) and not _POLICY.fullmatch(raw):
        raise Invalid(_POLICY_EXPECTED, repr(raw))
    return raw


def _check_user(raw: object) -> object:
    if isinstance(raw, str) and not _USER.fullmatch(raw):
        raise Invalid("a user name (letters, digits, '_', '.', '-'; at most 32)", repr(raw))
    return raw


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _reload(kind: values.Reload, toggled: values.Reload | None = None) -> dict[str, Any]:
    """A key's declared reload behaviour (`reload_of`); `toggled`: another when the key is set
    where it was not, or taken out."""
    return {"reload": kind.value} | ({"reload_toggled": toggled.value} if toggled else {})


_LIVE, _RESTARTS = _reload(values.Reload.LIVE), _reload(values.Reload.RESTARTS_AGENT)
_REFENCES = _reload(values.Reload.REFENCES)


def _live(*args: Any, **kwargs: Any) -> Any:
    """A field a reload applies in place."""
    return Field(*args, json_schema_extra=_LIVE, **kwargs)


def _restarts(*args: Any, **kwargs: Any) -> Any:
    """A field whose change restarts the agents it touches."""
    return Field(*args, json_schema_extra=_RESTARTS, **kwargs)


_COMMON_VALIDATORS = {
    "policy": _check_policy,
    "command": _check_command,
    "env": _check_env,
    "bundle": _check_bundle,
    "user": _check_user,
}


class _Tunable(_Section):
    """What `[defaults]` sets and every `[[agent]]` may override (None: not given)."""

    client: Client | None = _restarts(None, description='"claude", "codex" or "command"')
    restart: Restart | None = _live(None, description='"always", "on-failure" or "never"')
    tier_tools: bool | None = _restarts(None, description="true or false")
    command: tuple[str, ...] | None = _restarts(None, description=_COMMAND_EXPECTED)
    bundle: str | None = _restarts(None, description=BUNDLE_EXPECTED)
    user: str | None = _restarts(None, description="a user name to run the agent as")
    env: dict[str, str] | None = _restarts(None, description=_ENV_EXPECTED)
    runner: Runner | None = _restarts(
        None,
        description='"auto", "process", "tmux" or "acp" (tmux: the agent runs in a tmux pane; acp: '
        "an Agent Client Protocol agent its bundle's relay drives; auto: tmux for claude or codex "
        "without a command, else process)",
    )
    policy: str | None = _restarts(None, description=_POLICY_EXPECTED)
    sandbox: Sandbox | None = _restarts(
        None,
        description='"auto" (the fence: bubblewrap, with Landlock where the kernel has it) or '
        '"none" (no fence: the agent can read the token and reach the control socket)',
    )
    tmp_size: int | None = _restarts(
        None,
        ge=1 << 20,
        le=1 << 40,
        description="a whole number of bytes, at least 1048576 (each private /tmp, /var/tmp, "
        "/dev/shm of a fenced agent)",
    )
    restart_delay: float | None = _live(None, gt=0, le=3600, description=_SECONDS + " (<= 3600)")
    restart_max_delay: float | None = _live(
        None, gt=0, le=86400, description=_SECONDS + " (<= 86400)"
    )
    max_restarts: int | None = _live(
        None,
        ge=0,
        le=10000,
        description="a whole number of restarts, 0-10000",
    )
    restart_window: float | None = _live(None, gt=0, le=86400, description=_SECONDS + " (<= 86400)")
    stop_grace: float | None = _live(None, gt=0, le=3600, description=_SECONDS + " (<= 3600)")
    log_max_bytes: int | None = _live(
        None,
        ge=4096,
        le=1 << 40,
        description="a whole number of bytes, at least 4096",
    )
    log_keep: int | None = _live(None, ge=0, le=1000, description="a whole number of files, 0-1000")
    # the agent's cgroup (cgroups.py; docs/concepts.md, "Limits"): None is the default
    memory_max: int | str | None = _restarts(None, description=values.SIZE_EXPECTED)
    pids_max: int | str | None = _restarts(None, description=values.COUNT_EXPECTED)
    cpu_weight: int | None = _restarts(None, ge=1, le=10000, description=values.WEIGHT_EXPECTED)
    mcp_transport: Transport | None = _restarts(
        None, description='"pump" (stdio, the default) or "http" (loopback; own uids only)'
    )

    @field_validator("memory_max", "pids_max", mode="before")
    @classmethod
    def _limit(cls, raw: Any, info: ValidationInfo) -> Any:
        if raw is None:
            return None
        parse = values.parse_size if info.field_name == "memory_max" else values.parse_count
        try:
            return parse(raw)
        except ValueError as exc:
            raise Invalid(str(exc), repr(raw)) from None

    @field_validator("command", "env", "bundle", "user", "policy", mode="before")
    @classmethod
    def _grammar(cls, raw: Any, info: ValidationInfo) -> Any:
        # The pure checks above; a `Invalid` keeps the key suffix (`env.FOO`, `command[3]`).
        if raw is None:
            return None
        return _COMMON_VALIDATORS[info.field_name or ""](raw)


class AgentSection(_Tunable):
    id: str = Field(
        json_schema_extra=_reload(values.Reload.STARTS_STOPS), description=AGENT_ID_EXPECTED
    )


class CenterSection(_Section):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)  # env gives strings

    admin_url: str = Field(json_schema_extra=_REFENCES, description=_TARGET_EXPECTED)
    fingerprint: str | tuple[str, ...] | None = _live(None, description=_PIN_EXPECTED)
    token_file: str = Field(
        json_schema_extra=_REFENCES,
        description="the absolute path of the worker token file (0600; read by the supervisor)",
    )
    # set where none was at start, or taken out: sessions keep the runtime client they had
    runtime_socket: str | None = Field(
        None,
        json_schema_extra=_reload(values.Reload.REFENCES, values.Reload.RESTART_SUPERVISOR),
        description="an absolute socket path",
    )
    fleet: FleetSource = Field(
        "file", json_schema_extra=_reload(values.Reload.REFUSED), description='"file" or "center"'
    )
    poll_seconds: float = _live(30.0, gt=0, le=86400, description=_SECONDS + " (<= 86400)")


class _Listening(_Section):
    """A table whose `listen` is an operator's HTTP endpoint (`values.parse_listen`)."""

    listen: str = _live(description=values.LISTEN_EXPECTED)

    @field_validator("listen", mode="before")
    @classmethod
    def _listen(cls, raw: Any) -> Any:
        if not isinstance(raw, str):
            raise Invalid(values.LISTEN_EXPECTED, repr(raw))
        try:
            values.parse_listen(raw)
        except ValueError:
            raise Invalid(values.LISTEN_EXPECTED, clipped(raw)) from None
        return raw


class PageSection(_Listening):
    """`[page]`: the read-only fleet page (off without the table)."""


class MetricsSection(_Listening):
    """`[metrics]`: the Prometheus endpoint (off without the table)."""


class IdentitySection(_Section):
    """`[identity]`: the uids a root supervisor gives its agents (uids.py)."""

    uids: str = _restarts(str(uids.DEFAULT_RANGE), description=uids.RANGE_EXPECTED)

    @field_validator("uids", mode="before")
    @classmethod
    def _range(cls, raw: Any) -> Any:
        if isinstance(raw, str):
            try:
                uids.parse_range(raw)
            except ValueError:
                raise Invalid(uids.RANGE_EXPECTED, clipped(raw)) from None
        return raw


class FleetFile(Settings):
    """The fleet file as read (sources: flags > `MCPHOST_CENTER__*` > the file)."""

    model_config = SettingsConfigDict(env_prefix="MCPHOST_", env_nested_delimiter="__")

    center: CenterSection = Field(
        description="a [center] table with admin_url, token_file (and fingerprint for tcp://)"
    )
    defaults: _Tunable = Field(_Tunable.model_validate({}), description="a [defaults] table")
    agent: tuple[AgentSection, ...] = Field((), description="[[agent]] tables")
    page: PageSection | None = Field(
        None, description='a [page] table with listen = "127.0.0.1:PORT"'
    )
    metrics: MetricsSection | None = Field(
        None, description="a [metrics] table with listen (the Prometheus endpoint; off without it)"
    )
    identity: IdentitySection = Field(
        IdentitySection.model_validate({}), description="an [identity] table with uids"
    )

    @model_validator(mode="wrap")
    @classmethod
    def _named(cls, data: Any, handler: Any) -> FleetFile:
        """Structure first (pydantic), then the cross-field checks; every problem named as the
        operator wrote it. Raises one `SettingError` holding every problem."""
        try:
            model: FleetFile = handler(data)
        except ValidationError as exc:
            found = [problem for err in exc.errors() for problem in cls.problems(err)]
            # The cross-field checks still run, on the file with the bad values taken out, so
            # one bad value never hides the file's other problems.
            rest = _best_effort(data, exc, handler)
            if rest is not None:
                found += _unseen(_cross_checks(rest), found)
            raise_all(found)
        raise_all(_cross_checks(model))
        return model

    # The hooks of the settings translator (`Settings.problems`): keys named as the operator
    # wrote them, in the file or in the flags and variables that may override `[center]`.

    @classmethod
    def setting_name(cls, loc: tuple[str | int, ...], source: str, file: str | None) -> str:
        return _name(loc)

    @classmethod
    def expected(cls, loc: tuple[str | int, ...], err: Mapping[str, Any]) -> str:
        fallback = "a value" if err["type"] == "missing" else err.get("msg", "a valid value")
        return _expected(loc, fallback)

    @classmethod
    def shown(cls, loc: tuple[str | int, ...], value: Any) -> str | None:
        return _shown(loc, value)

    @classmethod
    def known(cls, loc: tuple[str | int, ...]) -> str:
        return _known_keys(loc)


# -- naming problems as the operator wrote them -------------------------------------------


def _key(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _name(loc: tuple[str | int, ...]) -> str:
    """`/etc/x.toml: agent[2].id`, `MCPHOST_CENTER__ADMIN_URL` or `--center-admin-url`."""
    path = Settings.load_option("path", "fleet file")
    if len(loc) >= 2 and loc[0] == "center":
        field = str(loc[1])
        if field in Settings.load_option("cli_center", ()):
            return f"--center-{field.replace('_', '-')}"
        if field in Settings.load_option("env_center", ()):
            return f"{ENV_PREFIX}{field.upper()}"
    return f"{path}: {_key(loc)}"


SECTIONS: dict[str, type[BaseModel]] = {
    "center": CenterSection,
    "defaults": _Tunable,
    "agent": AgentSection,
    "page": PageSection,
    "metrics": MetricsSection,
    "identity": IdentitySection,
}


def table_of(section: str) -> str:
    """How the operator writes `section`'s table: `[center]`, `[[agent]]`."""
    return f"[[{section}]]" if section == "agent" else f"[{section}]"


def reload_of(section: str, key: str, *, toggled: bool = False) -> values.Reload:
    """What a reload does with a change of `key` of `section` (`center`, `defaults`, `agent`,
    `page`, `metrics`, `identity`), as its field declares it; `toggled`: the key set where it was
    not, or taken out."""
    extra = SECTIONS[section].model_fields[key].json_schema_extra
    assert isinstance(extra, dict), f"{section}.{key} declares no reload behaviour"
    declared = extra.get("reload_toggled") if toggled else None
    return values.Reload(str(declared or extra["reload"]))


# The agent keys a running agent's runner applies in place (`plan.needs_restart`).
IN_PLACE = frozenset(
    k for k in _Tunable.model_fields if reload_of("defaults", k) == values.Reload.LIVE
)


def _expected(loc: tuple[str | int, ...], fallback: str) -> str:
    section = SECTIONS.get(str(loc[0])) if loc else None
    fields = [part for part in loc[1:] if isinstance(part, str)]
    if section is not None and fields:
        info = section.model_fields.get(fields[0])
        if info is not None and info.description:
            return info.description
    if loc:
        info = FleetFile.model_fields.get(str(loc[0]))
        if info is not None and info.description and len(loc) == 1:
            return info.description
    return fallback


def _shown(loc: tuple[str | int, ...], value: object) -> str | None:
    if loc[-1:] == ("token_file",) and not (isinstance(value, str) and value.startswith("/")):
        return None  # most likely the token itself
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


_UNSET = "unset--"  # a stand-in agent id (`unset--2`) for one the file does not give usably
_STAND_INS: dict[str, Any] = {"admin_url": "unix:/unset.sock", "token_file": "/unset"}


def _best_effort(data: Any, exc: ValidationError, handler: Any) -> FleetFile | None:
    """The file as it validates with every value pydantic refused taken out (a required one
    replaced by a stand-in), for the cross-field checks; None when it still does not."""
    if not isinstance(data, Mapping):
        return None
    pruned = copy.deepcopy(dict(data))
    for _ in range(4):
        for err in exc.errors():
            _drop(pruned, tuple(err.get("loc") or ()))
        try:
            model: FleetFile = handler(pruned)
            return model
        except ValidationError as again:
            exc = again
    return None


def _drop(data: dict[str, Any], loc: tuple[str | int, ...]) -> None:
    """Take the value at `loc` (cut to its section's field) out of `data`, in place; a required
    one (missing or refused) gets a stand-in."""
    if not loc:
        return
    section = str(loc[0])
    if len(loc) == 1:
        data.pop(section, None)
        if section == "center":
            data["center"] = dict(_STAND_INS)
        return
    holder: Any = data.get(section)
    key: str | int = loc[1]
    if section == "agent":
        if not isinstance(holder, list) or not isinstance(key, int) or key >= len(holder):
            data.pop("agent", None)
            return
        if len(loc) == 2 or not isinstance(holder[key], dict):
            holder[key] = {"id": f"{_UNSET}{key}"}
            return
        holder, key = holder[key], loc[2]
    if not isinstance(holder, dict):
        data.pop(section, None)
        return
    holder.pop(key, None)
    if key == "id" and section == "agent":
        holder["id"] = f"{_UNSET}{loc[1]}"
    elif key in _STAND_INS and section == "center":
        holder[key] = _STAND_INS[key]


def _unseen(problems: list[SettingError], seen: list[SettingError]) -> list[SettingError]:
    """The problems not about a key already reported (or one inside it, or around it), nor about
    a stand-in."""
    names = [p.variable for found in seen for p in found.problems]

    def related(a: str, b: str) -> bool:
        return a == b or a.startswith((b + ".", b + "[")) or b.startswith((a + ".", a + "["))

    return [
        p
        for problem in problems
        for p in problem.problems
        if _UNSET not in str(p) and not any(related(p.variable, name) for name in names)
    ]


def _known_keys(loc: tuple[str | int, ...]) -> str:
    """`a known key of [[agent]] (the closest: 'restart'): id, client, ...`."""
    tables = {name: table_of(name) for name in SECTIONS}
    section = SECTIONS.get(str(loc[0])) if len(loc) > 1 else None
    keys = list(section.model_fields) if section else list(tables)
    if section is AgentSection:
        keys.insert(0, keys.pop(keys.index("id")))
    text = f"a known key of {tables[str(loc[0])]}" if section else "a known table"
    close = difflib.get_close_matches(str(loc[-1]), keys, n=1)
    if close:
        text += f" (the closest: {close[0]!r})"
    return text + ": " + ", ".join(keys if section else tables.values())


def _cross_checks(model: FleetFile) -> list[SettingError]:
    problems: list[SettingError] = []
    center, defaults = model.center, model.defaults
    target: AdminTarget | None = None
    try:
        target = parse_target(center.admin_url)
    except TargetError:
        problems.append(
            SettingError(_name(("center", "admin_url")), repr(center.admin_url), _TARGET_EXPECTED)
        )
    fingerprint = center.fingerprint
    if isinstance(fingerprint, tuple):
        fingerprint = ",".join(fingerprint)
    if fingerprint is not None:
        try:
            parse_pins(fingerprint)
        except PinError:
            problems.append(
                SettingError(
                    _name(("center", "fingerprint")), _shown(("x",), fingerprint), _PIN_EXPECTED
                )
            )
    elif target is not None and target.kind == "tcp":
        problems.append(
            SettingError(
                _name(("center", "fingerprint")),
                None,
                "the center's certificate fingerprint (sha256:AB:CD:...): a tcp:// center is "
                "pinned so the token never reaches an unverified peer",
            )
        )
    for key in ("token_file", "runtime_socket"):
        value = getattr(center, key)
        if value is not None and (not value.startswith("/") or "\0" in value):
            shown = _shown((key,), value)
            problems.append(
                SettingError(
                    _name(("center", key)),
                    shown,
                    "an absolute path",
                    problem=None
                    if shown
                    else "is not an absolute path (not shown: it may be the token itself)",
                )
            )
    if center.fleet == "center":
        if model.agent:
            problems.append(
                SettingError(
                    _name(("agent", 0)),
                    None,
                    'no [[agent]] tables with center.fleet = "center" (the center assigns '
                    "the agents; set their common options in [defaults])",
                    problem="is given",
                )
            )
        problems += _plan_checks(("defaults",), _defaults_of(defaults), None)
    seen: dict[str, int] = {}
    base = _defaults_of(defaults)
    for index, agent in enumerate(model.agent):
        loc: tuple[str | int, ...] = ("agent", index)
        if not is_agent_id(agent.id):
            problems.append(SettingError(_name((*loc, "id")), repr(agent.id), AGENT_ID_EXPECTED))
            continue
        if agent.id in seen:
            problems.append(
                SettingError(
                    _name((*loc, "id")),
                    repr(agent.id),
                    f"a unique agent id ({_key(('agent', seen[agent.id], 'id'))} is "
                    f"{agent.id!r} too)",
                )
            )
        else:
            seen[agent.id] = index
        problems += _plan_checks(loc, base, agent)
    return problems


def _plan_checks(
    loc: tuple[str | int, ...], base: AgentDefaults, agent: AgentSection | None
) -> list[SettingError]:
    """The checks that need every default applied (the key is named where the agent sets it,
    else in [defaults])."""
    problems: list[SettingError] = []
    given = set(agent.model_fields_set) if agent is not None else set()

    def where(key: str) -> str:
        return _name((*loc, key)) if agent is None or key in given else _name(("defaults", key))

    plan = apply_defaults(base, agent.id if agent else "x", _overrides(agent))
    if plan.client == "command" and plan.command is None:
        problems.append(
            SettingError(
                where("command") if agent is None else _name((*loc, "command")),
                None,
                'a command: client = "command" runs exactly the command given',
            )
        )
    if agent is not None and plan.bundle is not None and not is_session_id(plan.agent_id):
        problems.append(
            SettingError(
                _name((*loc, "id")),
                repr(plan.agent_id),
                f"with a bundle, the id is also the agent's relay session id: {SESSION_ID_EXPECTED}",
            )
        )
    requested = agent.runner if agent is not None and agent.runner is not None else base.runner
    problem = runner_problem(plan, requested)
    if problem is not None:
        key, shown, expected = problem
        problems.append(SettingError(where(key), shown, expected))
    if plan.mcp_transport == "http" and plan.runner == "acp":  # stdio in session/new only
        problems.append(SettingError(where("mcp_transport"), "'http'", '"pump" for an ACP agent'))
    if plan.client == "codex" and "CODEX_HOME" in dict(plan.env):
        problems.append(
            SettingError(
                where("env") + ".CODEX_HOME",
                repr(dict(plan.env)["CODEX_HOME"]),
                "no CODEX_HOME: the supervisor points a codex agent at <home>/codex",
            )
        )
    if plan.restart_max_delay < plan.restart_delay:
        problems.append(
            SettingError(
                where("restart_max_delay"),
                repr(plan.restart_max_delay),
                f"at least restart_delay ({plan.restart_delay:g} s)",
            )
        )
    return problems


def _overrides(section: _Tunable | None) -> dict[str, Any] | None:
    """The keys `section` gives, with their values, for `apply_defaults` (None: no section)."""
    if section is None:
        return None
    return {key: getattr(section, key) for key in section.model_fields_set}


def _defaults_of(section: _Tunable) -> AgentDefaults:
    given = {
        key: getattr(section, key)
        for key in section.model_fields_set
        if getattr(section, key) is not None
    }
    if "env" in given:
        given["env"] = tuple(sorted(given["env"].items()))
    return dataclasses.replace(AgentDefaults(), **given)


def load_fleet(
    path: str, *, env: Mapping[str, str] | None = None, cli: Mapping[str, Any] | None = None
) -> Fleet:
    """Read and check the fleet file at `path` (with `MCPHOST_CENTER__*` from `env` and
    `{"center": {...}}` from `cli` overriding its `[center]`). Raises `SettingError`."""
    env_center = {
        key: value
        for key, value in (env or {}).items()
        if key.startswith(ENV_PREFIX) and value.strip()
    }
    cli_center = dict((cli or {}).get("center") or {})
    model = FleetFile.load(
        env=env_center,
        file=path,
        cli=dict(cli) if cli else None,
        path=path,
        env_center={key[len(ENV_PREFIX) :].lower() for key in env_center},
        cli_center=set(cli_center),
    )
    center = model.center
    fingerprint = center.fingerprint
    if isinstance(fingerprint, tuple):
        fingerprint = ",".join(fingerprint)
    config = CenterConfig(
        admin_url=parse_target(center.admin_url),
        pins=parse_pins(fingerprint) if fingerprint else (),
        token_file=os.path.normpath(center.token_file),
        runtime_socket=center.runtime_socket and os.path.normpath(center.runtime_socket),
        fleet=center.fleet,
        poll_seconds=center.poll_seconds,
    )
    defaults = _defaults_of(model.defaults)
    agents = tuple(apply_defaults(defaults, agent.id, _overrides(agent)) for agent in model.agent)
    return Fleet(
        path=os.path.abspath(path),
        center=config,
        agents=agents,
        defaults=defaults,
        page=values.parse_listen(model.page.listen) if model.page is not None else None,
        metrics=values.parse_listen(model.metrics.listen) if model.metrics is not None else None,
        uids=uids.parse_range(model.identity.uids),
    )
