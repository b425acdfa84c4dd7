"""Configuration files are parsed once while they stay unchanged, and never served stale."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcphost.agentmux import layers as layout
from mcphost.agentmux.layers import ConfigError
from mcphost.agentmux.layers import load_toml as _load_toml


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Treat every file as settled, so a file written by the test may be cached at once."""
    monkeypatch.setattr(layout, "_SETTLED_NS", -(10**18))
    monkeypatch.setattr(layout, "_PARSED", {})


def test_an_unchanged_file_is_parsed_once(tmp_path: Path, settled: None) -> None:
    path = tmp_path / "coders.toml"
    path.write_text("format-version = 1\n")
    first = _load_toml(path)
    assert first == {"format-version": 1}
    assert _load_toml(path) is first  # the same document: not parsed again


def test_an_edit_in_place_is_seen(tmp_path: Path, settled: None) -> None:
    path = tmp_path / "coders.toml"
    path.write_text("format-version = 1\n")
    assert _load_toml(path) == {"format-version": 1}
    with path.open("w") as rewrite:  # same inode, new size
        rewrite.write("format-version = 1\nextra = 'x'\n")
    assert _load_toml(path) == {"format-version": 1, "extra": "x"}


def test_a_file_replaced_by_rename_is_seen_even_with_the_same_size_and_mtime(
    tmp_path: Path, settled: None
) -> None:
    path = tmp_path / "coders.toml"
    path.write_text("a = 1\n")
    assert _load_toml(path) == {"a": 1}
    info = path.stat()
    replacement = tmp_path / "new.toml"
    replacement.write_text("b = 2\n")  # the same size
    os.utime(replacement, ns=(info.st_atime_ns, info.st_mtime_ns))
    replacement.replace(path)  # a new inode, as the supervisor writes its layer
    assert _load_toml(path) == {"b": 2}


def test_a_file_changed_recently_is_parsed_every_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its mtime may be shared with the next edit (coarse file-system clocks): never cached
    until it has settled (here: never, however long the machine takes between the reads)."""
    monkeypatch.setattr(layout, "_SETTLED_NS", 10**18)
    monkeypatch.setattr(layout, "_PARSED", {})
    path = tmp_path / "coders.toml"
    path.write_text("format-version = 1\n")
    first = _load_toml(path)
    assert _load_toml(path) == first and _load_toml(path) is not first


def test_removed_and_broken_files_are_not_served_from_the_cache(
    tmp_path: Path, settled: None
) -> None:
    path = tmp_path / "coders.toml"
    path.write_text("a = 1\n")
    assert _load_toml(path) == {"a": 1}
    path.unlink()
    assert _load_toml(path) is None
    path.write_text("a = \n")
    with pytest.raises(ConfigError):
        _load_toml(path)


def test_the_cache_is_bounded(tmp_path: Path, settled: None) -> None:
    for n in range(layout._PARSED_MAX + 10):
        path = tmp_path / f"b{n}.toml"
        path.write_text(f"n = {n}\n")
        assert _load_toml(path) == {"n": n}
    assert len(layout._PARSED) <= layout._PARSED_MAX
