"""In the guest (tests/kernelvm.py `--init systemd`; run by test_systemd_unit.py): the contrib
unit installed exactly as its header says, run by the machine's own systemd (PID 1), checked
through what an operator uses: `systemctl`, `journalctl`, `mcphost ctl` and /proc.

Never run on a worker: it installs into /etc, /opt and /var/lib, creates a user and makes /root
traversable, which the guest's writable overlay (tmpfs over this machine's read-only `/`)
throws away at power-off. `test_systemd_unit.py` refuses to run it anywhere but under systemd
as PID 1 in the VM; so does `guest()` below.

What holds, in the unit's user mode (`User=mcphost`) and in its root mode (the header's
`systemctl edit` drop-in, `User=` and `Group=` cleared):
- `systemctl start` (`Type=notify`) returns only once the supervisor is ready: `mcphost ctl
  status` answers at once, `systemctl show -p StatusText` is its STATUS= line, and no agent
  process has `NOTIFY_SOCKET` in its environment;
- the supervisor runs in the unit's cgroup, and with `Delegate=yes` each
  agent in a group of its own beneath it, under its limits: a fork loop stops at its
  `pids_max` (the kernel's `pids.events` counts the refused forks);
- the worker token reaches it only through `LoadCredential` (the file in /etc is root's, 0600)
  and the agents' center calls pass with it;
- `LimitNOFILE` is in force on the supervisor (/proc/<pid>/limits);
- `journalctl -u mcphost-supervisor` shows the supervisor's event lines;
- `systemctl reload` reconciles: an agent added to the fleet file starts, and the unit is active
  again with a STATUS= line that counts it;
- after `kill -9` of the supervisor, `Restart=on-failure` starts it again and every agent comes
  back at a higher generation;
- `systemctl stop` ends within `TimeoutStopSec`, with nothing left in the unit's cgroup.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcphost.testing.devcenter import DevCenter
from mcphost.testing.fleet import standin, toml_value
from tests.supervisor.supervise_harness import inline
from tests.waiting import until

ROOT = Path(__file__).resolve().parents[2]
UNIT_FILE = ROOT / "contrib" / "systemd" / "mcphost-supervisor.service"
UNIT = "mcphost-supervisor"
UNIT_GROUP = "/sys/fs/cgroup/system.slice/mcphost-supervisor.service"
STATE = "/var/lib/mcphost"
MCPHOST = "/opt/mcphost/bin/mcphost"
PIDS_MAX = 24

# Forks until the kernel refuses (its group's pids.max), then holds with what it has: a fork
# loop stopped by its limit, without spinning on EAGAIN (the guest is emulated and slow).
FORK_LOOP = (
    "import os, signal\n"
    "while True:\n"
    "    try:\n"
    "        pid = os.fork()\n"
    "    except OSError:\n"
    "        break\n"
    "    if pid == 0:\n"
    "        signal.pause()\n"
    "signal.pause()\n"
)


def sh(command: str, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, cwd=ROOT, check=False, **kwargs
    )
    if check:
        assert done.returncode == 0, f"{command}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def header_steps() -> list[str]:
    """The install lines of the unit's header, in order (`#   command`), without comments."""
    steps = []
    for line in UNIT_FILE.read_text().splitlines():
        if not line.startswith("#"):
            break
        if line.startswith("#   ") and not line.startswith("#    "):
            steps.append(re.sub(r"\s+#.*$", "", line[4:]).strip())
    return steps


def show(prop: str) -> str:
    return sh(f"systemctl show -p {prop} --value {UNIT}").stdout.strip()


def main_pid() -> int:
    return int(show("MainPID") or 0)


def status() -> dict[str, dict[str, Any]]:
    """`mcphost ctl --state /var/lib/mcphost status --json`, by agent."""
    done = sh(f"{MCPHOST} ctl --state {STATE} status --json", check=False)
    if done.returncode != 0:
        return {}
    return {row["agent_id"]: row for row in json.loads(done.stdout)["agents"]}


def center_state() -> str:
    done = sh(f"{MCPHOST} ctl --state {STATE} status --json")
    return str(json.loads(done.stdout)["center"]["state"])


def running(*agents: str, above: dict[str, int] | None = None) -> dict[str, dict[str, Any]]:
    rows = status()
    for agent in agents:
        row = rows.get(agent) or {}
        if row.get("state") != "running" or not row.get("pid"):
            return {}
        if above is not None and row.get("generation", 0) <= above[agent]:
            return {}
    return rows


def cgroup_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text().strip().split("::", 1)[1]


def group_pids(group: str) -> list[int]:
    """Every process in `group` and its subgroups."""
    found = []
    for folder, _, files in os.walk(group):
        if "cgroup.procs" in files:
            found += [int(p) for p in Path(folder, "cgroup.procs").read_text().split()]
    return found


def program_uids(pid: int) -> set[int]:
    """The real uids of the processes in `pid`'s group but bubblewrap's own."""
    group = "/sys/fs/cgroup" + cgroup_of(pid)
    found = set()
    for member in group_pids(group):
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue
        if status.split(maxsplit=2)[1] != "bwrap":  # "Name:\tbwrap" opens the status
            found.add(int(status.split("\nUid:", 1)[1].split()[0]))
    return found


def fleet(center: DevCenter, agents: list[dict[str, Any]]) -> str:
    lines = [
        "[center]",
        f"admin_url = {toml_value(center.admin_url('tcp'))}",
        f"fingerprint = {toml_value(center.fingerprint)}",
        'token_file = "/etc/mcphost/worker.token"',
        "",
        "[defaults]",
        'client = "command"',
        "stop_grace = 10",
    ]
    for agent in agents:
        lines += ["", "[[agent]]", *(f"{k} = {toml_value(v)}" for k, v in agent.items())]
    return "\n".join(lines) + "\n"


def agents(*names: str) -> list[dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {
        "steady": {"id": "steady", "command": standin("--hold")},
        "forker": {"id": "forker", "command": inline(FORK_LOOP), "pids_max": PIDS_MAX},
        "late": {"id": "late", "command": standin("--hold")},
    }
    return [table[name] for name in names]


@pytest.fixture(scope="module")
def center() -> Iterator[DevCenter]:
    if Path("/proc/1/comm").read_text().strip() != "systemd":
        pytest.fail("this file runs only in the kernel VM under systemd (test_systemd_unit.py)")
    if not Path("/run/kernelvm").is_dir():
        pytest.fail("this file runs only in the kernel VM (tests/kernelvm.py --init systemd)")
    # The center runs beside the worker, over TCP with its pin, as a remote center would: its
    # Unix socket is 0600 root's, and the unit's PrivateTmp would hide one under /tmp anyway.
    center = DevCenter.start(Path("/srv/center"), unix=False, tcp=True, startup_timeout=120)
    with center as running_center:
        yield running_center


def install(center: DevCenter) -> None:
    """The header's lines, run as written, in the checkout. Two stand in for what the guest
    cannot do: the venv line (no network here) is this checkout's own venv linked at
    /opt/mcphost, which is the same install (`pip install -e` of the same tree); and "then edit
    it" is writing our fleet over the copied example."""
    # This checkout's interpreter lives under /root (pyenv), 0700 on this machine: the unit's
    # User=mcphost must reach it, as it reaches /usr/bin/python3 on a worker. Only the guest's
    # overlay changes.
    os.chmod("/root", 0o711)
    for step in header_steps():
        if step.startswith("python3 -m venv /opt/mcphost"):
            os.symlink(sys.prefix, "/opt/mcphost")
            continue
        if step.startswith("systemctl daemon-reload"):
            # Editing the fleet file comes before starting the unit.
            Path("/etc/mcphost/fleet.toml").write_text(fleet(center, agents("steady", "forker")))
        # Type=notify: `enable --now` returned once the supervisor was ready (READY=1), so the
        # header's `mcphost ctl ... status` answers at once (sh raises on a non-zero status).
        sh(step, env={**os.environ, "TOKEN": center.token})


def check_running(center: DevCenter, *, user: str) -> dict[str, dict[str, Any]]:
    """The unit started: everything `systemctl start` promises, read from outside."""
    # Type=notify: `systemctl start` returned once the control socket answered and every agent
    # was started; the STATUS= line is systemd's StatusText.
    assert status(), "ctl status did not answer right after systemctl start"
    assert show("StatusText").startswith("2 agents; control "), show("StatusText")
    rows = until(lambda: running("steady", "forker"), 180, "the fleet to run under systemd")
    pid = main_pid()
    assert show("ActiveState") == "active"
    assert show("Delegate") == "yes"
    # The supervisor runs as the unit's user; its agents are in groups under the unit's.
    owner = sh(f"ps -o user= -p {pid}").stdout.strip()
    assert owner == user, owner
    for agent in ("steady", "forker"):
        assert rows[agent]["sandbox"] == "bwrap", rows[agent]  # the fence, on Debian 12's kernel
        group = cgroup_of(rows[agent]["pid"])
        assert group.startswith("/system.slice/mcphost-supervisor.service/"), (agent, group)
        assert group != cgroup_of(pid)
    # The fork loop stopped at its own pids_max, counted by the kernel.
    forker = "/sys/fs/cgroup" + cgroup_of(rows["forker"]["pid"])
    assert Path(forker, "pids.max").read_text().strip() == str(PIDS_MAX)
    until(
        lambda: int(Path(forker, "pids.events").read_text().split()[1]) > 0,
        120,
        "the fork loop to meet its pids_max",
    )
    # The token: only through LoadCredential (the file in /etc is root's alone).
    credential = "/run/credentials/mcphost-supervisor.service/worker.token"
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert f"MCPHOST_CENTER__TOKEN_FILE={credential}".encode() in environ
    assert oct(os.stat("/etc/mcphost/worker.token").st_mode & 0o777) == "0o600"
    # NOTIFY_SOCKET is the supervisor's alone (its /proc environ, the one it was started with,
    # has it): no agent process inherits it.
    assert b"NOTIFY_SOCKET=" in Path(f"/proc/{pid}/environ").read_bytes()
    for agent in ("steady", "forker"):
        for member in group_pids("/sys/fs/cgroup" + cgroup_of(rows[agent]["pid"])):
            with contextlib.suppress(OSError):  # a forked child may be gone
                assert b"NOTIFY_SOCKET=" not in Path(f"/proc/{member}/environ").read_bytes()
    assert center_state() == "ok"  # a wrong or missing token would be refused (401)
    # LimitNOFILE, with the soft limit raised to the hard one by the supervisor.
    limits = Path(f"/proc/{pid}/limits").read_text()
    assert re.search(r"Max open files\s+65536\s+65536", limits), limits
    # journald has the supervisor's own lines.
    journal = sh(f"journalctl -u {UNIT} --no-pager -o cat").stdout
    assert '"event": "supervisor.ready"' in journal or "supervisor.ready" in journal, journal
    return rows


def check_reload(center: DevCenter) -> None:
    Path("/etc/mcphost/fleet.toml").write_text(fleet(center, agents("steady", "forker", "late")))
    pid = main_pid()
    sh(f"systemctl reload {UNIT}")
    until(lambda: running("steady", "forker", "late"), 180, "the added agent to run")
    assert main_pid() == pid
    # RELOADING=1 then READY=1: the unit is active again, its STATUS= line counting the new agent.
    until(lambda: show("ActiveState") == "active", 120, "the unit active after the reload")
    until(lambda: show("StatusText").startswith("3 agents; "), 120, "the STATUS= after reload")


def check_restart(rows: dict[str, dict[str, Any]]) -> None:
    before = {agent: row["generation"] for agent, row in rows.items()}
    pid = main_pid()
    sh(f"kill -9 {pid}")
    until(lambda: main_pid() not in (0, pid), 120, "systemd to restart the supervisor")
    until(lambda: running(*before, above=before), 240, "every agent back at a newer generation")
    assert int(show("NRestarts")) == 1


def check_stop() -> None:
    started = time.monotonic()
    sh(f"systemctl stop {UNIT}")
    took = time.monotonic() - started
    assert took < 30, took  # TimeoutStopSec; systemd would have SIGKILLed (Result=timeout)
    assert show("Result") == "success", show("Result")
    assert show("ActiveState") == "inactive"
    assert not Path(UNIT_GROUP).exists() or group_pids(UNIT_GROUP) == []
    journal = sh(f"journalctl -u {UNIT} --no-pager -o cat").stdout
    assert "supervisor.stopped" in journal or "Deactivated successfully" in journal, journal


@contextlib.contextmanager
def journal_on_failure() -> Iterator[None]:
    """What the unit and the supervisor said, when a check fails (pytest shows stderr)."""
    try:
        yield
    except BaseException:
        print(sh(f"systemctl status --no-pager {UNIT}", check=False).stdout, file=sys.stderr)
        print(sh(f"journalctl -u {UNIT} --no-pager", check=False).stdout[-12000:], file=sys.stderr)
        raise


def edit_as_root() -> None:
    """The header's root mode, as it says: `systemctl edit mcphost-supervisor`, clearing
    `User=` and `Group=` (the editor is a script writing the drop-in; systemctl puts it in
    place and reloads systemd). `systemctl edit` wants a terminal: `script` gives it one."""
    editor = Path("/srv/edit-dropin.sh")
    editor.write_text('#!/bin/sh\nprintf "[Service]\\nUser=\\nGroup=\\n" > "$1"\n')
    editor.chmod(0o755)
    edit = f"script -qec 'systemctl edit {UNIT}' /dev/null"
    sh(edit, env={**os.environ, "SYSTEMD_EDITOR": str(editor)})
    dropin = Path(f"/etc/systemd/system/{UNIT}.service.d/override.conf").read_text()
    assert "User=\n" in dropin, dropin


def test_the_unit_as_installed_runs_the_fleet_as_mcphost(center: DevCenter) -> None:
    with journal_on_failure():
        install(center)
        check_running(center, user="mcphost")
        check_reload(center)
        check_restart(running("steady", "forker", "late"))
        check_stop()


def test_the_unit_in_root_mode_gives_each_agent_a_uid_of_its_own(center: DevCenter) -> None:
    with journal_on_failure():
        edit_as_root()
        Path("/etc/mcphost/fleet.toml").write_text(fleet(center, agents("steady", "forker")))
        sh(f"systemctl start {UNIT}")
        rows = check_running(center, user="root")
        # bubblewrap starts as root (no user namespace needed) and switches to the agent's uid
        # inside: every other process of an agent's group runs under that agent's own uid.
        uids = {agent: program_uids(rows[agent]["pid"]) for agent in ("steady", "forker")}
        assert all(len(found) == 1 and 0 not in found for found in uids.values()), uids
        assert uids["steady"] != uids["forker"], uids
        check_stop()
