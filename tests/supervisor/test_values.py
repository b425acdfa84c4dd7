"""The fleet file's value types (values.py), pure: listen addresses (one accepted form for
`[page]` and `[metrics]`, one message), the `Host` a listener answers (the guard against DNS
rebinding of every HTTP listener), sizes and counts. The loader naming the key of a refused
value: tests/supervisor/test_fleet.py; the guard on a real listener: operator/test_loopback.py,
operator/test_page.py, operator/test_metrics.py."""

from __future__ import annotations

import pytest

from mcphost.supervisor import values
from mcphost.supervisor.values import LISTEN_EXPECTED, Listen, parse_listen

# -- listen addresses ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8765", Listen("127.0.0.1", 8765)),
        ("127.9.9.9:1", Listen("127.9.9.9", 1)),
        ("127.0.0.1:0", Listen("127.0.0.1", 0)),  # a free port, named when it is bound
        ("[::1]:0", Listen("::1", 0)),
        ("[::1]:65535", Listen("::1", 65535)),
        ("localhost:9464", Listen("127.0.0.1", 9464)),  # never resolved
        ("unix:/run/mcphost//metrics.sock", Listen(path="/run/mcphost/metrics.sock")),
    ],
)
def test_a_loopback_address_or_a_unix_socket_is_accepted(text: str, expected: Listen) -> None:
    assert parse_listen(text) == expected
    if expected.path is None and not text.startswith("localhost"):
        assert str(expected) == text  # spelled back as written


@pytest.mark.parametrize(
    "text",
    [
        "0.0.0.0:80", "[::]:80", "10.1.2.3:9464", "192.168.1.2:80", "example.com:9464",
        "[localhost]:80", "::1:80", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:-1",
        "127.0.0.1:+80", "127.0.0.1:\u0668\u0660", " 127.0.0.1:80", "localhost", "",
        "unix:relative.sock", "unix:/run/", "unix:/a\0b", "unix:/" + "x" * 200,
    ],
)  # fmt: skip
def test_anything_else_is_refused_with_the_one_message(text: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_listen(text)
    assert str(caught.value) == LISTEN_EXPECTED
    assert "never a non-loopback address" in LISTEN_EXPECTED


def test_a_loopback_listener_answers_its_own_host_only() -> None:
    for bound in (Listen("127.0.0.1", 8765), Listen("::1", 8765)):
        own = "[::1]:8765" if bound.host == "::1" else "127.0.0.1:8765"
        assert bound.answers(own) and bound.answers(own.upper())
        assert bound.answers("localhost:8765") and bound.answers("LocalHost:8765")
        for other in (
            "rebound.example:8765", "rebound.example", "localhost", "localhost:8766",
            "127.0.0.2:8765", "127.0.0.1", "", None,
        ):  # fmt: skip
            assert not bound.answers(other), (bound, other)


def test_a_unix_socket_answers_any_host() -> None:
    bound = Listen(path="/run/mcphost/metrics.sock")
    assert str(bound) == "unix:/run/mcphost/metrics.sock"
    assert all(bound.answers(host) for host in ("x", "rebound.example:80", "", None))


# -- sizes and counts ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "value"),
    [(1 << 20, 1 << 20), ("512M", 512 << 20), ("2G", 2 << 30), ("2GiB", 2 << 30), ("max", "max")],
)
def test_sizes(raw: object, value: object) -> None:
    assert values.parse_size(raw) == value


@pytest.mark.parametrize("raw", ["12Q", "", -1, 1024, True, 1.5, "1k"])
def test_bad_sizes(raw: object) -> None:
    with pytest.raises(ValueError, match="a number of bytes"):
        values.parse_size(raw)


def test_counts() -> None:
    assert values.parse_count(512) == 512
    assert values.parse_count("max") == values.UNLIMITED == "max"
    for bad in (3, "12", True, 0):
        with pytest.raises(ValueError, match="a whole number of processes"):
            values.parse_count(bad)


@pytest.mark.parametrize(
    ("size", "long", "short"),
    [(0, "0 B", "0B"), (512, "512 B", "512B"), (1024, "1 KiB", "1K"),
     (64 << 20, "64 MiB", "64M"), (67108864 * 32, "2 GiB", "2G"),
     (3 << 29, "1.5 GiB", "1.5G"), (123_456_789, "117 MiB", "117M"), (5 << 40, "5 TiB", "5T")],
)  # fmt: skip
def test_format_size_reads_in_powers_of_1024(size: int, long: str, short: str) -> None:
    """One formatter for every size a person reads (an exit reason, `ctl status`, the page)."""
    assert values.format_size(size) == long
    assert values.format_size(size, short=True) == short


@pytest.mark.parametrize(
    ("number", "shown"),
    [(1.25, "1.3"), (1.15, "1.1"), (1.05, "1.1"), (0.25, "0.3"), (2.0, "2.0"), (-0.05, "-0.1")],
)  # fmt: skip
def test_one_decimal_rounds_as_javascripts_to_fixed(number: float, shown: str) -> None:
    """The fleet page's server and its script write the same figure (node printed these for
    `(n).toFixed(1)`: the exact binary value rounded, a tie away from zero)."""
    assert values.one_decimal(number) == shown
