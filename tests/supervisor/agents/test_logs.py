"""Per-agent logs: size rotation keeps every file within max_bytes and `keep` old files, holds
what was written last (as a suffix, in order), is private, refuses a planted symlink and keeps
working in the directory it opened when that is swapped for a symlink; `tail`
reads lines across the files and `follow` keeps delivering across a rotation."""

from __future__ import annotations

import asyncio
import os
import stat
import tempfile
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcphost.supervisor.agents.logs import RotatingLog, follow, log_files, tail


def read_all(directory: str) -> bytes:
    """The retained log, oldest file first."""
    data = b""
    for path in reversed(log_files(directory)):
        with open(path, "rb") as f:
            data += f.read()
    return data


def last_lines(data: bytes, n: int) -> bytes:
    if n <= 0:
        return b""
    if data.endswith(b"\n"):
        return b"\n".join(data[:-1].split(b"\n")[-n:]) + b"\n"
    return b"\n".join(data.split(b"\n")[-n:])


def test_rotates_before_a_write_would_exceed_max_bytes(tmp_path: object) -> None:
    directory = str(tmp_path)
    log = RotatingLog(directory, max_bytes=10, keep=2)
    for chunk in (b"aaaa\n", b"bbbb\n", b"cccc\n", b"dddd\n", b"eeee\n", b"ffff\n", b"gg\n"):
        log.write(chunk)
    log.close()
    names = sorted(os.listdir(directory))
    assert names == ["agent.log", "agent.log.1", "agent.log.2"]
    with open(os.path.join(directory, "agent.log"), "rb") as f:
        assert f.read() == b"gg\n"
    with open(os.path.join(directory, "agent.log.1"), "rb") as f:
        assert f.read() == b"eeee\nffff\n"
    with open(os.path.join(directory, "agent.log.2"), "rb") as f:
        assert f.read() == b"cccc\ndddd\n"  # aaaa/bbbb (the oldest) were dropped
    for name in names:
        mode = os.stat(os.path.join(directory, name)).st_mode
        assert stat.S_IMODE(mode) == 0o600


def test_a_chunk_larger_than_max_bytes_is_split(tmp_path: object) -> None:
    directory = str(tmp_path)
    log = RotatingLog(directory, max_bytes=4, keep=5)
    log.write(b"0123456789")
    log.close()
    assert [os.path.getsize(p) for p in log_files(directory)] == [2, 4, 4]
    assert read_all(directory) == b"0123456789"


def test_reopen_appends_and_counts_the_existing_size(tmp_path: object) -> None:
    directory = str(tmp_path)
    RotatingLog(directory, max_bytes=8, keep=1).write(b"abcdef")
    log = RotatingLog(directory, max_bytes=8, keep=1)
    log.write(b"ghi")  # 6 + 3 > 8: rotates first
    log.close()
    assert read_all(directory) == b"abcdefghi"
    assert len(log_files(directory)) == 2


def test_a_planted_symlink_is_not_followed(tmp_path: object) -> None:
    directory = str(tmp_path)
    target = os.path.join(directory, "elsewhere")
    os.symlink(target, os.path.join(directory, "agent.log"))
    with pytest.raises(OSError):
        RotatingLog(directory, max_bytes=100, keep=1)
    assert not os.path.exists(target)


def test_a_directory_swapped_after_opening_redirects_nothing(tmp_path: object) -> None:
    """V8: the log directory is replaced by a symlink once the log is open; rotations still
    rename, create and unlink only in the directory opened, never in what the symlink names."""
    directory = os.path.join(str(tmp_path), "logs")
    target = os.path.join(str(tmp_path), "target")
    os.mkdir(target)
    for name in ("agent.log", "agent.log.1"):
        with open(os.path.join(target, name), "w") as f:
            f.write(f"keep {name}\n")
    before = {n: os.stat(os.path.join(target, n)).st_ino for n in os.listdir(target)}
    log = RotatingLog(directory, max_bytes=10, keep=1)
    os.rename(directory, directory + ".moved")
    os.symlink(target, directory)
    for _ in range(5):
        log.write(b"0123456789")  # a rotation per write
    log.close()
    assert {n: os.stat(os.path.join(target, n)).st_ino for n in os.listdir(target)} == before
    with open(os.path.join(target, "agent.log"), "rb") as f:
        assert f.read() == b"keep agent.log\n"
    assert sorted(os.listdir(directory + ".moved")) == ["agent.log", "agent.log.1"]


@settings(deadline=None, max_examples=60)  # file renames: slow on a busy machine
@given(
    chunks=st.lists(st.binary(min_size=0, max_size=40), max_size=30),
    max_bytes=st.integers(min_value=1, max_value=50),
    keep=st.integers(min_value=0, max_value=4),
    lines=st.integers(min_value=0, max_value=12),
)
def test_rotation_keeps_a_bounded_suffix_and_tail_reads_it(
    chunks: list[bytes], max_bytes: int, keep: int, lines: int
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        log = RotatingLog(directory, max_bytes=max_bytes, keep=keep)
        for chunk in chunks:
            log.write(chunk)
        log.close()
        files = log_files(directory)
        assert len(files) <= keep + 1
        assert all(os.path.getsize(p) <= max_bytes for p in files)
        everything = b"".join(chunks)
        kept = read_all(directory)
        assert everything.endswith(kept)
        if keep >= 1:  # the file before the current one was rotated out only when full
            assert len(kept) >= min(len(everything), max_bytes)
        assert tail(directory, lines) == last_lines(kept, lines)


def test_tail_reads_across_rotated_files(tmp_path: object) -> None:
    directory = str(tmp_path)
    log = RotatingLog(directory, max_bytes=12, keep=3)
    for i in range(10):
        log.write(f"line {i}\n".encode())
    log.write(b"partial")
    log.close()
    assert tail(directory, 3) == b"line 8\nline 9\npartial"
    assert tail(directory, 1) == b"partial"
    assert tail(directory, 100) == read_all(directory)
    assert tail(os.path.join(directory, "missing"), 5) == b""


async def _next(stream: AsyncIterator[bytes], want: bytes) -> bytes:
    got = b""
    while len(got) < len(want):
        got += await asyncio.wait_for(stream.__anext__(), 30)
    return got


def test_follow_delivers_new_bytes_across_rotation(tmp_path: object) -> None:
    directory = str(tmp_path)

    async def scenario() -> None:
        log = RotatingLog(directory, max_bytes=10, keep=1)
        log.write(b"old\n")  # before the follow: not delivered
        stream = follow(directory, poll=0.01)
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)  # the follow's first step runs: it opens the file, seeks the end
        log.write(b"new\n")
        assert await asyncio.wait_for(first, 30) == b"new\n"
        log.write(b"123456789")  # does not fit: rotates, then lands in the new file
        assert await _next(stream, b"123456789") == b"123456789"
        log.write(b"after\n")  # rotates again
        assert await _next(stream, b"after\n") == b"after\n"
        await stream.aclose()
        log.close()

    asyncio.run(scenario())


def test_follow_waits_for_the_file_and_starts_at_its_beginning(tmp_path: object) -> None:
    directory = str(tmp_path)

    async def scenario() -> None:
        stream = follow(directory, poll=0.01)
        pending = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        log = RotatingLog(directory, max_bytes=100, keep=1)
        log.write(b"hello\n")
        assert await asyncio.wait_for(pending, 30) == b"hello\n"
        await stream.aclose()
        log.close()

    asyncio.run(scenario())
