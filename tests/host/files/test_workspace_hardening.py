"""Workspace hardening through the real `mcphost host` process (issue 10, items 3, 6, 10, 11).

Each test drives the host over raw JSON-RPC (`RawHost`) against the reference center, or
against `StubCenter` where a download must stay in flight, and checks the outcome on disk and
in what the center heard:

- a hard link to a file outside the workspace is refused (`path_hard_linked`), nothing sent;
- a file system mounted inside the workspace is refused (`path_other_filesystem`) unless
  `MCPHOST_ALLOW_OTHER_FILESYSTEMS` allows it;
- a legal file 1,500 directories deep uploads, and downloads to as deep a new path, with the
  usual 1,024-descriptor soft limit set in the host process itself;
- `ok.txt/` is "not a directory", as the kernel would say;
- directories a download creates are 0700;
- a `.part` left by a SIGKILLed download is removed by the next download into that directory,
  while a concurrent in-flight download's temp file is left alone;
- the root is held from start: swapping its path for a symlink to `/` mid-session changes
  nothing, and `mcphost check` warns about a root whose ancestors others can write.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from mcphost.testing import DevCenter
from tests.hardening.conftest import ROOT, RawHost, host_env, run_in_process
from tests.host.files.conftest import mark, since
from tests.host.files.stub_center import FILE_ID as STUB_FILE
from tests.host.files.stub_center import StubCenter
from tests.host.files.test_transfer_cancel import listing, until

# deep (make test-slow): the workspace attack scenarios, host by host.
pytestmark = [pytest.mark.deep, pytest.mark.timeout(300)]

NOFILE = 1024
LIMITED_HOST = [
    "-c",
    "import resource, runpy, sys; "
    "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; "
    f"resource.setrlimit(resource.RLIMIT_NOFILE, ({NOFILE}, hard)); "
    "sys.argv = ['mcphost', 'host']; "
    "runpy.run_module('mcphost.cli', run_name='__main__')",
]


@pytest.fixture(scope="module")
def shared_host(center: DevCenter) -> Iterator[RawHost]:
    """One real host for agent-1 on the center's workspace, shared by the tests that need a
    plainly bound host (a host process costs more than a second of CPU just starting). Each test
    starts from an emptied workspace (the root the host holds stays in place) and uses its own
    files; tests about the process itself (its descriptor limit, its environment, its held root,
    being killed) start their own. Its whole stdout and stderr are checked once it has exited."""
    center.agent_root.mkdir(parents=True, exist_ok=True)
    with RawHost(host_env(center.binding_env("unix"))) as running:
        running.initialize()
        yield running
        running.close()
    assert not running.bad_lines
    assert b"Traceback" not in running.stderr, running.stderr.decode(errors="replace")


@pytest.fixture
def host(shared_host: RawHost, workspace: Path) -> Iterator[RawHost]:
    """The shared host, with what it writes during this test checked at its end: no line that is
    not JSON-RPC, no traceback on stderr (read from where this test began)."""
    lines, start = len(shared_host.bad_lines), len(shared_host.stderr)
    yield shared_host
    assert shared_host.bad_lines[lines:] == []
    mine = bytes(shared_host.stderr[start:])
    assert b"Traceback" not in mine, mine.decode(errors="replace")


@pytest.fixture
def stub() -> Iterator[StubCenter]:
    short = Path(tempfile.mkdtemp(prefix="stub-", dir="/tmp"))  # a short Unix socket path
    try:
        with StubCenter.start(short / "center.sock") as running:
            yield running
    finally:
        for child in short.iterdir():
            child.unlink()
        short.rmdir()


def uploads_named(center: DevCenter, marker: str, filename: str) -> list[dict[str, Any]]:
    return [
        r
        for r in since(center, marker)
        if r["route"] == "/admin/agent-tools/upload_file"
        and isinstance(r.get("body"), dict)
        and r["body"].get("filename") == filename
    ]


def uploaded(host: RawHost, workspace: Path, name: str, data: bytes) -> str:
    (workspace / name).write_bytes(data)
    is_error, result = host.call("upload_file", {"path": name}, timeout=60)
    assert not is_error, result
    return str(result["file_uri"])


# -- item 3: hard links and other file systems ---------------------------------------------


def test_hard_link_to_a_file_outside_is_not_uploaded(
    center: DevCenter, workspace: Path, outside: Path, host: RawHost
) -> None:
    os.link(outside / "secret.txt", workspace / "innocent.txt")
    (workspace / "twin-a.txt").write_text("inside\n")
    os.link(workspace / "twin-a.txt", workspace / "twin-b.txt")
    before = mark(center)
    for name in ("innocent.txt", "twin-b.txt"):
        is_error, result = host.call("upload_file", {"path": name})
        assert is_error and result["error"] == "path_hard_linked", result
        assert result["details"]["links"] == 2 and result["details"]["path"] == name
        assert "copy" in result["message"], result["message"]
    assert not uploads_named(center, before, "innocent.txt")
    assert not uploads_named(center, before, "twin-b.txt")
    # the remedy works: an independent copy uploads
    (workspace / "copy.txt").write_bytes((workspace / "innocent.txt").read_bytes())
    is_error, result = host.call("upload_file", {"path": "copy.txt"})
    assert not is_error, result


@pytest.fixture
def mounted(workspace: Path) -> Iterator[Path]:
    """A tmpfs mounted at `<workspace>/mnt` (another file system than the root's)."""
    point = workspace / "mnt"
    point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "mcphost-test", str(point)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        point.rmdir()
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        assert os.stat(point).st_dev != os.stat(workspace).st_dev
        (point / "f.txt").write_text("on another file system\n")
        (point / "sub").mkdir()
        yield point
    finally:
        subprocess.run(["umount", str(point)], check=True)
        point.rmdir()


def test_other_file_system_is_refused_unless_allowed(
    center: DevCenter, workspace: Path, mounted: Path, host: RawHost
) -> None:
    uri = uploaded(host, workspace, "plain.txt", b"plain\n")
    before = mark(center)
    for path in ("mnt/f.txt", "mnt/sub/../f.txt", f"{workspace}/mnt/f.txt"):
        is_error, result = host.call("upload_file", {"path": path})
        assert is_error and result["error"] == "path_other_filesystem", result
        assert result["details"]["component"] == "mnt"
        assert result["details"]["variable"] == "MCPHOST_ALLOW_OTHER_FILESYSTEMS"
    for dest in ("mnt/copy.txt", "mnt/sub/new/copy.txt"):
        is_error, result = host.call("download_file", {"file": uri, "dest_path": dest})
        assert is_error and result["error"] == "path_other_filesystem", result
    assert not uploads_named(center, before, "f.txt")
    assert not [r for r in since(center, before) if r["method"] == "GET"]
    assert sorted(os.listdir(mounted)) == ["f.txt", "sub"]
    assert os.listdir(mounted / "sub") == []

    allowed = center.binding_env("unix")
    with RawHost(host_env(allowed, MCPHOST_ALLOW_OTHER_FILESYSTEMS="1")) as permissive:
        permissive.initialize()
        is_error, result = permissive.call("upload_file", {"path": "mnt/f.txt"})
        assert not is_error, result
        is_error, result = permissive.call(
            "download_file", {"file": uri, "dest_path": "mnt/sub/copy.txt"}
        )
        assert not is_error, result
    assert (mounted / "sub" / "copy.txt").read_bytes() == b"plain\n"


# -- item 6: descriptors -------------------------------------------------------------------


def test_1500_deep_file_under_the_usual_descriptor_limit(
    center: DevCenter, workspace: Path
) -> None:
    depth = 1500
    with descend(workspace, ["d"] * depth, create=True) as fd:
        leaf = os.open("leaf.txt", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=fd)
        os.write(leaf, b"deep\n")
        os.close(leaf)
    try:
        deep_round_trip(center, workspace, depth)
    finally:  # shutil.rmtree recurses once per level and would hit Python's recursion limit
        subprocess.run(["rm", "-rf", str(workspace / "d"), str(workspace / "n")], check=True)


def deep_round_trip(center: DevCenter, workspace: Path, depth: int) -> None:
    deep = "/".join(["d"] * depth)
    with RawHost(host_env(center.binding_env("unix")), args=LIMITED_HOST) as limited:
        limited.initialize()
        limits = Path(f"/proc/{limited.proc.pid}/limits").read_text()
        line = next(row for row in limits.splitlines() if row.startswith("Max open files"))
        assert line.split()[3] == str(NOFILE), line
        is_error, result = limited.call("upload_file", {"path": f"{deep}/leaf.txt"})
        assert not is_error, result
        assert result["size"] == 5
        new = "/".join(["n"] * depth)
        is_error, copied = limited.call(
            "download_file", {"file": result["file_uri"], "dest_path": f"{new}/copy.txt"}
        )
        assert not is_error, copied
        limited.alive()
        assert b"Traceback" not in limited.stderr
    with descend(workspace, ["n"] * depth) as fd:
        copy = os.open("copy.txt", os.O_RDONLY, dir_fd=fd)
        assert os.read(copy, 100) == b"deep\n"
        os.close(copy)


@contextmanager
def descend(root: Path, names: list[str], *, create: bool = False) -> Iterator[int]:
    """The descriptor of root/names..., walked one `openat` at a time (the path is longer
    than PATH_MAX, so no path string can name it)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in names:
            if create:
                os.mkdir(name, dir_fd=fd)
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


# -- item 10: trailing slash, parent modes, stale temp files --------------------------------


def test_trailing_slash_on_a_file_is_not_a_directory(
    center: DevCenter, workspace: Path, host: RawHost
) -> None:
    uri = uploaded(host, workspace, "ok.txt", b"ok\n")
    (workspace / "dir").mkdir()
    before = mark(center)
    for path in ("ok.txt/", "ok.txt/.", "ok.txt//", f"{workspace}/ok.txt/"):
        is_error, result = host.call("upload_file", {"path": path})
        assert is_error and result["error"] == "path_not_a_directory", (path, result)
        assert result["details"]["component"] == "ok.txt"
    is_error, result = host.call("upload_file", {"path": "dir/"})
    assert is_error and result["error"] == "path_not_regular_file", result
    assert not uploads_named(center, before, "ok.txt")
    is_error, result = host.call(
        "download_file", {"file": uri, "dest_path": "ok.txt/", "overwrite": True}
    )
    assert is_error and result["error"] == "path_not_a_directory", result
    is_error, result = host.call("download_file", {"file": uri, "dest_path": "new/"})
    assert is_error and result["error"] == "destination_is_directory", result
    assert (workspace / "ok.txt").read_bytes() == b"ok\n"
    assert listing(workspace) == ["dir", "ok.txt"]


def test_parents_a_download_creates_are_private(
    center: DevCenter, workspace: Path, host: RawHost
) -> None:
    uri = uploaded(host, workspace, "src.txt", b"src\n")
    is_error, result = host.call("download_file", {"file": uri, "dest_path": "a/b/c/copy.txt"})
    assert not is_error, result
    for made in ("a", "a/b", "a/b/c"):
        assert stat.S_IMODE(os.stat(workspace / made).st_mode) == 0o700, made
    assert stat.S_IMODE(os.stat(workspace / "a/b/c/copy.txt").st_mode) == 0o600


def test_stale_part_is_removed_but_an_in_flight_one_is_not(
    workspace: Path, stub: StubCenter, host: RawHost
) -> None:
    stub.download = os.urandom(1 << 20)
    stub.hold_after = 4096
    (workspace / "dl").mkdir()
    stub_env = host_env(stub.binding_env(workspace))

    # a download killed mid-stream leaves its temp file behind
    with RawHost(stub_env) as doomed:
        doomed.initialize()
        doomed.request("tools/call", {"name": "download_file", "arguments": {
            "file": STUB_FILE,
            "dest_path": "dl/x.bin",
        }})  # fmt: skip
        stale = until(
            lambda: [p for p in os.listdir(workspace / "dl") if p.startswith(".mcphost-")],
            what="the killed download's temp file",
        )
        doomed.proc.send_signal(signal.SIGKILL)
        doomed.proc.wait()
    assert os.listdir(workspace / "dl") == stale and stale[0].endswith(".part")

    # a second download is in flight in the same directory (held by the stub center)
    stub.streaming.clear()
    with RawHost(stub_env) as in_flight:
        in_flight.initialize()
        pending = in_flight.request("tools/call", {"name": "download_file", "arguments": {
            "file": STUB_FILE, "dest_path": "dl/y.bin",
        }})  # fmt: skip
        assert stub.streaming.wait(30)
        live = until(
            lambda: [
                p
                for p in os.listdir(workspace / "dl")
                if p.startswith(".mcphost-") and p != stale[0]
            ],
            what="the in-flight download's temp file",
        )
        # a third download into the same directory cleans the stale one only
        uri = uploaded(host, workspace, "src.bin", b"fresh\n")
        is_error, result = host.call("download_file", {"file": uri, "dest_path": "dl/z.bin"})
        assert not is_error, result
        assert sorted(os.listdir(workspace / "dl")) == sorted([live[0], "z.bin"])
        stub.release()
        answer = in_flight.wait(pending, 60)
        assert not answer["result"]["isError"], answer
    assert (workspace / "dl" / "y.bin").read_bytes() == stub.download
    assert sorted(os.listdir(workspace / "dl")) == ["y.bin", "z.bin"]


# -- item 11: the held root ----------------------------------------------------------------


def test_root_swapped_for_a_symlink_mid_session_changes_nothing(
    center: DevCenter, tmp_path: Path
) -> None:
    parent = tmp_path / "agents"
    root = parent / "ws"
    root.mkdir(parents=True)
    (root / "mine.txt").write_text("mine\n")
    with RawHost(host_env(center.binding_env("unix", agent_root=str(root)))) as host:
        host.initialize()
        is_error, result = host.call("upload_file", {"path": "mine.txt"})
        assert not is_error, result
        uri = result["file_uri"]
        # whoever can write the root's parent swaps the root for a symlink to /
        root.rename(parent / "ws.real")
        root.symlink_to("/")
        before = mark(center)
        for path in ("etc/passwd", "etc/hostname", "/etc/passwd", f"{root}/etc/passwd"):
            is_error, result = host.call("upload_file", {"path": path})
            assert is_error and result["error"] in (
                "path_not_found",
                "path_escapes_workspace",
            ), (path, result)
        assert not uploads_named(center, before, "passwd")
        assert not uploads_named(center, before, "hostname")
        name = f"mcphost-swap-{uuid.uuid4().hex}.txt"
        is_error, result = host.call("download_file", {"file": uri, "dest_path": f"tmp/{name}"})
        assert not is_error, result
        is_error, result = host.call("upload_file", {"path": "mine.txt"})
        assert not is_error, result
    assert not Path("/tmp", name).exists()
    assert (parent / "ws.real" / "tmp" / name).read_text() == "mine\n"


def check_report(env: dict[str, str], *, in_process: bool = False) -> dict[str, Any]:
    """`mcphost check --json` with `env` bound: a real process, or its `main()` in this process
    (`run_in_process`) for a further run once a real one has covered the entry point."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), **env}
    argv = ["check", "--json"]
    if in_process:
        done = run_in_process(argv, env)
    else:
        done = subprocess.run(
            [sys.executable, "-m", "mcphost.cli", *argv], env=env, capture_output=True, timeout=60
        )
    report: dict[str, Any] = json.loads(done.stdout)
    report["exit"] = done.returncode
    return report


def test_check_warns_about_a_root_others_can_swap(center: DevCenter, tmp_path: Path) -> None:
    safe = tmp_path / "safe" / "ws"
    safe.mkdir(parents=True)
    report = check_report(center.binding_env("unix", agent_root=str(safe)))
    assert report["ok"] and report["workspace_warnings"] == [], report

    shared = tmp_path / "shared"
    (shared / "ws").mkdir(parents=True)
    shared.chmod(0o777)
    try:
        report = check_report(
            center.binding_env("unix", agent_root=str(shared / "ws")), in_process=True
        )
    finally:
        shared.chmod(0o755)
    warnings = report["workspace_warnings"]
    assert [w["path"] for w in warnings] == [str(shared)], report
    assert warnings[0]["code"] == "workspace_root_ancestor_writable"
    assert "others" in warnings[0]["message"]
