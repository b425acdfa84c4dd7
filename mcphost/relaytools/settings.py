"""The relay tools' own settings: our two `MCPHOST_RELAY_*_TIMEOUT_MS` overrides, as a model on
the settings base (`mcphost.settings`). agentmux's `AGENTMUX_*` variables are
`mcphost.agentmux.settings`.

Owns: reading those variables into frozen values. A value that is not a positive number of
milliseconds exits 2 at start with the variable named.

Must never: be imported by configgen or at module level by `layout` (pydantic-settings costs
start-up), or read anything but the mapping it is given.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from mcphost.settings import Settings

_MS = "a positive number of milliseconds"


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
