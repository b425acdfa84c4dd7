"""The settings base: pydantic-settings models that read only what they are given and name every
bad setting the way an operator spelled it.

Owns: `Settings`, the base every settings model derives from (`AgentBinding`, the relay tools'
`AGENTMUX_*` and `MCPHOST_RELAY_*` settings, the supervisor's file + env + CLI settings), and
`SettingError`, the one-line operator error. The base config: frozen (assignment raises
`AttributeError`, as a frozen dataclass does), variables matched in upper case only, an env value
is trimmed and an empty one means unset, no JSON decoding of env values, no `.env` or secrets
directory, unknown file keys and init keywords refused.

Sources are explicit: `Model.load(env=..., file=..., cli=...)` reads exactly those, highest
precedence first (a named file must exist): CLI flags (a mapping of the flags that were given, parsed by the caller's own
argparse, e.g. `mcphost.cliargs`), then the environment mapping, then a TOML file. Constructing a
model directly (`Model(field=...)`) reads nothing else, so a test or a caller that builds a value
never picks up the process environment by accident.

Errors: pydantic's `ValidationError` names fields. `load` turns it into a `SettingError` whose
`str()` is one line naming the setting as its source spells it (the env var `AC_MCP_AGENT_ID`,
the file key `/etc/x.toml: restart.delay`, the flag `--state-directory`), showing the value
(never for a field marked secret) and saying what is expected (the field's `description`). A
validator that raises a `SettingError` itself (the pure grammars do) is passed through unchanged;
one that raises `Invalid` gets its key suffix (`command[3]`). Every problem is kept in
`.problems`; `lines()` renders one line per problem. `Settings.problems` is the one translator
of a pydantic error: a model with nested tables (the fleet file) overrides the hooks it calls
(`setting_name`, `expected`, `shown`, `known`) and nothing else.

Must never: read `os.environ` or a file that `load` was not given, or show the value of a field
marked secret (`json_schema_extra={"secret": True}`) in any message.
"""

from __future__ import annotations

import contextvars
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NoReturn, Self

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from mcphost.errors import CodedFailure

ENV, FILE, FLAG = "env", "file", "flag"


class SettingError(CodedFailure, ValueError):
    """A bad setting. `str()` is the first problem's one-line operator message:
    `<name> <problem>: expected <expected>`; `problems` holds every problem found; `details`
    names the setting, the problem and what is expected (never a secret)."""

    code = "bad_setting"
    details: dict[str, str]

    def __init__(
        self, variable: str, shown_value: str | None, expected: str, *, problem: str | None = None
    ) -> None:
        """`variable` is the setting's name as its source spells it (env var, file key, flag);
        `problem` replaces "is <shown_value>" when the value must not be shown."""
        self.variable = variable
        self.shown_value = shown_value
        self.expected = expected
        if problem is not None:
            got = problem
        else:
            got = "is not set" if shown_value is None else f"is {shown_value}"
        self.problem = got
        self.problems: tuple[SettingError, ...] = (self,)
        details = {"variable": variable, "problem": got, "expected": expected}
        super().__init__(self.code, f"{variable} {got}: expected {expected}", details)

    def lines(self) -> list[str]:
        """One operator line per problem, in field order."""
        return [str(p) for p in self.problems]

    def text(self) -> str:
        """Every problem for an operator: the one line when there is one, else their count and
        one indented line each (as `supervise --check` prints them)."""
        lines = self.lines()
        if len(lines) == 1:
            return lines[0]
        return f"{len(lines)} problems:" + "".join(f"\n  {line}" for line in lines)

    @staticmethod
    def gather(problems: Sequence[SettingError]) -> SettingError | None:
        """The first of every problem `problems` hold (each once, in order), holding all of
        them; None when there are none."""
        flat = list(dict.fromkeys(p for problem in problems for p in problem.problems))
        if not flat:
            return None
        flat[0].problems = tuple(flat)
        return flat[0]


class Invalid(ValueError):
    """Raised by a validator: the value is wrong. What is `expected`, what was seen (`shown`,
    or None to hide it), and a `suffix` to the field's key (`[4]` for a list item, `.NAME` for
    a table key). `Settings.problems` names it as the operator wrote the setting."""

    def __init__(self, expected: str, shown: str | None, suffix: str = "") -> None:
        super().__init__(expected)
        self.expected = expected
        self.shown = shown
        self.suffix = suffix


@dataclass
class _Load:
    env: Mapping[str, str] | None
    file: str | None
    cli: Mapping[str, Any] | None
    options: dict[str, Any]
    provenance: dict[str, str] = field(default_factory=dict)


_LOADING: contextvars.ContextVar[_Load | None] = contextvars.ContextVar(
    "mcphost_settings_load", default=None
)


class _MappingEnvSource(EnvSettingsSource):
    """pydantic-settings' env source over a given mapping: values trimmed, empty ones unset, and
    a variable matched in its upper-case spelling only (`ac_mcp_agent_id` is not `AC_MCP_AGENT_ID`;
    the model is case-insensitive so that field `agent_id` finds `AC_MCP_AGENT_ID`)."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._mapping = env
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        out: dict[str, str | None] = {}
        for key, value in self._mapping.items():
            text = value.strip()
            if text and key == key.upper():
                out[key.lower()] = text
        return out


class _Recorded(PydanticBaseSettingsSource):
    """Delegates to a source and records which top-level keys it supplied (first one wins: the
    sources are called highest precedence first)."""

    def __init__(self, inner: PydanticBaseSettingsSource, kind: str, record: dict[str, str]):
        super().__init__(inner.settings_cls)
        self._inner = inner
        self._kind = kind
        self._record = record

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._inner.get_field_value(field, field_name)  # pragma: no cover - unused

    def __call__(self) -> dict[str, Any]:
        values = self._inner()
        for key in values:
            self._record.setdefault(key, self._kind)
        return values


class Settings(BaseSettings):
    """Base for every settings model. Subclasses set `env_prefix` (and may override
    `setting_name` for names that differ from the field-derived ones)."""

    model_config = SettingsConfigDict(
        frozen=True,
        case_sensitive=False,
        env_ignore_empty=True,
        enable_decoding=False,
        extra="forbid",
        validate_by_name=True,
        validate_by_alias=True,
        hide_input_in_errors=True,
        arbitrary_types_allowed=True,
    )

    error_class: ClassVar[type[SettingError]] = SettingError
    # field -> its command-line flag, where it is not `--<field-with-dashes>`
    flag_names: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        load = _LOADING.get()
        if load is None:
            return (init_settings,)
        record = load.provenance
        sources: list[PydanticBaseSettingsSource] = [init_settings]
        if load.cli is not None:
            cli = InitSettingsSource(settings_cls, init_kwargs=dict(load.cli))
            sources.append(_Recorded(cli, FLAG, record))
        if load.env is not None:
            sources.append(_Recorded(_MappingEnvSource(settings_cls, load.env), ENV, record))
        if load.file is not None:
            toml = TomlConfigSettingsSource(settings_cls, toml_file=load.file)
            sources.append(_Recorded(toml, FILE, record))
        return tuple(sources)

    @classmethod
    def load(
        cls,
        *,
        env: Mapping[str, str] | None = None,
        file: str | None = None,
        cli: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Self:
        """Build from the given sources (flags > env > file). `options` reach validators through
        `Settings.load_option(name)`. Raises `cls.error_class` (a `SettingError`)."""
        if file is not None and not os.path.isfile(file):
            # pydantic-settings reads a missing file as empty; a named file must exist.
            raise cls.error_class(
                file, repr(file), "a readable TOML settings file", problem="is not a file"
            )
        state = _Load(env, file, cli, options)
        reset = _LOADING.set(state)
        try:
            return cls()
        except ValidationError as exc:
            raise cls._translate(exc, state) from None
        except (OSError, ValueError) as exc:  # an unreadable or malformed settings file
            if file is None or isinstance(exc, SettingError):
                raise
            if isinstance(exc, tomllib.TOMLDecodeError):
                raise cls.error_class(
                    file,
                    repr(file),
                    "valid TOML (fix it at the line and column given)",
                    problem=f"is not valid TOML: {exc}",
                ) from None
            raise cls.error_class(
                file, repr(file), "a readable TOML settings file", problem=f"is unreadable: {exc}"
            ) from None
        finally:
            _LOADING.reset(reset)

    @staticmethod
    def load_option(name: str, default: Any = None) -> Any:
        """An option given to the `load` call in progress (`default` outside one)."""
        state = _LOADING.get()
        return default if state is None else state.options.get(name, default)

    # -- naming and error translation ------------------------------------------------------

    @classmethod
    def env_name(cls, name: str) -> str:
        info = cls.model_fields.get(name)
        if info is not None and isinstance(info.validation_alias, str):
            return info.validation_alias
        return f"{cls.model_config.get('env_prefix') or ''}{name.upper()}"

    @classmethod
    def setting_name(cls, loc: tuple[str | int, ...], source: str, file: str | None) -> str:
        """How the operator spelled the setting at `loc` (a field name first) in `source`."""
        first = str(loc[0])
        if source == FLAG:
            return cls.flag_names.get(first) or "--" + first.replace("_", "-")
        if source == FILE:
            return f"{file}: {'.'.join(str(part) for part in loc)}"
        return cls.env_name(first)

    @classmethod
    def _field_name(cls, key: str | int) -> str:
        for name, info in cls.model_fields.items():
            if key == name or key == info.validation_alias:
                return name
        return str(key)

    @classmethod
    def expected(cls, loc: tuple[str | int, ...], err: Mapping[str, Any]) -> str:
        """What the setting at `loc` expects: its field's `description`, else pydantic's."""
        info = cls.model_fields.get(str(loc[0]))
        return (info.description if info else None) or err["msg"]

    @classmethod
    def shown(cls, loc: tuple[str | int, ...], value: Any) -> str | None:
        """How a refused value is shown (None: not at all, as for a field marked secret)."""
        info = cls.model_fields.get(str(loc[0]))
        extra = info.json_schema_extra if info else None
        return None if isinstance(extra, dict) and extra.get("secret") else repr(value)

    @classmethod
    def known(cls, loc: tuple[str | int, ...]) -> str:
        """What an unknown key should have been."""
        return "a known setting"

    @classmethod
    def problems(
        cls, err: Mapping[str, Any], source: str = ENV, file: str | None = None
    ) -> list[SettingError]:
        """One pydantic error as the operator's problems, each naming the setting as `source`
        spells it (`setting_name`); a validator's own `SettingError` passes through, an
        `Invalid` keeps its key suffix. The one translator of the settings models."""
        inner = (err.get("ctx") or {}).get("error")
        if isinstance(inner, SettingError):
            return list(inner.problems)
        loc = tuple(err.get("loc") or ())
        if not loc:
            return [cls.error_class(cls.__name__, None, err["msg"], problem="is invalid")]
        loc = (cls._field_name(loc[0]), *loc[1:])
        name = cls.setting_name(loc, source, file)
        if isinstance(inner, Invalid):
            name, shown, expected = name + inner.suffix, inner.shown, inner.expected
        elif err["type"] == "missing":
            return [cls.error_class(name, None, cls.expected(loc, err))]
        elif err["type"] == "extra_forbidden":
            return [cls.error_class(name, None, cls.known(loc), problem="is not one")]
        else:
            shown, expected = cls.shown(loc, err.get("input")), cls.expected(loc, err)
        if shown is None:
            return [cls.error_class(name, None, expected, problem="is invalid (not shown)")]
        return [cls.error_class(name, shown, expected)]

    @classmethod
    def _translate(cls, exc: ValidationError, state: _Load) -> SettingError:
        problems: list[SettingError] = []
        for err in exc.errors():
            loc = err.get("loc") or ("",)
            name = cls._field_name(loc[0])
            source = state.provenance.get(name) or state.provenance.get(str(loc[0]), ENV)
            problems += cls.problems(err, source, state.file)
        return SettingError.gather(problems) or cls.error_class(cls.__name__, None, str(exc))

    # -- frozen like a dataclass: assignment is an AttributeError and never echoes the value --

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot set {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot delete {name!r}")
