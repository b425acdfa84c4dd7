"""README's install path works as written, the systemd unit runs what it installs, and
`make system` waits for another apt's dpkg lock instead of failing (issue 34, "Install").

- The install commands are read from README's "Install" block and run as they stand, with
  `/opt/mcphost` and the checkout's path replaced by temporary ones: a fresh virtualenv, this
  checkout installed into it by pip (pip's own cache; no registry serves mcphost), its
  `mcphost --version` and `--help` (slow: a whole pip install).
- The virtualenv README names is the one the unit's `ExecStart` runs (a doc check).
- `make system` with a missing package, as root, against a dpkg lock file of the test's (the
  Makefile's `DPKG_LOCK`) held with the very lock apt and dpkg take (fcntl, `F_SETLK`): it says
  once that it waits, runs no apt while the lock is held, and goes on when it is released; with
  a bound of one second it gives up, saying what to do. `APT_GET` names a stand-in that records
  its arguments: apt itself is not what is tested, the wait before it is.
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waiting import until

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
UNIT = ROOT / "contrib" / "systemd" / "mcphost-supervisor.service"
ROOT_USER = os.geteuid() == 0


def install_block() -> list[str]:
    """The command lines of README's first `sh` block under "## Install"."""
    text = README.read_text()
    section = text.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "README's Install section has no sh block"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def venv_dir() -> str:
    """Where README's `python3 -m venv` puts the virtualenv."""
    for line in install_block():
        words = shlex.split(line)
        if words[:3] == ["python3", "-m", "venv"]:
            return words[3]
    raise AssertionError("README's Install block makes no virtualenv")


def exec_start_binary() -> str:
    for line in UNIT.read_text().splitlines():
        if line.startswith("ExecStart=") and line != "ExecStart=":
            return shlex.split(line.removeprefix("ExecStart="))[0]
    raise AssertionError(f"{UNIT} has no ExecStart")


def test_readme_s_install_path_is_the_unit_s_execstart() -> None:
    binary = os.path.join(venv_dir(), "bin", "mcphost")
    assert exec_start_binary() == binary
    # README runs that very binary after installing it
    assert f"{binary} --version" in install_block()


@pytest.mark.slow
def test_readme_s_install_commands_install_a_working_mcphost(tmp_path: Path) -> None:
    lines = install_block()
    target = venv_dir()
    clones = [shlex.split(line) for line in lines if line.startswith("git clone ")]
    assert clones, "README's Install block clones no checkout"
    source = clones[0][-1]
    # a fresh clone's files (the tracked tree as it is in this worktree, uncommitted edits too)
    checkout = tmp_path / "src"
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, (os.fsdecode(n) for n in listed)):
        if (ROOT / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, checkout / name)
    venv = tmp_path / "venv"
    ran = 0
    for line in lines:
        if not (line.startswith("python3 -m venv ") or line.startswith(target + "/")):
            continue  # apt-get and git: the machine's packages and the checkout, made above
        command = line.replace(source, str(checkout)).replace(target, str(venv))
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{command}: {done.stderr[-3000:]}"
        ran += 1
    assert ran >= 3  # venv, pip install, --version
    mcphost = venv / "bin" / "mcphost"
    version = subprocess.run([mcphost, "--version"], capture_output=True, text=True, check=True)
    assert (version.stdout + version.stderr).startswith("mcphost 0.")
    usage = subprocess.run([mcphost, "--help"], capture_output=True, text=True, check=True)
    shown = usage.stdout + usage.stderr  # stdout is JSON-RPC's; the usage goes to stderr
    assert "supervise" in shown and "ctl" in shown
    # the installed package, not this checkout, is what runs
    where = subprocess.run(
        [venv / "bin" / "python", "-c", "import mcphost; print(mcphost.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    assert where.startswith(str(venv))


# -- make system and the dpkg lock ------------------------------------------------------------


class HeldLock:
    """A dpkg lock file held as apt holds it (an fcntl write lock) until `release`."""

    def __init__(self, path: Path) -> None:
        path.touch()
        self.fd = os.open(path, os.O_RDWR)
        fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def make_system(tmp_path: Path, lock: Path, wait: int) -> tuple[subprocess.Popen[str], Path, Path]:
    """`make system` for one package whose program is nowhere, with a stand-in apt-get that
    writes its arguments to `called`; stderr to `errors`."""
    called = tmp_path / "apt-called"
    apt = tmp_path / "apt-get"
    apt.write_text(f'#!/bin/sh\necho "$@" >> {called}\n')
    apt.chmod(0o755)
    errors = tmp_path / "stderr"
    process = subprocess.Popen(
        [
            "make",
            "-s",
            "--no-print-directory",
            "-C",
            str(ROOT),
            "system",
            "PACKAGES=mcphost-test-pkg:mcphost-no-such-program",
            f"DPKG_LOCK={lock}",
            f"LOCK_WAIT={wait}",
            f"APT_GET={apt}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=errors.open("w"),
        text=True,
    )
    return process, called, errors


@pytest.mark.skipif(not ROOT_USER, reason="make system installs only as root")
@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_system_waits_for_the_dpkg_lock_and_says_so_once(tmp_path: Path) -> None:
    lock = tmp_path / "lock-frontend"
    held = HeldLock(lock)
    process, called, errors = make_system(tmp_path, lock, wait=300)
    try:
        until(lambda: "waiting for the dpkg lock" in errors.read_text(), what="the wait's line")
        assert process.poll() is None and not called.exists()  # no apt while the lock is held
        assert f"{lock}" in errors.read_text() and "300 s" in errors.read_text()
    finally:
        held.release()
    assert process.wait(timeout=60) == 0, errors.read_text()
    said = errors.read_text()
    assert said.count("waiting for the dpkg lock") == 1
    assert said.index("is free") < said.index("installing mcphost-test-pkg")
    # apt's own bound too, for the window between the wait and apt's lock
    assert called.read_text().split() == [
        "-o",
        "DPkg::Lock::Timeout=300",
        "install",
        "-y",
        "-qq",
        "mcphost-test-pkg",
    ]


@pytest.mark.skipif(not ROOT_USER, reason="make system installs only as root")
@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_system_gives_up_after_its_bound_saying_what_to_do(tmp_path: Path) -> None:
    lock = tmp_path / "lock-frontend"
    held = HeldLock(lock)
    try:
        process, called, errors = make_system(tmp_path, lock, wait=1)
        assert process.wait(timeout=60) != 0
    finally:
        held.release()
    said = errors.read_text()
    assert "still held after 1 s" in said and "LOCK_WAIT=" in said, said
    assert not called.exists()


def test_the_lock_wait_runs_on_the_standard_library_alone() -> None:
    """`make system` runs before any virtualenv: python3 -I, no site-packages."""
    done = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            str(ROOT / "tools" / "dpkg_lock_wait.py"),
            "--lock",
            "/nonexistent",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and done.stderr == ""
