"""`mcphost.fsutil`: the one private-directory check and the one atomic write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcphost import fsutil, unixsock


def test_private_dir_creates_0700_and_narrows_a_wider_mode(tmp_path: Path) -> None:
    made = tmp_path / "a" / "b"
    fsutil.private_dir(made, parents=True)
    assert made.is_dir() and (made.stat().st_mode & 0o777) == 0o700
    made.chmod(0o755)
    fsutil.private_dir(made)
    assert (made.stat().st_mode & 0o777) == 0o700
    fsutil.private_dir(made, mode=0o711)
    assert (made.stat().st_mode & 0o777) == 0o711
    made.chmod(0o750)
    fsutil.private_dir(made, mode=None)  # the caller sets the mode itself
    assert (made.stat().st_mode & 0o777) == 0o750


def test_private_dir_refuses_a_symlink_a_file_and_another_owner(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(fsutil.NotPrivate, match="is not a directory"):
        fsutil.private_dir(link)
    assert (real.stat().st_mode & 0o777) == 0o755  # never chmodded through the link
    plain = tmp_path / "file"
    plain.write_text("x")
    with pytest.raises(fsutil.NotPrivate):
        fsutil.private_dir(plain)
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o755)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(fsutil.NotPrivate, match="owned by uid 65534") as caught:
            fsutil.private_dir(theirs)
        assert caught.value.path == str(theirs)
        assert (theirs.stat().st_mode & 0o777) == 0o755


def test_write_atomic_sets_the_exact_mode_whatever_the_umask(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    old = os.umask(0)
    try:
        fsutil.write_atomic(target, "token\n")
        fsutil.write_atomic(tmp_path / "ready.json", b"{}\n", 0o644)
    finally:
        os.umask(old)
    assert target.read_text() == "token\n" and (target.stat().st_mode & 0o777) == 0o600
    assert (tmp_path / "ready.json").stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ready.json", "secret"]


def test_write_atomic_replaces_a_symlink_and_never_writes_through_it(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("keep")
    target = tmp_path / "config.toml"
    target.symlink_to(outside)
    fsutil.write_atomic(target, "new")
    assert outside.read_text() == "keep"
    assert not target.is_symlink() and target.read_text() == "new"


def test_write_atomic_leaves_no_temp_file_when_it_fails(tmp_path: Path) -> None:
    target = tmp_path / "dir-in-the-way"
    (target / "inside").mkdir(parents=True)  # a non-empty directory: the rename fails
    with pytest.raises(OSError):
        fsutil.write_atomic(target, "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir-in-the-way"]
    with pytest.raises(FileNotFoundError):
        fsutil.write_atomic(tmp_path / "missing" / "x", "x")


def test_one_socket_path_rule() -> None:
    assert unixsock.SUN_PATH_MAX == 107
    assert unixsock.fits("/" + "a" * 106) and not unixsock.fits("/" + "a" * 107)
    with unixsock.address("/tmp/" + "s" * 200) as where:
        assert where.startswith("/proc/self/fd/")
