"""The suite's environment skips (tests/skips.py): what each skip lacked, said at the end of
every run, and under `MCPHOST_CI=1` a failed run instead of a green one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import skips

ROOT = Path(__file__).resolve().parents[2]

# Reasons as the suite's files give them, and the requirement each names.
REASONS = {
    "tmux is not installed": "tmux",
    "needs root to chown": "root",
    "a `user =` agent needs a root supervisor": "root",
    "no user nobody on this machine": "nobody",
    "this machine has no user namespaces for an unprivileged supervisor": "user namespaces",
    "no usable cgroup backend here: no cgroup2 mount": "cgroups",
    "no cgroup v1 cpuacct hierarchy on this machine": "cgroups",
    "no fence here: bwrap": "fence",
    "bubblewrap is not installed": "fence",
    "util-linux unshare is missing": "util-linux",
    "util-linux's prlimit is missing": "util-linux",
    "npm is not installed: Claude Code not run": "node",
    "tools/node_modules/.bin/mcp-inspector missing: run `make node`": "node",
    "chromium not found: install the chromium package": "chromium",
    "the hierarchies must be writable as root's are": "root",
    "root may switch": skips.OTHER,  # the machine is root: a test for a user skips there
    "kernelsim: x86_64 and aarch64 only": skips.OTHER,
    "the mcphost console script is not installed: no such file": skips.OTHER,
}


@pytest.mark.parametrize(("reason", "named"), REASONS.items())
def test_a_reason_names_its_requirement(reason: str, named: str) -> None:
    assert skips.requirement(reason) == named


def test_the_summary_counts_by_requirement_and_under_ci_names_what_fails() -> None:
    groups = skips.grouped(["kernelsim: x86_64 only", "tmux is missing", "tmux is missing"])
    assert groups == {"tmux": ["tmux is missing"] * 2, "other": ["kernelsim: x86_64 only"]}
    assert skips.enforced(groups) == {"tmux": ["tmux is missing"] * 2}
    assert skips.summary(groups, ci=False) == [
        "environment skips: tmux 2, other 1 (MCPHOST_CI unset)"
    ]
    assert skips.summary(groups, ci=True)[1:] == ["FAILED (CI must run it: tmux): tmux is missing"]
    assert skips.summary({}, ci=True) == [
        "environment skips: none (MCPHOST_CI=1: required ones fail the run)"
    ]
    assert skips.on_ci({"MCPHOST_CI": "1"}) and not skips.on_ci({})


def test_under_ci_a_required_skip_fails_the_run_and_another_does_not(tmp_path: Path) -> None:
    """pytest itself, with tests/conftest.py's hooks as a plugin, on a file of its own."""
    (tmp_path / "test_it.py").write_text(
        "import pytest\n"
        "def test_ran(): pass\n"
        "def test_other(): pytest.skip('kernelsim: x86_64 and aarch64 only')\n"
        "@pytest.mark.skipif(True, reason='no user nobody on this machine')\n"
        "def test_nobody(): pass\n"
    )

    env = {**os.environ, "MCPHOST_CI": "1", "PYTHONPATH": str(ROOT)}
    argv = ["-c", os.devnull, "--rootdir", str(tmp_path), "-p", "tests.conftest"]
    plugins = ["-p", "no:cacheprovider", "-p", "no:schemathesis"]
    failed = subprocess.run(
        [sys.executable, "-m", "pytest", *argv, *plugins, "test_it.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert failed.returncode == 1, failed.stdout  # the tests themselves passed or skipped
    assert "1 passed, 2 skipped" in failed.stdout
    assert "environment skips: nobody 1, other 1 (MCPHOST_CI=1" in failed.stdout
    assert "FAILED (CI must run it: nobody): no user nobody on this machine" in failed.stdout
    assert "kernelsim" not in failed.stdout.split("FAILED (CI", 1)[1]  # `other`: not failed
