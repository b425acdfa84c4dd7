"""mcphost.unixsock: a stale socket is replaced, a live one (or a non-socket) refused and left
alone, the mode is set before anyone can connect, only our own inode is unlinked, and a path too
long for `sun_path` binds through the directory's fd."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcphost import unixsock
from mcphost.unixsock import SocketPathError


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="usock-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def bound(path: Path, *, listen: int | None = None) -> socket.socket:
    """A socket bound at `path` by someone else (listening with that backlog, or not at all)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with unixsock.address(str(path)) as where:
        sock.bind(where)
    if listen is not None:
        sock.listen(listen)
    return sock


def connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    try:
        with unixsock.address(str(path)) as where:
            sock.connect(where)
    except BaseException:
        sock.close()
        raise
    return sock


def test_a_stale_socket_is_replaced_and_close_unlinks(short_dir: Path) -> None:
    path = short_dir / "s.sock"
    bound(path).close()  # bound, never listening: a dead server's file
    listening = unixsock.listen(str(path), mode=0o600)
    try:
        info = os.lstat(path)
        assert listening.inode == (info.st_dev, info.st_ino)
        connect(path).close()
        assert listening.sock.gettimeout() == 0.0  # non-blocking, for the event loop
    finally:
        listening.close()
    assert not path.exists()


def test_a_live_socket_is_refused_and_left_alone(short_dir: Path) -> None:
    path = short_dir / "s.sock"
    live = bound(path, listen=8)
    try:
        with pytest.raises(SocketPathError) as caught:
            unixsock.listen(str(path))
        assert caught.value.reason == unixsock.IN_USE and caught.value.path == str(path)
        assert str(path) in str(caught.value)
        connect(path).close()  # still the first one's
    finally:
        live.close()


def test_a_full_backlog_counts_as_listening(short_dir: Path) -> None:
    path = short_dir / "s.sock"
    live = bound(path, listen=0)
    waiting: list[socket.socket] = []
    try:
        for _ in range(64):  # fill the backlog until a non-blocking connect would block
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            waiting.append(sock)
            try:
                sock.connect(str(path))
            except BlockingIOError:
                break
        else:
            pytest.skip("the backlog never filled")
        with pytest.raises(SocketPathError) as caught:
            unixsock.listen(str(path))
        assert caught.value.reason == unixsock.IN_USE
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
    finally:
        for sock in waiting:
            sock.close()
        live.close()


def test_a_non_socket_is_refused_and_never_deleted(short_dir: Path) -> None:
    path = short_dir / "s.sock"
    path.write_text("precious")
    with pytest.raises(SocketPathError) as caught:
        unixsock.listen(str(path))
    assert caught.value.reason == unixsock.NOT_A_SOCKET
    assert path.read_text() == "precious"
    (short_dir / "d").mkdir()
    with pytest.raises(SocketPathError, match="not a socket"):
        unixsock.listen(str(short_dir / "d"))
    assert (short_dir / "d").is_dir()


def test_a_socket_that_cannot_be_probed_is_refused_with_its_errno(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = short_dir / "s.sock"
    other = bound(path)
    try:

        def denied(self: socket.socket, address: object) -> None:
            raise PermissionError(errno.EACCES, "Permission denied")

        monkeypatch.setattr(socket.socket, "connect", denied)  # as a mode-0 socket for non-root
        with pytest.raises(SocketPathError) as caught:
            unixsock.listen(str(path))
        monkeypatch.undo()
        assert caught.value.reason == unixsock.UNPROBEABLE and caught.value.errname == "EACCES"
        assert "EACCES" in str(caught.value) and stat.S_ISSOCK(os.lstat(path).st_mode)
    finally:
        other.close()


@pytest.mark.parametrize("mode", [0o600, 0o660])
def test_the_mode_is_set_before_listen_whatever_the_umask(short_dir: Path, mode: int) -> None:
    path = short_dir / "s.sock"
    seen: list[int] = []

    def before_listen(info: os.stat_result) -> None:
        seen.append(stat.S_IMODE(info.st_mode))
        assert stat.S_IMODE(os.lstat(path).st_mode) == mode
        with pytest.raises(ConnectionRefusedError):  # bound, not listening: nobody gets in yet
            connect(path)

    old = os.umask(0)
    try:
        listening = unixsock.listen(str(path), mode=mode, check=before_listen)
    finally:
        os.umask(old)
    try:
        assert seen == [mode]
        assert stat.S_IMODE(os.lstat(path).st_mode) == mode
    finally:
        listening.close()


def test_a_failing_check_closes_the_socket_and_propagates(short_dir: Path) -> None:
    path = short_dir / "s.sock"

    def refuse(info: os.stat_result) -> None:
        raise SocketPathError(str(path), unixsock.REPLACED)

    with pytest.raises(SocketPathError) as caught:
        unixsock.listen(str(path), check=refuse)
    assert caught.value.reason == unixsock.REPLACED
    with pytest.raises(ConnectionRefusedError):
        connect(path)  # never listened; the file is stale now and the next bind replaces it
    unixsock.listen(str(path)).close()


def test_only_our_own_inode_is_unlinked(short_dir: Path) -> None:
    path = short_dir / "s.sock"
    listening = unixsock.listen(str(path))
    listening.sock.close()
    other = bound(short_dir / "other.sock", listen=1)
    os.rename(short_dir / "other.sock", path)  # someone else took the path over meanwhile
    try:
        listening.unlink()
        listening.close()
        assert stat.S_ISSOCK(os.lstat(path).st_mode), "another server's socket stays"
        connect(path).close()
    finally:
        other.close()

    mine = unixsock.listen(str(short_dir / "t.sock"))
    mine.unlink()
    assert not (short_dir / "t.sock").exists()
    bound(short_dir / "t.sock").close()  # a new file at the path, maybe the same inode number
    mine.unlink()  # forgotten after the first unlink: left alone
    assert stat.S_ISSOCK(os.lstat(short_dir / "t.sock").st_mode)


def test_a_path_too_long_for_sun_path_binds_through_the_directory_fd(short_dir: Path) -> None:
    deep = short_dir / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = deep / "s.sock"
    assert len(os.fsencode(str(path))) > 108  # sun_path cannot hold it
    bound(path).close()  # stale, at the long path
    listening = unixsock.listen(str(path), mode=0o600)
    try:
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        connect(path).close()
        with pytest.raises(SocketPathError) as caught:
            unixsock.listen(str(path))  # probed through the fd as well
        assert caught.value.reason == unixsock.IN_USE
    finally:
        listening.close()
    assert not path.exists()
