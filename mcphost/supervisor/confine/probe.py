"""What this machine offers the fence: the probe, once per process (`probe` -> `Support`).

Owns: `Support`, what the fence can be here and what follows from it (`missing`: what makes the
fence impossible, one phrase for `--check` and the refusal at load; `lacks`: the protections it
cannot give; `level`: what `ctl status` shows; `agent_map_uid`: whether a uid-0 agent gets a user
namespace of its own, as `nobody`, `nobody_uid`), and the probe that fills it: Landlock's ABI
(mcphost/gate.py `landlock_abi`), whether this process may make a user and mount namespace and
mount in it (tried for real in a forked child, `_probe_unshare`; where that is refused, bubblewrap
itself, `_probe_userns`: an AppArmor profile may allow it what it refuses this interpreter),
what restricts an unprivileged process's user namespaces (`APPARMOR_LIMIT`, `DEBIAN_LIMIT`),
where bubblewrap is (`BWRAP` on PATH), and whether `env` can give a signal its default handling
back (`--default-signal`, coreutils >= 8.31).

The kernels and distributions this maps (docs/concepts.md, "Kernels and distributions"):
tests/supervisor/confine/test_probe.py, one row each.

Must never: probe on the event loop (it waits for its own child: call it before the loop runs),
or answer "yes" for what it did not try (a wrong yes fails closed anyway: bubblewrap then refuses
to run the agent).
"""

from __future__ import annotations

import ctypes
import os
import shutil
from dataclasses import dataclass

from mcphost.gate import LIBC, SCOPE_ABI, Switch, checked, landlock_abi

BWRAP = "bwrap"
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
# The sysctls that restrict an unprivileged process's user namespaces (`Support.userns_limit`)
APPARMOR_LIMIT = "kernel.apparmor_restrict_unprivileged_userns = 1"
DEBIAN_LIMIT = "kernel.unprivileged_userns_clone = 0"


def nobody_uid() -> int:
    """The uid a uid-0 agent is seen as inside its own user namespace (`nobody`'s)."""
    import pwd

    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return 65534


@dataclass(frozen=True, slots=True)
class Support:
    """What this machine offers the fence: Landlock's ABI (0: none), whether this process may
    create a user namespace (and mount in it; `userns_error` says why not), whether it runs as
    root, where bubblewrap is (None: not installed), and what restricts an unprivileged
    process's user namespaces (`userns_limit`, the sysctl set; a root supervisor is not
    restricted, its agents are): AppArmor's (`kernel.apparmor_restrict_unprivileged_userns = 1`,
    Ubuntu 23.10 and later: a namespace made by a program no profile allows it has no
    capabilities, so no mounts) or Debian's (`kernel.unprivileged_userns_clone = 0`: none)."""

    landlock_abi: int
    userns: bool
    userns_error: str | None = None
    root: bool = False
    bwrap: str | None = BWRAP
    reset: str | None = None  # `env` where it has --default-signal (coreutils >= 8.31)
    userns_limit: str | None = None

    def agent_map_uid(self, switch: Switch | None) -> int | None:
        """The uid a uid-0 agent is seen as, in a user namespace of its own (`nobody`'s): only
        under a root supervisor, for an agent without `user =` (`switch`), where user
        namespaces can be made; None (no user namespace: the agent is uid 0 without
        capabilities, and its own sandboxes cannot nest) otherwise."""
        if switch is None and self.root and self.userns:
            return nobody_uid()
        return None

    def unprivileged_userns(self) -> bool:
        """May an unprivileged process (a `user =` agent's bubblewrap) make user namespaces
        here? Where the probe ran as root, only if no sysctl restricts them."""
        return self.userns and self.userns_limit is None

    def missing(self) -> str | None:
        """What makes the fence impossible here, as one phrase; None when it can be built."""
        if self.bwrap is None:
            return "bubblewrap (`bwrap` on PATH; Debian/Ubuntu: apt-get install bubblewrap)"
        if not self.root and not self.userns:
            return (
                f"unprivileged user namespaces ({self.userns_error}); run the supervisor as "
                "root (contrib/systemd/mcphost-supervisor.service without User=) to fence "
                "without them"
            )
        return None

    def lacks(self) -> tuple[str, ...]:
        """The protections the fence cannot give here, each as one phrase."""
        out = []
        if self.landlock_abi < SCOPE_ABI:
            have = f"ABI {self.landlock_abi}" if self.landlock_abi else "no Landlock"
            out.append(
                f"abstract Unix sockets are not scoped (Landlock ABI >= {SCOPE_ABI}; here: {have})"
            )
        if not self.userns:
            out.append(
                "agents cannot nest their own sandboxes (Claude Code's, Codex's): no user "
                f"namespaces ({self.userns_error})"
            )
        elif self.userns_limit == APPARMOR_LIMIT:
            out.append(
                "agents' own sandboxes nest only through a program an AppArmor profile lets "
                f"make user namespaces ({APPARMOR_LIMIT}; for bubblewrap: the "
                "bwrap-userns-restrict profile, loaded by default from Ubuntu 25.04)"
            )
        elif self.userns_limit is not None:
            out.append(
                "agents cannot nest their own sandboxes (Claude Code's, Codex's): no user "
                f"namespaces for them ({self.userns_limit})"
            )
        return tuple(out)

    def level(self) -> str:
        """The level every fenced agent gets here, as `ctl status` shows it."""
        name = "bwrap"
        if self.landlock_abi >= SCOPE_ABI:
            name += f"+landlock{self.landlock_abi}"
        if not self.userns or self.userns_limit not in (None, APPARMOR_LIMIT):
            name += " (no nesting)"
        return name

    def describe(self) -> str:
        """`--check`'s line: what the fence will be on this machine."""
        missing = self.missing()
        if missing is not None:
            return f"unavailable: this machine lacks {missing}"
        who = "root" if self.root else "an unprivileged user"
        text = (
            f"{self.level()}: bubblewrap run as {who} (state, token and fleet directories, "
            "other agents, /run and tmux hidden; private /tmp, /dev and /proc; own PID "
            "namespace: signals and ptrace stay in the agent's tree; own session keyring)"
        )
        lacks = self.lacks()
        return text + ("; not given here: " + "; ".join(lacks) if lacks else "")


_SUPPORT: Support | None = None


def probe() -> Support:
    """Look at this machine once per process (the kernel and this user do not change). Call it
    before the event loop runs: it waits for its own child."""
    global _SUPPORT
    if _SUPPORT is None:
        bwrap = shutil.which(BWRAP)
        _SUPPORT = Support(
            landlock_abi(),
            *_probe_userns(bwrap),
            root=os.geteuid() == 0,
            bwrap=bwrap,
            userns_limit=_userns_limit(),
            reset=_probe_reset(),
        )
    return _SUPPORT


def _probe_reset() -> str | None:
    """`env`, if it can put a signal back to its default handling (`--default-signal`)."""
    import subprocess

    program = shutil.which("env")
    if program is None:
        return None
    try:
        done = subprocess.run(
            [program, "--default-signal=TERM", "true"], capture_output=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return program if done.returncode == 0 else None


def _userns_limit() -> str | None:
    """The sysctl that restricts an unprivileged process's user namespaces here, as `name =
    value`; None when neither is set."""
    for limit in (APPARMOR_LIMIT, DEBIAN_LIMIT):
        name, _, value = limit.partition(" = ")
        try:
            with open("/proc/sys/" + name.replace(".", "/")) as sysctl:
                if sysctl.read().strip() == value:
                    return limit
        except OSError:
            continue
    return None


def _probe_userns(bwrap: str | None) -> tuple[bool, str | None]:
    """`_probe_unshare`, and where it fails, bubblewrap itself: an AppArmor profile
    (bwrap-userns-restrict) may give bubblewrap the user namespace it refuses this interpreter,
    and bubblewrap is what makes the fence's. A wrong yes fails closed anyway: bubblewrap then
    refuses to run the agent."""
    ok, error = _probe_unshare()
    if ok or bwrap is None:
        return ok, error
    import subprocess

    try:
        done = subprocess.run(
            [bwrap, "--unshare-user", "--ro-bind", "/", "/", "--tmpfs", "/tmp", "--", "true"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ok, error
    return (True, None) if done.returncode == 0 else (ok, error)


def _probe_unshare() -> tuple[bool, str | None]:
    """Can this process make a user and mount namespace, map itself, and mount a tmpfs there
    (what bubblewrap needs from an unprivileged user, and what Ubuntu's AppArmor restriction
    refuses)? Tried for real in a forked child."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        code = 0
        try:
            uid, gid = os.geteuid(), os.getegid()
            checked(LIBC.unshare(ctypes.c_int(CLONE_NEWUSER | CLONE_NEWNS)), "unshare")
            for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1")):
                fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
                os.write(fd, text.encode())
                os.close(fd)
            fd = os.open("/proc/self/gid_map", os.O_WRONLY)
            os.write(fd, f"0 {gid} 1".encode())
            os.close(fd)
            checked(LIBC.mount(b"tmpfs", b"/tmp", b"tmpfs", ctypes.c_ulong(6), b"size=4k"), "mount")
        except OSError as exc:
            os.write(write, f"{exc.strerror or exc}".encode()[:200])
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        error = pipe.read().decode("utf-8", "replace")
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) == 0:
        return True, None
    return False, error or f"probe {os.waitstatus_to_exitcode(status)}"
