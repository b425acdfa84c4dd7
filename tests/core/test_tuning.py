"""`mcphost.tuning`: the `MCPHOST_*` tuning variables, read in one place and lenient (a value
that does not parse is the default, never a refusal to start)."""

from __future__ import annotations

from typing import Any

import pytest

from mcphost.tuning import DEFAULT_MAX_DOWNLOAD, Tuning

DEFAULTS = {
    "log_level": "info",
    "log_file": None,
    "call_timeout_seconds": None,
    "max_download_bytes": DEFAULT_MAX_DOWNLOAD,
    "allow_other_filesystems": False,
}

# (field, what the variable holds, what the field reads): parsed values, then ones that fall back
CASES = [
    ("log_level", "DEBUG", "debug"),
    ("log_file", "/tmp/x.log", "/tmp/x.log"),
    ("call_timeout_seconds", " 2.5 ", 2.5),
    ("max_download_bytes", "4096", 4096),
    ("allow_other_filesystems", "Yes", True),
    ("log_level", "loud", "info"),
    ("call_timeout_seconds", "inf", None),
    ("call_timeout_seconds", "0", None),
    ("max_download_bytes", "-5", DEFAULT_MAX_DOWNLOAD),
    ("max_download_bytes", "²", DEFAULT_MAX_DOWNLOAD),
    ("allow_other_filesystems", "2", False),
]


def test_defaults_when_nothing_is_set() -> None:
    tuning = Tuning.from_env({"PATH": "/bin", "MCPHOST_FLEET": "/etc/fleet.toml"})
    assert tuning.model_dump() == DEFAULTS


@pytest.mark.parametrize(("field", "raw", "read"), CASES)
def test_each_variable_is_read_or_falls_back(field: str, raw: str, read: Any) -> None:
    tuning = Tuning.from_env({Tuning.env_name(field): raw})
    assert tuning.model_dump() == {**DEFAULTS, field: read}


def test_names_come_from_the_model() -> None:
    assert Tuning.env_name("max_download_bytes") == "MCPHOST_MAX_DOWNLOAD_BYTES"
    assert Tuning.env_name("allow_other_filesystems") == "MCPHOST_ALLOW_OTHER_FILESYSTEMS"
