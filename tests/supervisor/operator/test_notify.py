"""notify.py: the sd_notify datagram, its address, and NOTIFY_SOCKET taken out of the
environment (the whole protocol against a real supervisor: test_supervise_notify.py)."""

from __future__ import annotations

import socket

from mcphost.supervisor.operator.notify import Notifier, address_of, message


def test_an_at_sign_names_an_abstract_socket() -> None:
    assert address_of("@/org/freedesktop/systemd1/notify") == "\0/org/freedesktop/systemd1/notify"
    assert address_of("/run/systemd/notify") == "/run/systemd/notify"


def test_a_message_is_one_line_per_field_and_a_value_stays_on_its_line() -> None:
    assert message(READY=1, STATUS="2 agents\nmore") == b"READY=1\nSTATUS=2 agents more"


def test_take_removes_notify_socket_from_the_environment() -> None:
    environ = {"NOTIFY_SOCKET": "@x", "PATH": "/bin"}
    assert Notifier.take(environ).address == "\0x"
    assert environ == {"PATH": "/bin"}
    assert Notifier.take({}).address is None


def test_without_a_socket_nothing_is_sent() -> None:
    assert Notifier(None).ready("x") is False


def test_a_datagram_reaches_an_abstract_socket() -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
        manager.bind("\0mcphost-test-notify-unit")
        assert Notifier("\0mcphost-test-notify-unit").stopping() is True
        assert manager.recv(4096) == b"STOPPING=1\nSTATUS=stopping"
