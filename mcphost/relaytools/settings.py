"""The relay tools' settings: agentmux's `AGENTMUX_*` association and roots, and our two
`MCPHOST_RELAY_*_TIMEOUT_MS` overrides, as models on the settings base (`mcphost.settings`).

Owns: reading those variables (and, for `AgentmuxSettings`, the flags that override them) into
frozen values. `AgentmuxSettings` cannot fail: every value is a string whose grammar `layout`
checks, because a bad bundle or session must become a retained fault the server reports per
call, never an exit (agentmux's contract). `RelayTimeouts` can: a value that is not a positive
number of milliseconds exits 2 at start with the variable named.

Must never: be imported by configgen or by `layout` at module level (pydantic-settings costs
start-up; `layout.resolve` imports this lazily), or read anything but the mapping it is given.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from mcphost.settings import Settings

_MS = "a positive number of milliseconds"


class AgentmuxSettings(Settings):
    """Flags > `AGENTMUX_*` for the bundle, the session and the two roots (unset: None/())."""

    model_config = SettingsConfigDict(env_prefix="AGENTMUX_")
    flag_names = {"session": "--session-name"}

    bundle: str | None = None
    session: str | None = None
    # env: `:`-separated; flags: repeatable. Empty parts are dropped.
    configuration_directory: tuple[str, ...] = ()
    state_directory: str | None = None

    @field_validator("configuration_directory", mode="before")
    @classmethod
    def _split(cls, raw: object) -> object:
        if isinstance(raw, str):
            return tuple(part for part in raw.split(":") if part)
        return raw

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str],
        *,
        bundle: str | None = None,
        session: str | None = None,
        configuration_directory: tuple[str, ...] = (),
        state_directory: str | None = None,
    ) -> AgentmuxSettings:
        """Read `env`; a flag given (non-empty) overrides its variable."""
        flags = {
            "bundle": bundle,
            "session": session,
            "configuration_directory": tuple(configuration_directory),
            "state_directory": state_directory,
        }
        return cls.load(env=env, cli={k: v for k, v in flags.items() if v})


class RelayTimeouts(Settings):
    """`MCPHOST_RELAY_REQUEST_TIMEOUT_MS` and `MCPHOST_RELAY_HELLO_TIMEOUT_MS` (upstream's 5000
    and 2000 by default); `*_s` gives them in seconds."""

    model_config = SettingsConfigDict(env_prefix="MCPHOST_RELAY_", allow_inf_nan=False)

    request_timeout_ms: float = Field(5000.0, gt=0, description=_MS)
    hello_timeout_ms: float = Field(2000.0, gt=0, description=_MS)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RelayTimeouts:
        return cls.load(env=os.environ if env is None else env)

    @property
    def request_s(self) -> float:
        return self.request_timeout_ms / 1000.0

    @property
    def hello_s(self) -> float:
        return self.hello_timeout_ms / 1000.0
