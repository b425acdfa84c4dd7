"""`mcphost.tuning`: the `MCPHOST_*` tuning variables, read in one place and lenient (a value
that does not parse is the default, never a refusal to start)."""

from __future__ import annotations

from mcphost.tuning import DEFAULT_MAX_DOWNLOAD, Tuning


def test_defaults_when_nothing_is_set() -> None:
    t = Tuning.from_env({"PATH": "/bin", "MCPHOST_FLEET": "/etc/fleet.toml"})
    assert (t.log_level, t.log_file, t.call_timeout_seconds) == ("info", None, None)
    assert t.max_download_bytes == DEFAULT_MAX_DOWNLOAD and t.allow_other_filesystems is False


def test_values_are_read_and_trimmed() -> None:
    t = Tuning.from_env(
        {
            "MCPHOST_LOG_LEVEL": "DEBUG",
            "MCPHOST_LOG_FILE": "/tmp/x.log",
            "MCPHOST_CALL_TIMEOUT_SECONDS": " 2.5 ",
            "MCPHOST_MAX_DOWNLOAD_BYTES": "4096",
            "MCPHOST_ALLOW_OTHER_FILESYSTEMS": "Yes",
        }
    )
    assert (t.log_level, t.log_file, t.call_timeout_seconds) == ("debug", "/tmp/x.log", 2.5)
    assert t.max_download_bytes == 4096 and t.allow_other_filesystems is True


def test_unparseable_values_are_the_defaults() -> None:
    t = Tuning.from_env(
        {
            "MCPHOST_LOG_LEVEL": "loud",
            "MCPHOST_CALL_TIMEOUT_SECONDS": "inf",
            "MCPHOST_MAX_DOWNLOAD_BYTES": "-5",
            "MCPHOST_ALLOW_OTHER_FILESYSTEMS": "2",
        }
    )
    assert (t.log_level, t.call_timeout_seconds) == ("info", None)
    assert t.max_download_bytes == DEFAULT_MAX_DOWNLOAD and t.allow_other_filesystems is False
    assert Tuning.from_env({"MCPHOST_CALL_TIMEOUT_SECONDS": "0"}).call_timeout_seconds is None
    assert Tuning.from_env({"MCPHOST_MAX_DOWNLOAD_BYTES": "²"}).max_download_bytes > 0


def test_names_come_from_the_model() -> None:
    assert Tuning.env_name("max_download_bytes") == "MCPHOST_MAX_DOWNLOAD_BYTES"
    assert Tuning.env_name("allow_other_filesystems") == "MCPHOST_ALLOW_OTHER_FILESYSTEMS"
