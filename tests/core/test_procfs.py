"""Reading /proc (mcphost/procfs.py): the pure stat parse, then reads and scans of real processes.

The parse is checked with hypothesis (command names holding `) (`, newlines, digits) and on this
process's own stat; the reads and the scan on real children that name themselves with hostile
command names (spaces, parentheses, a newline, digits that look like fields), and on a /proc
made of files (what vanished or does not parse is not there).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mcphost import procfs
from mcphost.procfs import ProcStat, children_of, own_children, parse_stat, read_stat, scan
from tests.waiting import until

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def stat_line(stat: ProcStat, comm: str) -> str:
    """A `/proc/<pid>/stat` line of 52 fields holding `stat`, as the kernel writes it."""
    times = [stat.cpu_ticks, 0, 0, 0]  # utime stime cutime cstime: only the sum is read
    fields = [
        "S", stat.ppid, stat.pgrp, stat.session, *[0] * 7, *times, *[0] * 4, stat.starttime,
        9, stat.rss_pages, *[7] * 28,
    ]  # fmt: skip
    return f"{stat.pid} ({comm}) {' '.join(str(f) for f in fields)}\n"


# --- parse_stat (pure) ------------------------------------------------------------------------

NUMBERS = st.integers(0, 2**22)


@given(
    stat=st.builds(
        ProcStat,
        pid=st.integers(1, 2**22),
        ppid=NUMBERS,
        pgrp=NUMBERS,
        session=NUMBERS,
        starttime=st.integers(0, 2**63),
        cpu_ticks=st.integers(0, 2**40),
        rss_pages=st.integers(0, 2**40),
    ),
    comm=st.text(st.characters(blacklist_characters="\x00"), max_size=64),
)
@example(stat=ProcStat(5, 4, 3, 2, 1, 0, 0), comm=") (")
@example(stat=ProcStat(5, 4, 3, 2, 1, 6, 7), comm="a) S 9 9 9 (b")
@example(stat=ProcStat(5, 4, 3, 2, 1, 6, 7), comm="x)\n1 2 3 4 5 6")
@example(stat=ProcStat(5, 0, 0, 0, 0, 0, 0), comm="")
@example(stat=ProcStat(5, 4, 3, 2, 1, 6, 7), comm="((((")
@example(stat=ProcStat(5, 4, 3, 2, 1, 6, 7), comm="a b (c) d\n")
def test_parse_stat_reads_the_fields_after_the_last_parenthesis(stat: ProcStat, comm: str) -> None:
    assert parse_stat(stat_line(stat, comm)) == stat


@pytest.mark.parametrize(
    "text",
    [
        "",
        "12 comm S 1 2 3",
        "12 (comm) S 1 2 3",  # too few fields
        "12 (comm) S " + " ".join(["1"] * 20),  # 21 after the name: rss (24) is missing
        "12 (comm " + " ".join(["1"] * 30),  # no closing parenthesis
        "12 comm) " + " ".join(["1"] * 30),  # no opening one
        "x (comm) " + " ".join(["1"] * 30),  # pid not a number
        "12 (comm) S one 2 3 " + " ".join(["1"] * 30),
    ],
)
def test_parse_stat_refuses_what_is_not_a_stat_line(text: str) -> None:
    with pytest.raises(ValueError):
        parse_stat(text)


def test_parse_stat_of_this_process_matches_the_kernel() -> None:
    stat = parse_stat(Path("/proc/self/stat").read_bytes().decode("latin-1"))
    assert (stat.pid, stat.ppid, stat.pgrp, stat.session) == (
        os.getpid(),
        os.getppid(),
        os.getpgrp(),
        os.getsid(0),
    )
    assert stat.rss_pages * PAGE_SIZE > 1_000_000  # a Python process
    times = os.times()
    ticks = (times.user + times.system + times.children_user + times.children_system) * CLOCK_TICKS
    assert abs(stat.cpu_ticks - ticks) <= 2 + ticks * 0.05
    again = read_stat(os.getpid())
    assert again is not None and (again.pid, again.starttime) == (stat.pid, stat.starttime)


def test_read_stat_of_a_pid_that_cannot_exist_is_none() -> None:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert read_stat(pid_max + 1) is None
    assert read_stat(-1) is None


# --- real processes with hostile names ------------------------------------------------------------

# What a process may call itself (prctl(PR_SET_NAME): at most 15 bytes, anything but NUL).
HOSTILE = ["a) (b", "x)\n1 2 3 4 5", ") 0 0 0 0 (", "two words", "((((", "\n"]
NAMED = (
    "import ctypes, sys\n"
    "ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)\n"  # PR_SET_NAME
    "print('named', flush=True)\n"
    "sys.stdin.read()\n"
)


@pytest.fixture
def hostile() -> Iterator[list[subprocess.Popen[str]]]:
    """Children of this process, each named with one of `HOSTILE`, running until the test ends."""
    assert all(0 < len(name.encode()) <= 15 for name in HOSTILE)  # the kernel keeps 15 bytes
    procs = []
    try:
        for name in HOSTILE:
            proc = subprocess.Popen(
                [sys.executable, "-c", NAMED, name],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(proc)
            assert proc.stdout is not None and proc.stdout.readline() == "named\n"
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_hostile_name_changes_nothing_read(hostile: list[subprocess.Popen[str]]) -> None:
    table = scan()
    me = read_stat(os.getpid())
    assert me is not None and table[os.getpid()].starttime == me.starttime
    for proc, name in zip(hostile, HOSTILE, strict=True):
        comm = Path(f"/proc/{proc.pid}/comm").read_bytes()
        assert comm == name.encode() + b"\n", comm  # the kernel took the name as it was given
        stat = read_stat(proc.pid)
        assert stat is not None
        assert (stat.pid, stat.ppid, stat.session) == (proc.pid, os.getpid(), me.session)
        assert stat.starttime >= me.starttime and stat.rss_pages > 0
        assert table[proc.pid] == stat  # the scan reads the same (nothing ran meanwhile)
    kids = children_of(os.getpid())
    assert {p.pid for p in hostile} <= set(kids) and kids == sorted(kids)
    assert {p.pid for p in hostile} <= set(own_children())


def test_children_are_found_by_the_scan_where_the_kernel_has_no_children_file(
    hostile: list[subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.path.exists

    def without_children_files(path: object) -> bool:
        return not str(path).endswith("/children") and real(path)  # type: ignore[arg-type]

    monkeypatch.setattr(procfs.os.path, "exists", without_children_files)
    assert {p.pid for p in hostile} <= set(own_children())


# --- a /proc made of files --------------------------------------------------------------------


def test_the_scan_keeps_what_parses_and_skips_the_rest(tmp_path: Path) -> None:
    good = {
        10: (ProcStat(10, 1, 10, 10, 500, 3, 4), "a) (b"),
        11: (ProcStat(11, 10, 10, 10, 600, 0, 1), "x)\n1 2 3"),
        12: (ProcStat(12, 10, 12, 12, 700, 9, 9), "sh"),
    }
    for pid, (stat, comm) in good.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_bytes(stat_line(stat, comm).encode("latin-1"))
    (tmp_path / "13").mkdir()  # gone since the listing: no stat
    (tmp_path / "14").mkdir()
    (tmp_path / "14" / "stat").write_text("14 (half")  # cut short
    (tmp_path / "self").mkdir()  # not a pid
    (tmp_path / "self" / "stat").write_text(stat_line(good[10][0], "self"))
    (tmp_path / "15").mkdir()
    (tmp_path / "15" / "stat").write_bytes(stat_line(ProcStat(15, 1, 1, 1, 1, 1, 1), "é").encode())
    table = scan(str(tmp_path))
    assert {pid: table[pid] for pid in good} == {pid: stat for pid, (stat, _) in good.items()}
    assert set(table) == {10, 11, 12, 15}  # a name in any bytes is read (latin-1)
    assert children_of(10, str(tmp_path)) == [11, 12]
    assert read_stat(13, str(tmp_path)) is None and read_stat(14, str(tmp_path)) is None
    assert scan(str(tmp_path / "nowhere")) == {}


def test_read_text_reads_one_small_file_or_says_none(tmp_path: Path) -> None:
    path = tmp_path / "memory.current"
    path.write_bytes(b"4096\n\xff")
    assert procfs.read_text(str(path)) == "4096\n\xff"  # latin-1: any byte
    assert procfs.read_text(str(path), 2) == "40"
    assert procfs.read_text(str(tmp_path / "gone")) is None
    assert procfs.read_text(str(tmp_path)) is None  # a directory: read fails


def test_the_state_is_taken_after_the_last_parenthesis() -> None:
    assert procfs.state_of("7 (a) Z 1 2 3) S 1 7 7 0") == "S"
    assert procfs.state_of(f"{os.getpid()} (x) Z 1") == "Z"
    with pytest.raises(ValueError):
        procfs.state_of("7 (comm)")


def test_a_zombie_is_seen_as_one() -> None:
    child = os.fork()
    if child == 0:
        os._exit(0)
    try:
        until(
            lambda: procfs.state_of(procfs.read_text(f"/proc/{child}/stat") or "") == "Z", 30, "z"
        )
    finally:
        os.waitpid(child, 0)
