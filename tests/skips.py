"""Environment skips: what a skipped test lacked, said at the end of every run, and under CI a
failure instead of a green run.

A test skips where the machine lacks what it needs (root, the user nobody, user namespaces,
cgroups, the fence, tmux, ...): on a developer's machine `make test` stays green. CI must prove
it ran them, so every run ends with one line naming the environment skips by requirement
(`summary`), and with `MCPHOST_CI=1` (`.ci/run` sets it for `make test` and `make test-slow`) a
skip whose reason names one of `REQUIRED_ON_CI` fails the run (`enforced`). A skip that names
none of them (an architecture `kernelsim` does not simulate, a console script not installed) is
counted as `other`, never failed. tests/conftest.py wires these into pytest's hooks, in the
controller, after every worker has reported (so module-level skips count too).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

# What a machine running CI provides, each with the words a skip's reason uses for it.
REQUIRED_ON_CI: Mapping[str, re.Pattern[str]] = {
    # a root supervisor; not "root may switch", the skip of a test only a user can run
    "root": re.compile(r"needs (a )?root|root supervisor|as root's are"),
    "nobody": re.compile(r"\bnobody\b"),
    "user namespaces": re.compile(r"user namespace"),
    "cgroups": re.compile(r"cgroup"),
    "fence": re.compile(r"no fence here|bubblewrap|\bbwrap\b|landlock", re.IGNORECASE),
    "tmux": re.compile(r"\btmux\b"),
    "util-linux": re.compile(r"util-linux|\bunshare\b|\bprlimit\b"),
    "node": re.compile(r"\bnpm\b|make node"),
    "chromium": re.compile(r"chromium", re.IGNORECASE),
}
OTHER = "other"


def on_ci(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get("MCPHOST_CI", "") == "1"


def requirement(reason: str) -> str:
    """The requirement a skip's reason names (the first in `REQUIRED_ON_CI`), or `OTHER`."""
    for name, words in REQUIRED_ON_CI.items():
        if words.search(reason):
            return name
    return OTHER


def reason_of(report: Any) -> str:
    """A skipped report's reason, without pytest's "Skipped: " prefix."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def grouped(reasons: Iterable[str]) -> dict[str, list[str]]:
    """Reasons by requirement, in `REQUIRED_ON_CI`'s order, `OTHER` last."""
    found: dict[str, list[str]] = {}
    for reason in reasons:
        found.setdefault(requirement(reason), []).append(reason)
    order = [*REQUIRED_ON_CI, OTHER]
    return {name: found[name] for name in order if name in found}


def enforced(groups: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """The groups that fail a CI run: every requirement but `OTHER`."""
    return {name: reasons for name, reasons in groups.items() if name != OTHER}


def summary(groups: Mapping[str, list[str]], ci: bool) -> list[str]:
    """The run's closing lines: one naming each requirement's count (or none), then under CI
    one per distinct reason that fails the run."""
    counts = ", ".join(f"{name} {len(reasons)}" for name, reasons in groups.items())
    mode = "MCPHOST_CI=1: required ones fail the run" if ci else "MCPHOST_CI unset"
    lines = [f"environment skips: {counts or 'none'} ({mode})"]
    if ci:
        for name, reasons in enforced(groups).items():
            for reason in sorted(set(reasons)):
                lines.append(f"FAILED (CI must run it: {name}): {reason}")
    return lines
