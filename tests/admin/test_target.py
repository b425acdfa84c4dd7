"""The admin target grammar."""

import pytest

from mcphost.admin.target import TargetError, parse_target


@pytest.mark.parametrize(
    ("raw", "kind", "base", "shown"),
    [
        ("unix:/run/c.sock", "unix", "http://localhost", "unix:/run/c.sock"),
        ("/run/c.sock", "unix", "http://localhost", "unix:/run/c.sock"),
        ("tcp://127.0.0.1:8443", "tcp", "https://127.0.0.1:8443", "tcp://127.0.0.1:8443"),
        ("tcp://center.example:443", "tcp", "https://center.example:443", None),
        ("tcp://[::1]:8443", "tcp", "https://[::1]:8443", "tcp://[::1]:8443"),
    ],
)
def test_accepted(raw: str, kind: str, base: str, shown: str | None) -> None:
    target = parse_target(raw)
    assert target.kind == kind and target.base_url == base
    if shown:
        assert str(target) == shown


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "unix:",
        "unix:rel.sock",
        "http://h:1",
        "https://h:1",
        "tcp://",
        "tcp://host",
        "tcp://h:1/path",
        "tcp://h:0",
        "tcp://h:65536",
        "tcp://[::1]",
        "ftp://x",
    ],
)
def test_rejected(raw: str) -> None:
    with pytest.raises(TargetError):
        parse_target(raw)
