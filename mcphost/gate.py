"""The child's entry steps, and the tmux pane's gate that runs them: a standard-library-only script.

Owns: the steps an agent's child takes between fork and exec, which neither the spawn nor
bubblewrap takes for it, in this order: enter the agent's cgroup (`enter_cgroup`: write "0" to
each entry file cgroups.py names), become its user (`switch_to` a `Switch`: groups and gid
first, while still root), and enter (`enter`: a session keyring of its own, `own_keyring`, never
the supervisor's; `PR_SET_NO_NEW_PRIVS`; the `FORWARDED` signals ignored, so bubblewrap passes a
stop or a ^C on to the agent; with Landlock ABI >= 6 a domain scoping abstract Unix sockets and
signals to the tree; an unfenced agent gets only the keyring). Also Landlock's ABI on this kernel
(`landlock_abi`, which the fence's probe asks) and the ctypes binding these syscalls go through
(`LIBC`, `checked`).

The gate (`main`): a tmux pane is not the supervisor's child (tmux forks it), so it cannot run a
pre-exec step. Instead its command is `python3 -I -S gate.py FIFO ARGV...` (agents/tmux.py
`GATE`): it blocks reading one JSON line from the FIFO (the gate's message: `fenced_message`, the
fenced command line; or `NO_FENCE`, none: then ARGV runs as it is; each with the cgroup to enter,
`with_cgroup`, and the user to become, `with_switch`), takes the steps above, then execs (same
pid, so the pane's pid is the agent's). The message is written and read here only, so the two
sides cannot disagree on it. A process agent's child (confine/kernel.py `pdeathsig_preexec`)
calls the same steps in its pre-exec function.

Why ctypes: three syscalls (keyctl, prctl, Landlock's two), and no library. Landlock's domain
handles no filesystem right, so the agent's own sandbox (Claude Code's and Codex's bubblewrap,
`unshare -U`) still nests: a domain that handles filesystem rights forbids mounts and uid maps.

Must never: import anything of mcphost or outside the standard library (the gate runs with
`-I -S`: no site-packages, no venv, and not the script's own directory); run a command it did
not fully enter (every failure before exec exits: 126 when a step fails, 127 when the program
cannot be run, 1 when the FIFO ends without a line, the runner having given up).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import sys
from collections.abc import Iterable
from dataclasses import dataclass

# -- constants (linux/landlock.h, linux/prctl.h, linux/keyctl.h) ---------------------------------

PR_SET_NO_NEW_PRIVS = 38
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_RESTRICT_SELF = 444, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6
SCOPE_ABI = 6  # abstract-socket and signal scoping
KEYCTL_JOIN_SESSION_KEYRING = 1
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "arm64": 219}.get(platform.machine(), 250)
# Signals bubblewrap itself ignores (`enter`), so a stop, ctl exec's forwarded ^C or a pane's
# hangup reaches the agent and bubblewrap reports the agent's own exit; `env --default-signal`
# (coreutils >= 8.31) gives the agent the default handling back (confine/fence.py).
FORWARDED = ("TERM", "INT", "HUP", "QUIT")

LIBC = ctypes.CDLL(None, use_errno=True)
_syscall = LIBC.syscall
_syscall.restype = ctypes.c_long


def checked(result: int, what: str) -> int:
    """`result` of a libc call, or OSError naming `what` with errno when it is negative."""
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


@dataclass(frozen=True, slots=True)
class Switch:
    """The user an agent's process becomes: by `switch_to` before anything else runs (a pane's
    gate, a process agent's pre-exec step), or inside a root-run bubblewrap (setpriv)."""

    uid: int
    gid: int
    groups: tuple[int, ...]


# -- the steps ------------------------------------------------------------------------------------


def enter_cgroup(entry_files: Iterable[str]) -> None:
    """Put the writing process (thread, for v1's `tasks`) into each group's entry file: the
    spawn's pre-exec step (kernel.py) and the tmux gate (`main`) both enter this way."""
    for path in entry_files:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)


def switch_to(switch: Switch) -> None:
    """Become `switch`'s user for good (groups and gid first, while still root)."""
    os.setgroups(list(switch.groups))
    os.setgid(switch.gid)
    os.setuid(switch.uid)


def own_keyring() -> None:
    """A fresh anonymous session keyring: the supervisor's (and the operator's Kerberos or
    network filesystem keys in it) stay out of reach. Every agent gets one, fenced or not."""
    checked(
        int(
            _syscall(
                ctypes.c_long(SYS_KEYCTL),
                ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING),
                ctypes.c_void_p(None),
            )
        ),
        "keyctl(JOIN_SESSION_KEYRING)",
    )


def landlock_abi() -> int:
    """Landlock's ABI version on this kernel; 0 when Landlock is absent or disabled."""
    result = int(
        _syscall(
            ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET),
            ctypes.c_void_p(None),
            ctypes.c_size_t(0),
            ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION),
        )
    )
    return max(result, 0)


def enter(abi: int, forward: bool = False) -> None:
    """`own_keyring`, no new privileges, with `forward` the `FORWARDED` signals ignored (the
    agent gets them back, by `env --default-signal`, after bubblewrap), and with Landlock
    ABI >= 6 a domain scoping abstract Unix sockets and signals to this tree (it handles no
    filesystem right, so mounts and nested sandboxes stay possible). Raises OSError on
    failure."""
    own_keyring()
    if forward:
        import signal

        for name in FORWARDED:
            signal.signal(getattr(signal, f"SIG{name}"), signal.SIG_IGN)
    checked(LIBC.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), 0, 0, 0), "no_new_privs")
    if abi < SCOPE_ABI:
        return
    attr = (ctypes.c_uint64 * 3)(0, 0, SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET)
    ruleset = checked(
        int(
            _syscall(
                ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET),
                ctypes.byref(attr),
                ctypes.c_size_t(ctypes.sizeof(attr)),
                ctypes.c_uint32(0),
            )
        ),
        "landlock_create_ruleset",
    )
    try:
        checked(
            int(
                _syscall(
                    ctypes.c_long(SYS_LANDLOCK_RESTRICT_SELF),
                    ctypes.c_int(ruleset),
                    ctypes.c_uint32(0),
                )
            ),
            "landlock_restrict_self",
        )
    finally:
        os.close(ruleset)


# -- the gate's message (written by agents/tmux.py and confine/fence.py, read by `main`) ----------

NO_FENCE = b"{}\n"  # the gate's message for an agent with sandbox = "none"


def fenced_message(argv: list[str], abi: int, forward: bool) -> bytes:
    """The gate's message for a fenced agent: exec `argv` (bubblewrap's command line) after
    `enter(abi, forward)`."""
    body = {"argv": argv, "abi": abi, "forward": forward}
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def with_cgroup(message: bytes, entry_files: tuple[str, ...]) -> bytes:
    """The gate's `message` with the agent's cgroup (cgroups.py) to enter before anything
    else: the entry files (`cgroups.entry_file`) the gate, one thread, writes "0" to."""
    return _with_field(message, "cgroup", list(entry_files) if entry_files else None)


def with_switch(message: bytes, switch: Switch | None) -> bytes:
    """The gate's `message` with the user to switch to before it enters the fence (or runs an
    unfenced command): an agent of its own uid in a pane of the root tmux server."""
    value = None if switch is None else [switch.uid, switch.gid, list(switch.groups)]
    return _with_field(message, "switch", value)


def _with_field(message: bytes, key: str, value: object) -> bytes:
    """The gate's JSON line `message` with `key` set to `value` (unchanged when None)."""
    if value is None:
        return message
    body = json.loads(message)
    body[key] = value
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


# -- the tmux pane's gate --------------------------------------------------------------------------

GATE_USAGE = "usage: gate.py FIFO ARGV...  (the command arrives on the FIFO as one JSON line)"


def main(argv: list[str]) -> int:
    """The pane's process: read one line from the FIFO (`{"argv": [...], "abi": n}`, the
    fenced command, or `{}` for none: then ARGV runs as it is; EOF: the runner gave up, exit
    1), enter the agent's cgroup (`"cgroup"`), become its user (`"switch"`, `with_switch`),
    enter (`enter`), then exec (same pid). 126 when the fence fails, 127 when the program
    cannot be run."""
    if len(argv) < 2:
        sys.stderr.write(GATE_USAGE + "\n")
        return 2
    fd = os.open(argv[0], os.O_RDONLY | os.O_CLOEXEC)
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 65536)
        if not chunk:
            return 1
        data += chunk
    os.close(fd)
    message = json.loads(data.decode())
    command = argv[1:]
    try:
        enter_cgroup(str(p) for p in message.pop("cgroup", []))
    except OSError as exc:
        sys.stderr.write(f"mcphost: cannot enter the agent's cgroup: {exc}\n")
        return 126
    switch = message.pop("switch", None)
    if switch is not None:
        uid, gid, groups = int(switch[0]), int(switch[1]), tuple(int(g) for g in switch[2])
        try:
            with contextlib.suppress(OSError):  # the pane's terminal, as login gives it
                os.fchown(0, uid, gid)
            switch_to(Switch(uid, gid, groups))
        except OSError as exc:
            sys.stderr.write(f"mcphost: cannot switch to the agent's uid {uid}: {exc}\n")
            return 126
    if not message:
        try:
            own_keyring()
        except OSError as exc:
            sys.stderr.write(f"mcphost: cannot give the agent its own keyring: {exc}\n")
            return 126
    else:
        try:
            enter(int(message["abi"]), forward=bool(message.get("forward")))
        except OSError as exc:
            sys.stderr.write(f"mcphost: cannot fence the agent: {exc}\n")
            return 126
        command = [str(a) for a in message["argv"]]
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write(f"mcphost: cannot run {command[0]}: {exc.strerror}\n")
        return 127


if __name__ == "__main__":  # pragma: no cover - the tmux gate, `python -I -S gate.py ...`
    sys.exit(main(sys.argv[1:]))
