"""Kernel identity (mcphost/peer.py): the pure walk, then real processes.

The walk is checked over a scripted process table (depth limit, vanishing stats, a reused parent
PID); the stat parse under it is procfs.py's (tests/core/test_procfs.py). The thin
reads are checked against real processes: a child and its grandchild, a process outside the
tree, a grandchild whose parent died, and a real Unix socket whose peer is a child process.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from mcphost import peer
from mcphost.peer import PeerCred, descends_from, find_root, peer_credentials, still_same
from mcphost.procfs import ProcStat, read_stat
from tests.waiting import until

PY = sys.executable
WAIT_STDIN = "import sys; sys.stdin.buffer.read()"
# A child that starts a grandchild, prints the grandchild's pid, and waits for stdin's EOF. The
# grandchild waits for EOF on the child's stdin, or on the fd named by argv[1].
PARENT = (
    "import subprocess, sys\n"
    "fd = int(sys.argv[1]) if len(sys.argv) > 1 else None\n"
    f"g = subprocess.Popen([sys.executable, '-c', {WAIT_STDIN!r}], stdin=fd)\n"
    "print(g.pid, flush=True)\n"
    "sys.stdin.buffer.read()\n"
)


def kernel_at_least(major: int, minor: int) -> bool:
    numbers = platform.release().split("-")[0].split(".")
    return (int(numbers[0]), int(numbers[1])) >= (major, minor)


# --- find_root over a scripted process table (pure walk) -----------------------------------------


def scripted(monkeypatch: pytest.MonkeyPatch, table: dict[int, ProcStat]) -> None:
    monkeypatch.setattr(peer, "read_stat", table.get)


def chain(length: int, start: int = 1000) -> dict[int, ProcStat]:
    """pid start -> start+1 -> ... -> start+length-1 -> 1; each parent older than its child."""
    table = {}
    for i in range(length):
        pid = start + i
        ppid = pid + 1 if i < length - 1 else 1
        table[pid] = ProcStat(pid, ppid, pid, pid, 10_000 - i, cpu_ticks=0, rss_pages=0)
    return table


def test_the_walk_finds_a_root_within_64_steps_and_gives_up_beyond(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = chain(100)
    scripted(monkeypatch, table)
    near = table[1000 + 63]
    far = table[1000 + 64]
    assert find_root(1000, {(near.pid, near.starttime): "near"}, stop=()) == "near"
    assert find_root(1000, {(far.pid, far.starttime): "far"}, stop=()) is None


def test_the_walk_fails_closed_when_a_stat_vanishes(monkeypatch: pytest.MonkeyPatch) -> None:
    table = chain(5)
    root = table[1004]
    del table[1002]  # exited between two reads
    scripted(monkeypatch, table)
    assert find_root(1000, {(root.pid, root.starttime): "agent"}, stop=()) is None


def test_the_walk_stops_at_a_stop_pid_and_at_pid_1(monkeypatch: pytest.MonkeyPatch) -> None:
    table = chain(5)
    root = table[1004]
    scripted(monkeypatch, table)
    roots = {(root.pid, root.starttime): "agent"}
    assert find_root(1000, roots, stop={1002}) is None
    assert find_root(1000, roots, stop={1004}) is None  # a stop pid is never a root
    assert find_root(1, roots, stop=()) is None
    assert find_root(0, roots, stop=()) is None  # SO_PEERCRED's pid for another namespace


def test_a_parent_younger_than_its_child_is_a_reused_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    table = chain(3)
    table[1001] = replace(table[1001], starttime=table[1000].starttime + 1)
    scripted(monkeypatch, table)
    roots = {(1001, table[1001].starttime): "newcomer"}
    assert find_root(1000, roots, stop=()) is None


def test_a_root_with_another_starttime_never_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    table = chain(3)
    scripted(monkeypatch, table)
    assert find_root(1000, {(1002, table[1002].starttime + 1): "old agent"}, stop=()) is None
    assert find_root(1000, {(1000, table[1000].starttime): "itself"}, stop=()) == "itself"


def test_descends_from_walks_the_same_chain_but_fails_closed_as_a_descendant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = chain(5)  # 1000 -> 1001 -> ... -> 1004 -> 1
    scripted(monkeypatch, table)
    assert descends_from(1000, 1003) and descends_from(1000, 1004)
    assert not descends_from(1000, 1000)  # a process is not its own descendant
    assert not descends_from(1000, 999)
    assert not descends_from(1, 1000) and not descends_from(0, 1000)
    assert descends_from(1070, 999)  # no stat at all: the walk broke off, so refused
    table[1002] = replace(table[1002], starttime=table[1001].starttime + 1)
    assert descends_from(1000, 999)  # a reused parent pid: broken, refused
    assert descends_from(1000, 1001)  # found below the break


# --- real processes ---------------------------------------------------------------------------


@pytest.fixture
def family() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A child (a root) and its grandchild; both end when the test closes the child's stdin."""
    child = subprocess.Popen([PY, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdin is not None
    grandchild = int(child.stdout.readline())
    yield child, grandchild
    child.stdin.close()
    child.wait()


def root_of(pid: int) -> tuple[int, int]:
    stat = read_stat(pid)
    assert stat is not None
    return (pid, stat.starttime)


def test_a_grandchild_finds_the_root_it_descends_from(
    family: tuple[subprocess.Popen[bytes], int],
) -> None:
    child, grandchild = family
    roots = {root_of(child.pid): "agent-a"}
    assert find_root(grandchild, roots, stop={os.getpid()}) == "agent-a"
    assert find_root(child.pid, roots, stop={os.getpid()}) == "agent-a"
    me = {root_of(os.getpid()): "me"}
    assert find_root(grandchild, me, stop=()) == "me"  # the walk passes through the child
    assert find_root(grandchild, me, stop={child.pid}) is None
    assert descends_from(grandchild, os.getpid()) and descends_from(grandchild, child.pid)
    assert not descends_from(os.getpid(), os.getpid())


def test_a_process_outside_the_tree_finds_nothing(
    family: tuple[subprocess.Popen[bytes], int],
) -> None:
    child, _ = family
    roots = {root_of(child.pid): "agent-a"}
    outsider = subprocess.Popen([PY, "-c", WAIT_STDIN], stdin=subprocess.PIPE)
    try:
        assert find_root(outsider.pid, roots, stop={os.getpid()}) is None
        assert find_root(os.getpid(), roots, stop=()) is None
    finally:
        outsider.communicate()


def test_a_reused_pid_never_matches(family: tuple[subprocess.Popen[bytes], int]) -> None:
    child, grandchild = family
    pid, starttime = root_of(child.pid)
    assert find_root(grandchild, {(pid, starttime - 1): "earlier process"}, stop=()) is None
    assert find_root(grandchild, {(pid, starttime + 1): "later process"}, stop=()) is None


def test_a_grandchild_whose_parent_died_is_nobodys() -> None:
    """Orphans are reparented (to a subreaper or PID 1): the agent's root is no longer above."""
    reader, writer = os.pipe()
    child = subprocess.Popen(
        [PY, "-c", PARENT, str(reader)],
        pass_fds=(reader,),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    os.close(reader)
    assert child.stdin is not None and child.stdout is not None
    grandchild = int(child.stdout.readline())
    try:
        roots = {root_of(child.pid): "agent-a"}
        assert find_root(grandchild, roots, stop={os.getpid()}) == "agent-a"
        child.stdin.close()
        child.wait()

        def reparented() -> bool:
            stat = read_stat(grandchild)
            return stat is not None and stat.ppid != child.pid

        until(reparented, what="the orphan is reparented")
        assert find_root(grandchild, roots, stop={os.getpid()}) is None
    finally:
        os.close(writer)  # the grandchild reads EOF and exits
        child.stdout.close()


def test_peer_credentials_name_the_connecting_child(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen(1)
        connect = (
            "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
            "s.recv(1)"
        )
        child = subprocess.Popen([PY, "-c", connect, path])
        conn, _ = server.accept()
        with conn:
            cred = peer_credentials(conn)
            try:
                assert (cred.pid, cred.uid, cred.gid) == (child.pid, os.getuid(), os.getgid())
                if kernel_at_least(6, 5):
                    assert cred.pidfd is not None
                if cred.pidfd is not None:
                    fdinfo = Path(f"/proc/self/fdinfo/{cred.pidfd}").read_text()
                    assert f"Pid:\t{child.pid}\n" in fdinfo
                stat = read_stat(cred.pid)
                assert stat is not None and still_same(cred, stat)
                conn.sendall(b"x")  # the child returns from recv and exits
                child.wait()
                assert not still_same(cred, stat)  # reaped: its pidfd reaches nobody
                no_pidfd = PeerCred(cred.pid, cred.uid, cred.gid, None)
                assert not still_same(no_pidfd, stat)  # its stat is gone too
            finally:
                if cred.pidfd is not None:
                    os.close(cred.pidfd)


def test_a_peer_gone_before_it_is_identified_has_pid_0(tmp_path: Path) -> None:
    """Connected, exited and reaped before accept: its PID may already belong to another."""
    path = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen(1)
        connect = "import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])"
        child = subprocess.Popen([PY, "-c", connect, path])
        assert child.wait() == 0  # reaped: its PID is free for reuse
        conn, _ = server.accept()
        with conn:
            cred = peer_credentials(conn)
    try:
        if not kernel_at_least(6, 5):
            assert (cred.pid, cred.pidfd) == (child.pid, None)  # the documented reuse window
        elif cred.pidfd is None:  # a kernel that refuses a pidfd for an exited peer
            assert cred.pid == 0
            assert find_root(cred.pid, {(0, 0): "anyone"}, stop=()) is None
        else:  # newer kernels hand out a pidfd of the exited process: it reaches nobody
            whoever_has_the_pid_now = ProcStat(cred.pid, 1, 1, 1, 0, cpu_ticks=0, rss_pages=0)
            assert not still_same(cred, whoever_has_the_pid_now)
    finally:
        if cred.pidfd is not None:
            os.close(cred.pidfd)


def test_peer_credentials_of_a_socketpair_name_this_process() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        cred = peer_credentials(left)
        try:
            assert (cred.pid, cred.uid, cred.gid) == (os.getpid(), os.getuid(), os.getgid())
            stat = read_stat(os.getpid())
            assert stat is not None and still_same(cred, stat)
            without = PeerCred(cred.pid, cred.uid, cred.gid, None)
            assert still_same(without, stat)  # starttime re-read: unchanged
            moved = replace(stat, starttime=stat.starttime + 1)
            assert not still_same(without, moved)
            other = replace(stat, pid=stat.pid + 1)
            assert not still_same(cred, other)
        finally:
            if cred.pidfd is not None:
                os.close(cred.pidfd)


# /proc/net/tcp rows as the kernel writes them (x86-64: each address word in host order)
PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 101 1
   1: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000 65534        0 102 1
   2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 103 1
   3: garbage
"""
PROC_NET_TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:C350 00000000000000000000000001000000:1F90 01 00000000:00000000 00:00000000 00000000  1001        0 7 1
"""


@pytest.mark.skipif(sys.byteorder != "little", reason="the rows above are a little-endian kernel's")
def test_proc_net_tcp_names_the_owner_of_the_connecting_side_only() -> None:
    client, server = ("127.0.0.1", 0xD431), ("127.0.0.1", 0x1F90)
    assert peer.proc_net_tcp_uid(PROC_NET_TCP, socket.AF_INET, client, server) == 65534
    assert peer.proc_net_tcp_uid(PROC_NET_TCP, socket.AF_INET, server, client) == 0  # accepted
    assert peer.proc_net_tcp_uid(PROC_NET_TCP, socket.AF_INET, client, ("127.0.0.1", 1)) is None
    assert (
        peer.proc_net_tcp_uid(PROC_NET_TCP6, socket.AF_INET6, ("::1", 50000), ("::1", 8080)) == 1001
    )
    assert peer.proc_net_tcp_uid("", socket.AF_INET, client, server) is None


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6])
def test_tcp_owner_uid_of_a_real_loopback_connection_is_the_connecting_process(
    family: socket.AddressFamily,
) -> None:
    host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    with socket.socket(family) as listener, socket.socket(family) as client:
        try:
            listener.bind((host, 0))
        except OSError:
            pytest.skip(f"no {host} here")
        listener.listen()
        client.connect(listener.getsockname()[:2])
        accepted, _ = listener.accept()
        with accepted:
            own, other = accepted.getpeername()[:2], accepted.getsockname()[:2]
            assert peer.tcp_owner_uid(own, other) == os.getuid()
            table = Path("/proc/net/tcp6" if family == socket.AF_INET6 else "/proc/net/tcp")
            assert peer.proc_net_tcp_uid(table.read_text(), family, own, other) == os.getuid()
        client.close()
        assert peer.tcp_owner_uid(("127.0.0.1", 1), ("127.0.0.1", 2)) is None  # none such
