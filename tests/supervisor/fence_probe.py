"""A hostile stand-in agent for the fence's black-box test (confine/test_fence.py); stdlib only.

`fence_probe.py MODE CONFIG [STANDIN ARGV...]`: wait for `go.json` in the workspace (the pids
to aim at, written by the test once every agent runs), try every forbidden thing and every
allowed one, each as its own probe, and write `<MODE>.json` in the workspace: probe -> "ok"
(it worked) or the errno name the kernel answered (or "missing": the path is not there). MODE
`agent` also starts a `setsid` double-forked escapee that probes again (`escapee.json`), then
execs the stand-in agent (its MCP call proves the attach socket works); MODE `exec` is a
`ctl exec` command.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

CLONE_NEWNS, CLONE_NEWUSER, MNT_DETACH, PTRACE_SEIZE = 0x20000, 0x10000000, 2, 0x4206
libc = ctypes.CDLL(None, use_errno=True)


def outcome(action: Callable[[], object]) -> str:
    try:
        action()
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return "ok"


def read(path: str) -> Callable[[], object]:
    return lambda: open(path, "rb").read(1)


def write(path: str, text: str = "x") -> Callable[[], object]:
    def go() -> None:
        with open(path, "w") as handle:
            handle.write(text)

    return go


def connect(path: str) -> Callable[[], object]:
    def go() -> None:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(path)

    return go


def control(path: str) -> Callable[[], object]:
    """Ask the control socket for `status`: "ok" only when it answers with a result."""

    def go() -> None:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(30)
            sock.connect(path)
            sock.sendall(b'{"op":"status"}\n')
            reply = sock.makefile("rb").readline()
        if b"forbidden_peer" in reply or not reply:
            raise OSError(errno.EACCES, "forbidden_peer")

    return go


def tcp(port: int) -> Callable[[], object]:
    def go() -> None:
        socket.create_connection(("127.0.0.1", port), timeout=30).close()

    return go


def kill(pid: int) -> Callable[[], object]:
    return lambda: os.kill(pid, 0)


def ptrace(pid: int, really: bool = True) -> Callable[[], object]:
    """Unfenced (`really` False) it is not tried: a tracer that stays (the escapee, a
    stand-in after exec) would freeze its tracee at its next signal."""

    def go() -> None:
        if not really:
            raise OSError(errno.ENOSYS, "not tried")
        # PTRACE_SEIZE: attaches without stopping the tracee (detached when this process ends)
        if libc.ptrace(ctypes.c_long(PTRACE_SEIZE), ctypes.c_long(pid), None, None) != 0:
            raise OSError(ctypes.get_errno(), "ptrace")

    return go


def open_any_pts() -> Callable[[], object]:
    """Open every terminal under /dev/pts (another pane's among them, unfenced): "ok" when one
    opened, "missing" when there is none to try."""

    def go() -> None:
        names = [n for n in os.listdir("/dev/pts") if n.isdigit()]
        if not names:
            raise FileNotFoundError("/dev/pts")
        last: OSError | None = None
        for name in names:
            try:
                os.close(os.open(f"/dev/pts/{name}", os.O_RDWR | os.O_NOCTTY))
                return
            except OSError as exc:
                last = exc
        assert last is not None
        raise last

    return go


def session_keyring() -> int:
    """This process's session keyring id (keyctl GET_KEYRING_ID of KEY_SPEC_SESSION_KEYRING)."""
    keyctl = {"aarch64": 219}.get(platform.machine(), 250)  # x86_64's otherwise
    return int(libc.syscall(keyctl, 0, -3, 0))  # the test compares it with its own


def tmp_bytes() -> int:
    st = os.statvfs("/tmp")
    return st.f_blocks * st.f_frsize


def undo(state: str, token: str) -> Callable[[], object]:
    """A nested user+mount namespace, then unmount the cover of the state directory."""

    def go() -> None:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
                    raise OSError(ctypes.get_errno(), "unshare")
                for target in (state, "/tmp", token):
                    if libc.umount2(target.encode(), MNT_DETACH) != 0:
                        raise OSError(ctypes.get_errno(), "umount")
                read(token)()
            except OSError as exc:
                code = exc.errno or 1
            os._exit(code)
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        if status:
            raise OSError(status, "undo")

    return go


def any_of(actions: list[Callable[[], object]]) -> Callable[[], object]:
    """ "ok" when one of `actions` works; else the last refusal ("missing" when none to try)."""

    def go() -> None:
        last: OSError = FileNotFoundError("none to try")
        for action in actions:
            try:
                action()
                return
            except OSError as exc:
                last = exc
        raise last

    return go


def listed(directory: str) -> Callable[[], object]:
    """ "ok" when `directory`'s parent lists it (a peer's cgroup among the agent's own)."""

    def go() -> None:
        if os.path.basename(directory) not in os.listdir(os.path.dirname(directory)):
            raise FileNotFoundError(directory)

    return go


def cgroup_probes(groups: dict[str, list[str]]) -> dict[str, str]:
    """The other agent's cgroups (listed beside the hostile agent's own, read), the host's group
    above them (the supervisor's), and the agent's own: read (allowed, read-only) and written
    ("0" to `cgroup.procs`: the writer into its own group, harmless where it works)."""
    own, other = groups.get("own", []), groups.get("other", [])
    return {
        "read_other_cgroup": outcome(any_of([read(f"{d}/cgroup.procs") for d in other])),
        "list_other_cgroup": outcome(any_of([listed(d) for d in other])),
        "read_host_cgroup": outcome(
            any_of([read(f"{os.path.dirname(os.path.dirname(d))}/cgroup.procs") for d in other])
        ),
        "write_own_cgroup": outcome(any_of([write(f"{d}/cgroup.procs", "0") for d in own])),
        "read_own_cgroup": outcome(any_of([read(f"{d}/cgroup.procs") for d in own])),
    }


def probes(cfg: dict[str, object], go: dict[str, Any]) -> dict[str, str]:
    state, me, other = str(cfg["state"]), str(cfg["me"]), str(cfg["other"])
    token = str(cfg["token"])
    home = f"{state}/agents/{me}"
    out = {
        # forbidden
        "read_token": outcome(read(token)),
        "read_fleet": outcome(read(str(cfg["fleet"]))),
        "read_state_db": outcome(read(f"{state}/state.sqlite3")),
        "read_other_log": outcome(read(f"{state}/logs/{other}/agent.log")),
        "read_own_log": outcome(read(f"{state}/logs/{me}/agent.log")),
        "read_other_home": outcome(read(f"{state}/agents/{other}/mcp.json")),
        "write_other_home": outcome(write(f"{state}/agents/{other}/workspace/planted")),
        "write_outside": outcome(write(f"{cfg['outside']}/planted-{cfg['mode']}")),
        "connect_control": outcome(connect(f"{state}/control.sock")),
        "control_status": outcome(control(f"{state}/control.sock")),
        "connect_other_tmux": outcome(connect(f"{state}/tmux/{other}/tmux.sock")),
        "connect_own_tmux": outcome(connect(f"{state}/tmux/{me}/tmux.sock")),
        "kill_supervisor": outcome(kill(go["supervisor"])),
        "kill_other": outcome(kill(go["other"])),
        "ptrace_supervisor": outcome(ptrace(go["supervisor"], really=bool(cfg["fenced"]))),
        "ptrace_other": outcome(ptrace(go["other"], really=bool(cfg["fenced"]))),
        "supervisor_environ": outcome(read(f"/proc/{go['supervisor']}/environ")),
        "undo": outcome(undo(state, token)),
        "tmux_env": "set" if ("TMUX" in os.environ or "TMUX_PANE" in os.environ) else "unset",
        # the working directory is set inside the fence: its parents lead only into covers
        "read_other_relative": outcome(read(f"../../{other}/mcp.json")),
        "open_other_pts": outcome(open_any_pts()),
        # fenced only: unfenced, this would plant a file in the host's /dev
        "write_dev": outcome(write(f"/dev/fence-probe-{cfg['mode']}"))
        if cfg["fenced"]
        else "EROFS",
        "read_other_cmdline": outcome(read(f"/proc/{go['other']}/cmdline")),
        "connect_run_socket": outcome(connect(str(cfg["run_socket"])))
        if cfg.get("run_socket")
        else "missing",
        "same_keyring": "ok" if session_keyring() == int(str(cfg["keyring"])) else "ENOKEY",
        "tmp_bytes": str(tmp_bytes()),
        "processes_seen": str(sum(1 for n in os.listdir("/proc") if n.isdigit())),
        # allowed
        "write_workspace": outcome(write(f"{home}/workspace/written-{cfg['mode']}")),
        "write_home": outcome(write(f"{home}/written-{cfg['mode']}")),
        "run_sh": outcome(lambda: subprocess.run(["/bin/sh", "-c", "exit 0"], check=True)),
        "connect_attach": outcome(connect(f"{state}/run/center.sock")),
        "tcp_loopback": outcome(tcp(int(str(cfg["port"])))),
        "tmp_write": outcome(write(f"/tmp/fence-probe-{os.path.basename(state)}-{cfg['mode']}")),
        # SQLite (Codex's state database) takes /var/tmp before /tmp: private and writable too
        "var_tmp_write": outcome(
            write(f"/var/tmp/fence-probe-{os.path.basename(state)}-{cfg['mode']}")
        ),
        "tmp_host_marker": outcome(read(str(cfg["marker"]))),
        **cgroup_probes(go.get("cgroups") or {}),
    }
    return out


def main(argv: list[str]) -> None:
    mode, cfg = argv[0], json.loads(argv[1])
    cfg["mode"] = mode
    workspace = f"{cfg['state']}/agents/{cfg['me']}/workspace"
    while not os.path.exists(f"{workspace}/go.json"):
        time.sleep(0.02)
    with open(f"{workspace}/go.json") as handle:
        go = json.load(handle)
    if mode == "agent" and os.fork() == 0:  # the escapee: its own session, reparented
        os.setsid()
        if os.fork() == 0:
            main(["escapee", json.dumps({k: v for k, v in cfg.items() if k != "mode"})])
        os._exit(0)
    if mode == "exec" and cfg.get("exec_tag") and os.fork() == 0:  # an escapee of ctl exec
        os.setsid()
        if os.fork() == 0:
            # it keeps ctl's stdin (the operator's terminal, by hand); not its stdout and
            # stderr, so the test's own capture of ctl's output can end
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            code = "import time\nwhile True:\n    time.sleep(3600)\n"
            os.execv(sys.executable, [sys.executable, "-c", code, str(cfg["exec_tag"])])
        os._exit(0)
    result = probes(cfg, go)
    with open(f"{workspace}/.{mode}.json.tmp", "w") as handle:
        json.dump(result, handle)
    os.rename(f"{workspace}/.{mode}.json.tmp", f"{workspace}/{mode}.json")
    if mode == "agent" and len(argv) > 2:
        os.execv(argv[2], argv[2:])
    if mode == "escapee":
        time.sleep(3600)  # stays, an orphan of the supervisor, until the group is ended
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
