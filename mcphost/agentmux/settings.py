"""agentmux's `AGENTMUX_*` association and roots as a model on the settings base (`mcphost.settings`).

Owns: reading those variables (and the flags that override them) into frozen values.
`AgentmuxSettings` cannot fail: every value is a string whose grammar `layers` and the relay
tools' `layout` check, because a bad bundle or session must become a retained fault the server
reports per call, never an exit (agentmux's contract).

Must never: be imported by configgen or by `layers` at module level (pydantic-settings costs
start-up; `layers` imports this lazily), or read anything but the mapping it is given.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import field_validator
from pydantic_settings import SettingsConfigDict

from mcphost.settings import Settings


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
