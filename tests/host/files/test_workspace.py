"""Containment, in process: the pure lexical layer and the descriptor walk, at volume.

Every success is checked against the kernel's own view of the opened descriptor
(`/proc/self/fd/N`): it must lie under the real workspace root. Counted escapes must be 0.
"""

from __future__ import annotations

import os
import posixpath
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from mcphost.errors import ToolFailure
from mcphost.host.files import parse_file_ref
from mcphost.host.workspace import (
    Walker,
    check_destination,
    open_for_upload,
    split_inside,
    workspace_problem,
)
from tests.host.files import corpus
from tests.host.files.conftest import local_binding
from tests.thorough import examples

ROOT = "/srv/ws/agent"


def fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def inside(path: str, root: Path) -> bool:
    real = os.path.realpath(root)
    return path == real or path.startswith(real + "/")


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "ws"
    outside = tmp_path / "wsEvil"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret\n")
    corpus.build(root, outside)
    return root, outside


def attempt_upload(root: Path, given_path: str) -> tuple[str | None, bytes | None]:
    """(code, content): code None means it opened; then the fd must be inside and regular."""
    w = Walker(local_binding(root), given_path)
    try:
        _resolved, fd, _info = open_for_upload(w)
        where = fd_path(fd)
        assert inside(where, root), f"ESCAPE: {given_path!r} opened {where}"
        assert stat.S_ISREG(os.fstat(fd).st_mode)
        return None, os.pread(fd, 1 << 16, 0)
    except ToolFailure as failure:
        return failure.code, None
    finally:
        w.close()


def attempt_destination(root: Path, given_path: str, *, create: bool = False) -> str | None:
    w = Walker(local_binding(root), given_path)
    try:
        resolved = w.parent(create_missing=True)
        check_destination(w, resolved, overwrite=False)
        if create:
            w.make_missing(resolved)
        where = fd_path(resolved.parent_fd)
        assert inside(where, root), f"ESCAPE: {given_path!r} would write in {where}"
        if create:
            w.undo_made(resolved)
        return None
    except ToolFailure as failure:
        return failure.code
    finally:
        w.close()


# -- the hand-written corpus ----------------------------------------------------------------


@pytest.mark.parametrize("template", list(corpus.UPLOAD))
def test_upload_corpus(tree: tuple[Path, Path], template: str) -> None:
    root, _outside = tree
    code, content = attempt_upload(root, corpus.expand(template, root))
    assert code == corpus.UPLOAD[template]
    if code is None:
        assert content is not None and b"secret" not in content


@pytest.mark.parametrize("template", list(corpus.DOWNLOAD))
def test_download_destination_corpus(tree: tuple[Path, Path], template: str) -> None:
    root, outside = tree
    before = sorted(p.name for p in outside.iterdir())
    assert (
        attempt_destination(root, corpus.expand(template, root), create=True)
        == (corpus.DOWNLOAD[template])
    )
    assert sorted(p.name for p in outside.iterdir()) == before
    assert not (root / "fresh").exists()  # created parents were undone


def test_fifo_does_not_block(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    assert attempt_upload(root, "pipe") == ("path_not_regular_file", None)


def test_messages_show_path_and_root(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    with pytest.raises(ToolFailure) as caught:
        split_inside("../../etc/passwd", str(root))
    assert "'../../etc/passwd'" in caught.value.message and str(root) in caught.value.message
    assert caught.value.details["root"] == str(root)


def test_absolute_paths_through_the_roots_real_spelling(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "f.txt").write_text("x")
    os.symlink(real, tmp_path / "alias")
    assert attempt_upload(tmp_path / "alias", str(real / "f.txt"))[0] is None
    assert attempt_upload(tmp_path / "alias", str(tmp_path / "alias" / "f.txt"))[0] is None


# -- root problems --------------------------------------------------------------------------


def test_workspace_problem(tmp_path: Path) -> None:
    assert workspace_problem(local_binding(None)).code == "workspace_root_unset"  # type: ignore[union-attr]
    missing = workspace_problem(local_binding(tmp_path / "nope"))
    assert missing is not None and missing.code == "workspace_root_missing"
    assert str(tmp_path / "nope") in missing.message
    (tmp_path / "file").write_text("x")
    unusable = workspace_problem(local_binding(tmp_path / "file"))
    assert unusable is not None and unusable.code == "workspace_root_unusable"
    assert workspace_problem(local_binding(tmp_path)) is None


def test_deep_parents_are_made_and_undone_holding_few_descriptors(tmp_path: Path) -> None:
    """1,500 missing parents: made 0700 and removed again, never more than a few descriptors
    held (the walk keeps the root, the anchor and the current directory only)."""
    root = tmp_path / "ws"
    (root / "keep").mkdir(parents=True)
    w = Walker(local_binding(root), "keep/" + "/".join(["n"] * 1500) + "/f.bin")
    try:
        resolved = w.parent(create_missing=True)
        assert len(resolved.missing) == 1500 and len(w.fds) == 1
        w.make_missing(resolved)
        assert len(resolved.made) == 1500 and len(w.fds) == 2, len(w.fds)
        assert stat.S_IMODE(os.fstat(resolved.parent_fd).st_mode) == 0o700
        w.undo_made(resolved)
        assert len(w.fds) <= 2, len(w.fds)
    finally:
        w.close()
    assert os.listdir(root / "keep") == []


# -- the pure layer at volume ---------------------------------------------------------------

_NAMES = st.sampled_from(
    ["..", ".", "", "a", "b", "agent", "agentEvil", "srv", "ws", "é", "日本", "...", " ", "a\\b"]
)
_PATHS = st.one_of(
    st.lists(_NAMES, max_size=12).map("/".join),
    st.lists(_NAMES, max_size=12).map(lambda p: "/" + "/".join(p)),
    st.lists(_NAMES, max_size=8).map(lambda p: ROOT + "/" + "/".join(p)),
    st.lists(_NAMES, max_size=8).map(lambda p: ROOT + "Evil/" + "/".join(p)),
    st.text(max_size=60),
)


@examples(full=3000, quick=300)
@given(_PATHS)
def test_split_never_leaves_the_root(given_path: str) -> None:
    try:
        names = split_inside(given_path, ROOT)
    except ToolFailure as failure:
        assert failure.code in ("path_invalid", "path_escapes_workspace")
        if failure.code == "path_escapes_workspace":
            assert repr(given_path) in failure.message and ROOT in failure.message
        return
    joined = posixpath.join(ROOT, *names)
    assert joined == ROOT or joined.startswith(ROOT + "/")
    for name in names:
        assert name not in ("", ".", "..") and "/" not in name and "\0" not in name
    # no symlinks are followed, so lexical resolution must agree with normpath
    oracle = posixpath.normpath(
        given_path if given_path.startswith("/") else posixpath.join(ROOT, given_path)
    )
    if oracle.startswith("//"):
        oracle = oracle[1:]
    assert joined == oracle


@examples(full=1000, quick=100)
@given(st.lists(_NAMES, max_size=10).map("/".join))
def test_split_refuses_whatever_normpath_puts_outside(given_path: str) -> None:
    oracle = posixpath.normpath(posixpath.join(ROOT, given_path))
    if oracle == ROOT or oracle.startswith(ROOT + "/"):
        return
    with pytest.raises(ToolFailure) as caught:
        split_inside(given_path, ROOT)
    assert caught.value.code == "path_escapes_workspace"


# -- the descriptor walk at volume ----------------------------------------------------------

_TREE_NAMES = st.sampled_from(
    [
        "..",
        ".",
        "",
        "a.txt",
        "sub",
        "deeper",
        "b.txt",
        "c.txt",
        "up",
        "link_out",
        "link_out_rel",
        "link_in",
        "link_file_out",
        "link_file_in",
        "loop1",
        "self",
        "slash",
        "dangling",
        "pipe",
        "secret.txt",
        "etc",
        "passwd",
        "wsEvil",
        "ws",
    ]
)


@examples(full=1500, quick=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_TREE_NAMES, max_size=8), st.booleans())
def test_walk_never_opens_outside(
    tree: tuple[Path, Path], names: list[str], absolute: bool
) -> None:
    root, outside = tree
    given_path = "/".join(names)
    if absolute:
        given_path = f"{root}/{given_path}"
    code, content = attempt_upload(root, given_path)
    assert code in corpus.UPLOAD.values() or code in (
        "path_not_found",
        "path_not_a_directory",
    )
    if code is None:
        assert content is not None and b"secret" not in content
    dcode = attempt_destination(root, given_path)
    assert dcode is None or isinstance(dcode, str)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


# -- file references ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("ac://files/01ARZ3NDEKTSV4RRFFQ69G5FAV", True),
        ("01ARZ3NDEKTSV4RRFFQ69G5FAV", True),
        ("01arz3ndektsv4rrffq69g5fav", True),
        (" ac://files/01ARZ3NDEKTSV4RRFFQ69G5FAV ", True),
        ("ac://files/01ARZ3NDEKTSV4RRFFQ69G5FA", False),
        ("ac://files/81ARZ3NDEKTSV4RRFFQ69G5FAV", False),  # first char > 7 overflows
        ("ac://files/01ARZ3NDEKTSV4RRFFQ69G5FAU", False),  # U is not Crockford
        ("ac://transfers/01ARZ3NDEKTSV4RRFFQ69G5FAV", False),
        ("ac://files/../01ARZ3NDEKTSV4RRFFQ69G5FAV", False),
        ("ac://files/01ARZ3NDEKTSV4RRFFQ69G5FAV/x", False),
        ("https://x/01ARZ3NDEKTSV4RRFFQ69G5FAV", False),
        ("", False),
    ],
)
def test_parse_file_ref(value: str, ok: bool) -> None:
    if ok:
        assert parse_file_ref(value) == "01ARZ3NDEKTSV4RRFFQ69G5FAV"
    else:
        with pytest.raises(ToolFailure) as caught:
            parse_file_ref(value)
        assert caught.value.code == "invalid_file_uri"
