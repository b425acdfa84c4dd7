"""The `MCPHOST_*` tuning variables of a host or supervisor process: the one place each is read
and documented.

Owns: `Tuning` (a model on the settings base, `mcphost.settings`) and `tuning()`, the process's
values read once from `os.environ`. The variables:

    MCPHOST_LOG_LEVEL                 debug | info | warning | error (default info)
    MCPHOST_LOG_FILE                  append the event records to this file, not stderr
    MCPHOST_CALL_TIMEOUT_SECONDS      a center call's timeout (a positive number of seconds)
    MCPHOST_MAX_DOWNLOAD_BYTES        the largest download_file accepts (a positive integer)
    MCPHOST_ALLOW_OTHER_FILESYSTEMS   1/true/yes/on: the file tools may cross mount points

Lenient, as these have always been: a value that does not parse means the default, never a
refusal to start (a tuning knob must not take the host down). Settings with their own models
stay there: `MCPHOST_RELAY_*_TIMEOUT_MS` (`mcphost.relaytools.settings`), `MCPHOST_FLEET`,
`MCPHOST_STATE` (`mcphost.supervisor.cli`) and `MCPHOST_CENTER__*` (`mcphost.supervisor.fleet`).

Must never: read a variable outside this list, or be read from `os.environ` anywhere else.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from mcphost.settings import Settings

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
DEFAULT_MAX_DOWNLOAD = 4 << 30
_TRUE = ("1", "true", "yes", "on")


class Tuning(Settings):
    """The `MCPHOST_*` tuning variables (see the module doc); unparseable values are defaults."""

    model_config = SettingsConfigDict(env_prefix="MCPHOST_")

    log_level: str = Field("info", description="debug, info, warning or error")
    log_file: str | None = Field(None, description="a file to append event records to")
    call_timeout_seconds: float | None = Field(
        None, description="a positive number of seconds (unset: the center client's default)"
    )
    max_download_bytes: int = Field(DEFAULT_MAX_DOWNLOAD, description="a positive integer")
    allow_other_filesystems: bool = Field(False, description="1, true, yes or on")

    @field_validator("log_level", mode="before")
    @classmethod
    def _level(cls, raw: Any) -> str:
        text = str(raw).lower()
        return text if text in LEVELS else "info"

    @field_validator("call_timeout_seconds", mode="before")
    @classmethod
    def _timeout(cls, raw: Any) -> float | None:
        try:
            value = float(raw)
        except (TypeError, ValueError):
            return None
        return value if value > 0 and math.isfinite(value) else None

    @field_validator("max_download_bytes", mode="before")
    @classmethod
    def _bytes(cls, raw: Any) -> int:
        text = str(raw)
        return (
            int(text)
            if text.isascii() and text.isdigit() and int(text) > 0
            else DEFAULT_MAX_DOWNLOAD
        )

    @field_validator("allow_other_filesystems", mode="before")
    @classmethod
    def _flag(cls, raw: Any) -> bool:
        return str(raw).lower() in _TRUE

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Tuning:
        return cls.load(env=env)


@functools.cache
def tuning() -> Tuning:
    """This process's tuning, read from `os.environ` once (a host never changes its own)."""
    return Tuning.from_env(os.environ)
