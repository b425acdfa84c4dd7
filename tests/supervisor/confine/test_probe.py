"""The fence's level on each kernel, as pure functions of what a machine offers (probe.py `Support`).

One row per kernel or distribution of docs/supervisor.md ("Kernels and distributions"): what
`Support` probes there (Landlock's ABI, user namespaces, root, AppArmor's restriction of
unprivileged user namespaces), and what follows from it: whether the fence can be built
(`missing`: the one phrase `check_sandbox` puts in its one line), the protections it cannot give
(`lacks`, named by `--check`), the level `ctl status` shows (`level`), and whether a uid-0 agent
gets a user namespace of its own (`agent_map_uid`, and bubblewrap's `--unshare-user`).
The levels this machine can simulate run for real in confine/test_fence_levels.py (tests/kernelsim.py);
the rest (AppArmor's restriction, Landlock ABI 1-5) are covered only here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import pytest

from mcphost import gate
from mcphost.settings import SettingError
from mcphost.supervisor.confine.probe import APPARMOR_LIMIT, DEBIAN_LIMIT, Support, probe
from mcphost.supervisor.fleet import load_fleet
from mcphost.supervisor.plan import check_sandbox

UNSCOPED = "abstract Unix sockets are not scoped"
NO_NESTING = "agents cannot nest their own sandboxes"
APPARMOR = "nest only through a program an AppArmor profile lets make user namespaces"
EPERM = "unshare: Operation not permitted"
NO_MOUNT = "mount: Operation not permitted"  # what AppArmor's restriction leaves a namespace


class Row(NamedTuple):
    support: Support
    level: str
    lacks: tuple[str, ...]  # a fragment per protection not given, in order
    missing: str | None  # a fragment of what makes the fence impossible


ROWS = {
    # Linux 6.1: Landlock ABI 2 (below 6: no scoping), unprivileged user namespaces on
    "debian-12": Row(Support(2, True, root=False), "bwrap", (UNSCOPED + " (Landlock ABI >= 6; here: ABI 2)",), None),
    "debian-12-root": Row(Support(2, True, root=True), "bwrap", (UNSCOPED,), None),
    # Linux 6.8, ABI 4; AppArmor restricts unprivileged user namespaces: the probe's namespace
    # cannot mount. Root is not restricted, but its agents' own sandboxes are.
    "ubuntu-24.04": Row(
        Support(4, False, NO_MOUNT, root=False, userns_limit=APPARMOR_LIMIT), "bwrap (no nesting)",
        (UNSCOPED, NO_NESTING), f"unprivileged user namespaces ({NO_MOUNT}); run the supervisor as root",
    ),
    "ubuntu-24.04-root": Row(
        Support(4, True, root=True, userns_limit=APPARMOR_LIMIT), "bwrap", (UNSCOPED, APPARMOR), None
    ),
    # 25.04 and later load bwrap-userns-restrict (24.04 with it loaded alike): bubblewrap gets its
    # namespace, the probe falls back to it. Linux 6.14: ABI 6.
    "ubuntu-25.04": Row(
        Support(6, True, root=False, userns_limit=APPARMOR_LIMIT), "bwrap+landlock6", (APPARMOR,), None
    ),
    # Linux 5.14: Landlock ABI 1 with backports, or none when it is not in the boot `lsm=` list
    "rhel-9": Row(Support(0, True, root=True), "bwrap", (UNSCOPED + " (Landlock ABI >= 6; here: no Landlock)",), None),
    "rhel-9-abi1": Row(Support(1, True, root=False), "bwrap", (UNSCOPED,), None),
    # Linux 6.12: ABI 6, everything
    "debian-13": Row(Support(6, True, root=False), "bwrap+landlock6", (), None),
    "rhel-10-root": Row(Support(6, True, root=True), "bwrap+landlock6", (), None),
    # Linux 6.18: ABI 7
    "linux-6.18": Row(Support(7, True, root=False), "bwrap+landlock7", (), None),
    # Debian's sysctl: root makes user namespaces (the probe succeeds), its agents cannot
    "debian-unprivileged-userns-clone-0-root": Row(
        Support(2, True, root=True, userns_limit=DEBIAN_LIMIT), "bwrap (no nesting)",
        (UNSCOPED, NO_NESTING + " (Claude Code's, Codex's): no user namespaces for them "
         "(kernel.unprivileged_userns_clone = 0)"), None,
    ),
    # user namespaces disabled for every process (user.max_user_namespaces = 0; kernelsim's
    # no-userns): root still fences
    "no-userns-root": Row(
        Support(7, False, EPERM, root=True), "bwrap+landlock7 (no nesting)", (NO_NESTING,), None
    ),
    "no-userns": Row(
        Support(7, False, EPERM, root=False), "bwrap+landlock7 (no nesting)", (NO_NESTING,),
        f"unprivileged user namespaces ({EPERM}); run the supervisor as root",
    ),
    "no-bwrap": Row(
        Support(7, True, root=True, bwrap=None), "bwrap+landlock7", (),
        "bubblewrap (`bwrap` on PATH; Debian/Ubuntu: apt-get install bubblewrap)",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(ROWS))
def test_the_level_of_each_kernel(name: str) -> None:
    row = ROWS[name]
    assert row.support.level() == row.level
    lacks = row.support.lacks()
    assert len(lacks) == len(row.lacks), lacks
    for said, fragment in zip(lacks, row.lacks, strict=True):
        assert fragment in said, (said, fragment)
    missing = row.support.missing()
    if row.missing is None:
        assert missing is None, missing
    else:
        assert missing is not None and row.missing in missing, missing


@pytest.mark.parametrize("name", list(ROWS))
def test_check_describes_the_level_or_what_is_missing(name: str) -> None:
    row = ROWS[name]
    said = row.support.describe()
    if row.missing is not None:
        assert said == f"unavailable: this machine lacks {row.support.missing()}"
        return
    who = "root" if row.support.root else "an unprivileged user"
    assert said.startswith(f"{row.level}: bubblewrap run as {who} ("), said
    assert "own PID namespace: signals and ptrace stay in the agent's tree" in said
    if row.lacks:
        assert said.endswith("; not given here: " + "; ".join(row.support.lacks())), said
    else:
        assert "not given" not in said, said


def test_what_is_missing_and_what_is_lacking_is_named() -> None:
    assert Support(7, True, root=False, bwrap="/usr/bin/bwrap").missing() is None
    assert Support(7, False, "EPERM", root=True, bwrap="/b").missing() is None  # root: no userns
    missing = Support(7, False, "EPERM", root=False, bwrap="/b").missing() or ""
    assert "user namespaces (EPERM)" in missing and "root" in missing
    assert "bubblewrap" in (Support(7, True, bwrap=None).missing() or "")
    assert Support(7, True, bwrap="/b").lacks() == ()
    lacks = Support(2, False, "EPERM", root=True, bwrap="/b").lacks()
    assert any("abstract Unix sockets" in line for line in lacks)
    assert any("nest" in line for line in lacks)
    assert Support(0, False, "x", bwrap=None).describe().startswith("unavailable:")
    assert Support(7, True, bwrap="/b").level() == "bwrap+landlock7"
    assert Support(4, False, "x", root=True, bwrap="/b").level() == "bwrap (no nesting)"


def test_the_probe_sees_this_machine() -> None:
    support = probe()
    assert support.root == (os.geteuid() == 0)
    assert support.landlock_abi == gate.landlock_abi()


FLEET = """
[center]
admin_url = "tcp://center.example:8443"
fingerprint = "sha256:{pin}"
token_file = "/etc/mcphost/worker.token"

[defaults]
client = "command"
{defaults}
[[agent]]
id = "a1"
command = ["true"]
{agent}"""


@pytest.mark.parametrize(
    ("defaults", "agent", "keys"),
    [
        ("", "", ["defaults.sandbox"]),
        ('sandbox = "none"\n', 'sandbox = "auto"\n', ["agent[0].sandbox"]),
        ('sandbox = "none"\n', "", []),
    ],
)
def test_where_the_fence_cannot_be_built_each_key_asking_for_it_is_one_line(
    tmp_path: Path, defaults: str, agent: str, keys: list[str]
) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET.format(pin=":".join(["AB"] * 32), defaults=defaults, agent=agent))
    fleet = load_fleet(str(path), env={})
    missing = ROWS["no-userns"].support.missing()
    if not keys:
        check_sandbox(fleet, missing)  # nothing asks for the fence
        return
    with pytest.raises(SettingError) as refused:
        check_sandbox(fleet, missing)
    lines = refused.value.lines()
    assert len(lines) == len(keys)
    for line, key in zip(lines, keys, strict=True):
        assert "\n" not in line and f"{path}: {key}" in line, line
        assert f"this machine lacks unprivileged user namespaces ({EPERM})" in line, line
    check_sandbox(fleet, ROWS["no-userns-root"].support.missing())  # root: nothing missing
