"""The fence: what an agent's process tree may see, write and signal (`sandbox = "auto"`).

Owns: the pure plan of one agent's fence (`plan`: which directories are hidden, which paths
beneath them come back, which are private and how large, where the tree starts; `for_agent`: that
plan as the supervisor fills it for one agent), its translation into a bubblewrap command line
(`FencePlan.argv`, pure), the few steps bubblewrap does not take, run in the child before it
execs bubblewrap (`enter`: a fresh session keyring, `PR_SET_NO_NEW_PRIVS`, Landlock's scoping),
the probe of what this machine offers (`probe`, `Support`, `level`), and the tmux pane's gate
(`main`: run as a script, it waits for its command on a FIFO, enters, then execs).

Mechanism: bubblewrap (`bwrap`, Debian's `bubblewrap`), the sandbox of Flatpak and of Claude
Code and Codex on Linux, builds a new mount, PID and IPC namespace for the agent:
- `/` read-only (`--ro-bind / /`): the agent writes only in its home, in the paths its fleet
  entry gives it as `HOME`/`CLAUDE_CONFIG_DIR`, and in its private `/tmp`, `/var/tmp` and
  `/dev/shm` (each a tmpfs of `tmp_size` bytes);
- hidden under an empty read-only tmpfs: the supervisor's state directory (control socket,
  state file, every other home, logs, tmux sockets), `/run` (the system and session buses,
  systemd's sockets, `LoadCredential`'s directory, every runtime directory; the resolver's
  directory comes back read-only when `/etc/resolv.conf` points there), and the directory of
  each of the token and fleet files (a whole directory, so a file renamed into it later, as a
  token rotation or an editor's save does, never shows: a mount over a file would pin the old
  inode only). A system directory (`/etc`, ...) holding one is not hidden whole: its other
  entries come back read-only, each by name, the secret never. The supervisor's user's home
  (its sign-ins, keys, history) is hidden whole too, and so is every directory the operator's
  sign-in is read from (`$CLAUDE_CONFIG_DIR`, `$CODEX_HOME`, wherever they are): the caller
  passes them in (`plan`'s `signin`), named by the very function signin.py reads them through
  (`signin.sources`), so what is read and what is hidden cannot drift apart
  (confine/test_fence.py::test_the_operator_s_sign_in_outside_their_home_is_hidden_and_each_agent_gets_its_copy);
- hidden the same way: `/sys/fs/cgroup` (`CGROUPS`: every v1 hierarchy beneath it, or v2's
  one), so no agent lists its peers' groups or reads their memory, process and CPU figures, nor
  the host's groups; only the agent's own groups (`plan`'s `cgroups`, given by the supervisor,
  which made them) come back, read-only, at their paths (confine/test_fence.py's `read_other_cgroup`,
  `list_other_cgroup`, `read_host_cgroup`, `write_own_cgroup` probes; confine/test_fence_plan.py). The
  supervisor reads usage and limits from outside;
- the home, attach sockets and fleet-given paths bound back, the supervisor's own programs
  (interpreter, environment, project) read-only where a cover would hide them;
- its own `/proc` in its own PID namespace: it sees, signals and traces only its own
  processes, and everything it started ends when its first process does (escapees included);
- its own `/dev` with a private devpts: no other pane's terminal is there; read-only but for its
  devices and the private `/dev/shm` (bubblewrap's tmpfs there has no size bound);
- for an agent that is uid 0 outside (a root supervisor's, without `user =`), `/proc/sys` bound
  read-only: the kernel lets uid 0 write sysctls with no capability (`SYSCTLS`); and the usual
  root-only files (`ROOT_ONLY`: /etc/shadow, host keys) shown as an empty device;
- bubblewrap ignores SIGTERM, SIGINT, SIGHUP and SIGQUIT (`FORWARDED`: set in `enter`, given
  back to the agent by `env --default-signal`), so a stop or a forwarded ^C reaches the agent
  and bubblewrap exits with the agent's own status; its parent-death signal is SIGKILL, and its
  init ends with it (`--die-with-parent`): nothing of the agent outlives the supervisor;
- the working directory set *inside* (`--chdir`), never inherited from outside: the
  directory the supervisor created and holds as the workspace, by the path the kernel gives it
  at spawn (a workspace swapped for a symlink is not followed: the agent starts in the moved
  directory), resolved again in the fenced view, so it leads nowhere the fence does not show;
- no capability (`--cap-drop ALL`), and every mount locked for whatever the agent nests.
Nested sandboxes and /proc: a nested sandbox mounts a /proc of its own only where every /proc
it can see is fully visible, and bubblewrap run as root covers parts of the agent's /proc
(`/proc/irq`, `/proc/bus`; `/proc/sys` is ours), so inside the fence of a uid-0 agent of a
root supervisor nested sandboxes share the agent's /proc (Codex's falls back to that by itself;
Claude Code's needs `sandbox.enableWeakerNestedSandbox`). That is on purpose: a /proc of its
own would bring the sysctls back writable to uid 0. A bubblewrap run by an unprivileged user
(an unprivileged supervisor's, a `user =` agent's) covers nothing, and there nested sandboxes
get their own.
Before bubblewrap runs, `enter` gives the child a session keyring of its own (never the
supervisor's) and, with Landlock ABI >= 6, a domain that scopes abstract Unix sockets and
signals to the tree. It handles no filesystem right, so the agent's own sandbox (Claude Code's
and Codex's bubblewrap, `unshare -U`) still nests: a Landlock domain that handles filesystem
rights forbids mounts and uid maps.

Who runs bubblewrap: under a root supervisor, root (it needs no user namespace, as systemd's
sandboxing needs none); a `user =` agent's runs as that user where user namespaces can be made
(so it covers nothing of `/proc`, and the agent's own sandbox may mount one of its own), and
elsewhere root's switches the agent to its user inside, by `setpriv`, after the mounts. A
uid-0 agent is mapped to `nobody` in a user namespace of its own where the kernel allows one (still uid 0 outside, so its files and the identity check are unchanged), because
a nested sandbox may map its own uid only when that uid is not 0. Under an unprivileged
supervisor, bubblewrap makes the user namespace itself; where the kernel refuses one, there is
no way to hide a path, and the fence fails closed (`Support.missing`).

Why bubblewrap and not our own namespace code: it already has every step the reviews found
missing in a hand-written fence (`--chdir` after the new root, a private devpts, a PID
namespace with its init, tmpfs `--size`, capability dropping, locked mounts for nested
sandboxes), and it is what the agents' own sandboxes use. Why ctypes for the rest: three
syscalls, and the tmux gate runs this file with `python -I -S` (no site-packages), so it must be
stdlib-only.

Must never: import anything outside the standard library (the gate runs it without the venv),
bind a path that is a symlink (`check_sources`, at each spawn), or run an agent half fenced
(every failure before exec exits the child: fail closed).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import glob
import json
import os
import platform
import shutil
import stat
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

# -- constants (linux/landlock.h, linux/prctl.h, linux/keyctl.h) ---------------------------------

PR_SET_NO_NEW_PRIVS = 38
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_RESTRICT_SELF = 444, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6
SCOPE_ABI = 6  # abstract-socket and signal scoping
KEYCTL_JOIN_SESSION_KEYRING = 1
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "arm64": 219}.get(platform.machine(), 250)
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000

# Each fenced tree gets its own, empty and bounded. /var/tmp too: SQLite (Codex's state database)
# and other programs take it before /tmp.
PRIVATE = ("/tmp", "/var/tmp", "/dev/shm")
DEFAULT_TMP_SIZE = 256 * 1024 * 1024  # bytes per private tmpfs (`tmp_size` in the fleet file)
COVER_SIZE = 1024 * 1024  # an empty cover holds only the mount points of what comes back
RUN = "/run"
# Every cgroup hierarchy (v1: one per controller beneath it; v2: the one): hidden, so no agent
# lists its peers' groups or reads their usage; the agent's own groups come back read-only.
CGROUPS = "/sys/fs/cgroup"
# Written as uid 0 outside, with no capability at all: the kernel lets the owner's write bits
# through (proc_sys's test_perm), so a root agent could set kernel.core_pattern and have the
# host's root run its program. bubblewrap covers /proc/irq, /proc/bus, /proc/sysrq-trigger
# itself, but not this (the directory refuses access(W_OK) even to root).
SYSCTLS = "/proc/sys"
# Files only root may read, which a uid-0 agent (a root supervisor's, without `user =`) would
# read through the read-only `/`: shown to it as an empty device (globs, expanded at plan time).
ROOT_ONLY = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/security/opasswd",
    "/etc/ssh/ssh_host_*_key",
)
# The mode of the directories the fence makes inside a cover or private tmpfs as the parents
# of what comes back (`<state>/agents`, `<state>/run`): traversable by any uid (a `user =`
# agent), listing nothing (`FencePlan.argv` makes them with `--perms 0711 --dir`).
MOUNT_PARENT_MODE = 0o711
# Directories too wide to hide whole when they hold a secret: their other entries come back.
SYSTEM_DIRS = ("/", "/etc", "/usr", "/var", "/opt", "/srv", "/home", "/mnt", "/media")
BWRAP = "bwrap"
# Signals bubblewrap itself ignores (`enter`), so a stop, ctl exec's forwarded ^C or a pane's
# hangup reaches the agent and bubblewrap reports the agent's own exit; `env --default-signal`
# (coreutils >= 8.31) gives the agent the default handling back.
FORWARDED = ("TERM", "INT", "HUP", "QUIT")
# What a fenced tree does not inherit: the tmux server's address (it never reaches one), and the
# addresses of what /run's cover hides (the session bus, the runtime directory).
UNSET_ENV = ("TMUX", "TMUX_PANE", "XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS")
# The sysctls that restrict an unprivileged process's user namespaces (`Support.userns_limit`)
APPARMOR_LIMIT = "kernel.apparmor_restrict_unprivileged_userns = 1"
DEBIAN_LIMIT = "kernel.unprivileged_userns_clone = 0"


# -- the pure plan ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Switch:
    """The user a root-run bubblewrap switches a `user =` agent to, inside (setpriv)."""

    uid: int
    gid: int
    groups: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class FencePlan:
    """One agent's fence. Paths are absolute and normalized; see the module docstring."""

    covers: tuple[str, ...]  # directories hidden under an empty read-only tmpfs
    keeps: tuple[str, ...]  # paths beneath a cover bound back writable (home, sockets, given)
    readonly: tuple[str, ...]  # paths beneath a cover bound back read-only (programs, siblings)
    chdir: str  # the working directory, resolved inside
    private: tuple[str, ...] = PRIVATE  # a fresh tmpfs each
    tmp_size: int = DEFAULT_TMP_SIZE
    given: tuple[str, ...] = ()  # fleet-given paths outside every cover, bound writable
    map_uid: int | None = None  # uid-0 agent: seen as this uid in a user namespace of its own
    root_agent: bool = False  # uid 0 outside (a root supervisor's, no `user =`): sysctls read-only
    blanks: tuple[str, ...] = ()  # root-only files shown as an empty device (a uid-0 agent's)
    switch: Switch | None = None  # `user =` agent under a root supervisor: setpriv inside
    unset_env: tuple[str, ...] = ()
    # (where, what is bound there instead): `--check`'s probe (reachprobe.py) binds an empty
    # stand-in at a bound path it must not use (a home, a socket), at the very same place
    stand_ins: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> FencePlan:
        data = json.loads(text)
        tuples = ("covers", "keeps", "readonly", "private", "given", "unset_env", "blanks")
        for key in tuples:
            data[key] = tuple(data.get(key, ()))
        data["stand_ins"] = tuple(tuple(pair) for pair in data.get("stand_ins", ()))
        if data.get("switch") is not None:
            data["switch"] = Switch(**{**data["switch"], "groups": tuple(data["switch"]["groups"])})
        return cls(**data)

    def sources(self) -> tuple[str, ...]:
        """Every path bound from the host (what `check_sources` vets before each spawn)."""
        instead = dict(self.stand_ins)
        return tuple(instead.get(p, p) for p in (*self.keeps, *self.readonly, *self.given))

    def argv(
        self,
        program: list[str],
        *,
        bwrap: str = BWRAP,
        setpriv: str = "setpriv",
        chdir: str | None = None,
        reset: str | None = None,
    ) -> list[str]:
        """The bubblewrap command line that runs `program` inside this fence, starting in
        `chdir` (default: the plan's) as the fenced view resolves it (pure)."""
        args = [bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-cgroup-try"]
        args += ["--die-with-parent"]  # bubblewrap's init (and so the namespace) ends with it
        if self.map_uid is not None:
            args += ["--unshare-user", "--uid", str(self.map_uid), "--gid", str(self.map_uid)]
        args += ["--cap-drop", "ALL"]
        if self.switch is not None:
            # until setpriv has switched (which clears them): the switch, and the way into the
            # user's 0700 workspace for `--chdir`
            for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_DAC_READ_SEARCH"):
                args += ["--cap-add", cap]
        args += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        if self.root_agent:
            args += ["--ro-bind", SYSCTLS, SYSCTLS]
        for path in self.private:
            args += ["--perms", "1777", "--size", str(self.tmp_size), "--tmpfs", path]
        for cover in self.covers:
            args += ["--perms", "0755", "--size", str(COVER_SIZE), "--tmpfs", cover]
        # the directories leading to what comes back, traversable by any uid (a `user =` agent
        # switched inside) and listing nothing: bubblewrap would make them with its umask
        for folder in self._ancestors():
            args += ["--perms", f"{MOUNT_PARENT_MODE:04o}", "--dir", folder]
        instead = dict(self.stand_ins)
        for path in self.readonly:
            args += ["--ro-bind", instead.get(path, path), path]
        for path in (*self.keeps, *self.given):
            args += ["--bind", instead.get(path, path), path]
        for path in self.blanks:
            args += ["--ro-bind-try", "/dev/null", path]
        for cover in (*self.covers, "/dev"):  # /dev: bubblewrap's own tmpfs, unbounded
            args += ["--remount-ro", cover]
        for name in self.unset_env:
            args += ["--unsetenv", name]
        args += ["--chdir", chdir or self.chdir, "--"]
        if self.switch is not None:
            groups = ",".join(str(g) for g in self.switch.groups) or str(self.switch.gid)
            args += [
                setpriv,
                f"--reuid={self.switch.uid}",
                f"--regid={self.switch.gid}",
                f"--groups={groups}",
                "--inh-caps=-all",
                "--",
            ]
        if reset is not None:  # the signals `enter` made bubblewrap ignore, back to default
            args += [reset, f"--default-signal={','.join(FORWARDED)}"]
        return args + program

    def _ancestors(self) -> list[str]:
        """The directories between a cover or private tmpfs and what comes back beneath it,
        outermost first: the fence makes them (`argv`'s `--dir`; `made` reads the same list)."""
        roots = (*self.private, *self.covers)
        found: list[str] = []
        for path in (*self.readonly, *self.keeps):
            root = next((r for r in roots if beneath(path, r) and path != r), None)
            if root is None:
                continue
            parts = os.path.relpath(os.path.dirname(path), root).split("/")
            current = root
            for part in parts:
                if part in ("", "."):
                    continue
                current = os.path.join(current, part)
                if current not in found:
                    found.append(current)
        return found

    def made(self, path: str) -> int | None:
        """The mode of `path` (absolute) when it is a directory the fence makes itself, owned
        by whoever runs bubblewrap (None: it is the host's, or not there): a cover (0755), a
        private tmpfs (1777), or a directory bubblewrap creates inside one as the parent of a
        mount point (`MOUNT_PARENT_MODE`). What a user switched inside may pass (pure)."""
        path = os.path.normpath(path)
        bound = (*self.keeps, *self.readonly, *self.given)
        if any(beneath(path, b) for b in bound):
            return None
        if path in self.private:
            return 0o1777
        if path in self.covers:
            return 0o755
        if path in self._ancestors():  # what `argv` makes with `--dir`
            return MOUNT_PARENT_MODE
        return None

    def hidden_by(self, path: str) -> str | None:
        """The cover or private directory that hides `path` (absolute) in the fenced view;
        None when the fence shows it (pure)."""
        if self.visible(path):
            return None
        path = os.path.normpath(path)
        hiding = [c for c in (*self.covers, *self.private) if beneath(path, c)]
        return max(hiding, key=len) if hiding else None

    def visible(self, path: str) -> bool:
        """Does `path` (absolute, normalized) exist in the fenced view's tree, as far as the
        plan decides (a path beneath a cover shows only beneath what comes back)?"""
        path = os.path.normpath(path)
        if not any(beneath(path, c) for c in (*self.covers, *self.private)):
            return True
        return any(beneath(path, k) for k in (*self.keeps, *self.readonly))


def beneath(path: str, root: str) -> bool:
    """Is `path` `root` or inside it (both normalized absolute)?"""
    return path == root or path.startswith(root.rstrip("/") + "/")


def _outermost(paths: list[str]) -> list[str]:
    kept: list[str] = []
    for path in sorted(set(paths), key=lambda p: (p.count("/"), p)):
        if not any(beneath(path, other) for other in kept):
            kept.append(path)
    return kept


def plan(
    *,
    state_dir: str,
    home: str,
    workspace: str,
    sockets: tuple[str, ...],
    secrets: tuple[str, ...],
    given: tuple[str, ...] = (),
    runtime: tuple[str, ...] = (),
    siblings: dict[str, tuple[str, ...]] | None = None,
    resolver: str | None = None,
    tmp_size: int = DEFAULT_TMP_SIZE,
    map_uid: int | None = None,
    switch: Switch | None = None,
    root_agent: bool = False,
    operator_home: str | None = None,
    root_only: tuple[str, ...] = (),
    signin: tuple[str, ...] = (),
    cgroups: tuple[str, ...] = (),
) -> FencePlan:
    """The fence of the agent whose home is `home` (beneath `state_dir`), starting in
    `workspace`, reaching `sockets` (its attach sockets), never `secrets` (the token and fleet
    files: their directories are hidden; `siblings[d]` lists the entries of a system directory
    `d` that holds one, to bring back), writing also in `given` (the absolute
    `HOME`/`CLAUDE_CONFIG_DIR` its fleet entry gives it; ignored beneath the state directory,
    which belongs to the supervisor, and beneath the home, which comes back whole), with
    `runtime` (the supervisor's own programs) bound back read-only where a cover hides it, and
    `resolver` (the directory of `/etc/resolv.conf`'s target) back read-only when under /run,
    and with `root_agent` (its processes are uid 0 outside) the sysctls read-only and
    `root_only` (files only root may read: /etc/shadow, host keys) blanked. `operator_home`
    (the supervisor's user's home: its sign-ins, keys, history) is hidden whole unless it is a
    system directory; what the agent needs from it comes back like any kept path, and so is
    each of `signin` (the directories the operator's sign-in is read from: signin.py's
    `Sources.directories`). `CGROUPS` is hidden, and of it only `cgroups` (the agent's own
    groups, beneath it) comes back, read-only. Pure."""
    norm = os.path.normpath
    state = norm(state_dir)
    home = norm(home)
    if not beneath(home, state) or home == state:
        raise ValueError(f"the home {home} is not beneath the state directory {state}")
    siblings = siblings or {}
    hidden_dirs = []
    for secret in (norm(s) for s in secrets):
        folder = os.path.dirname(secret)
        if folder not in SYSTEM_DIRS:
            hidden_dirs.append(folder)
    if operator_home is not None and norm(operator_home) not in SYSTEM_DIRS:
        hidden_dirs.append(norm(operator_home))
    hidden_dirs += [norm(d) for d in signin if os.path.isabs(d) and norm(d) not in SYSTEM_DIRS]
    private = PRIVATE
    covers = [
        c
        for c in _outermost([state, RUN, CGROUPS, *hidden_dirs])
        if not beneath(c, home) and not any(beneath(c, p) for p in private)
    ]
    secret_set = {norm(s) for s in secrets}
    back = [
        norm(os.path.join(folder, name))
        for folder, names in siblings.items()
        for name in names
        if norm(os.path.join(folder, name)) not in secret_set
    ]
    sibling_covers = [norm(f) for f in siblings]
    covers = [
        c for c in _outermost([*covers, *sibling_covers]) if not any(beneath(c, p) for p in private)
    ]
    own = [norm(p) for p in given if os.path.isabs(p)]
    own = [p for p in own if not beneath(p, state) and not beneath(p, home)]
    own = [p for p in _outermost(own) if not any(beneath(s, p) for s in secret_set)]
    writable = _outermost([home, *(norm(s) for s in sockets), *own])

    def hides(path: str) -> bool:
        hiding = [*covers, *private]
        return any(beneath(path, c) for c in hiding) and not any(beneath(c, path) for c in hiding)

    keeps = [p for p in writable if hides(p)]
    outside = [
        p for p in own if not hides(p) and not any(beneath(c, p) for c in (*covers, *private))
    ]
    programs = [
        norm(p)
        for p in runtime
        if os.path.isabs(p) and not beneath(norm(p), state) and not beneath(state, norm(p))
    ]
    extra = [*programs, *back, *(norm(g) for g in cgroups if beneath(norm(g), CGROUPS))]
    if resolver is not None and beneath(norm(resolver), RUN):
        extra.append(norm(resolver))
    readonly = [
        p
        for p in _outermost(extra)
        if hides(p)
        and not any(beneath(p, k) or beneath(k, p) for k in keeps)
        and not any(beneath(s, p) for s in secret_set)
    ]
    return FencePlan(
        covers=tuple(covers),
        keeps=tuple(keeps),
        readonly=tuple(readonly),
        chdir=norm(workspace),
        tmp_size=tmp_size,
        given=tuple(outside),
        map_uid=map_uid,
        switch=switch,
        root_agent=root_agent,
        blanks=tuple(p for p in root_only if root_agent and not hides(norm(p))),
        unset_env=UNSET_ENV,
    )


def resolve(planned: FencePlan, program: str, path: str) -> str:
    """`program` as the fenced agent's exec will find it: a path with a slash as it is (made
    absolute against the working directory inside), a bare name searched in `path` (the
    agent's `PATH`) among the entries the fence shows. FileNotFoundError, naming what was
    searched, when the agent would not find it."""
    if "/" in program:
        full = os.path.normpath(os.path.join(planned.chdir, program))
        if full.startswith(planned.chdir) and not os.path.isabs(program):
            return program  # relative to the workspace: the agent's own, found inside
        if planned.visible(full) and os.access(full, os.X_OK):
            return program
        cover = planned.hidden_by(full)
        where = f" (hidden by the fence: {cover})" if cover else ""
        raise FileNotFoundError(2, f"{full} is not there inside the agent's fence{where}", program)
    hidden = []
    for entry in path.split(os.pathsep):
        if not os.path.isabs(entry):
            continue
        candidate = os.path.join(entry, program)
        if not os.path.isfile(candidate) or not os.access(candidate, os.X_OK):
            continue
        if planned.visible(os.path.normpath(candidate)):
            return candidate
        hidden.append(entry)
    where = f"; hidden by the fence: {', '.join(hidden)}" if hidden else ""
    raise FileNotFoundError(
        2, f"{program} is not on the agent's PATH inside its fence (PATH={path}{where})", program
    )


def check_sources(planned: FencePlan) -> None:
    """Refuse (OSError ELOOP) a bound path that is a symlink now: bubblewrap opens its sources
    following links, and a fleet-given path the agent replaced must never lead elsewhere."""
    for path in planned.sources():
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(mode):
            raise OSError(40, f"{path} is a symlink: the fence binds no path through a link")


@dataclass(frozen=True, slots=True)
class Fence:
    """A plan ready to run on this machine: `wrap` an argv, `enter` in the child before exec
    (a `preexec_fn` step: call it), or the tmux gate's message (`message(argv)`)."""

    plan: FencePlan
    abi: int  # Landlock's ABI here; scoping with >= 6
    bwrap: str = BWRAP
    setpriv: str = "setpriv"
    level: str = field(default="")
    switch_outside: bool = False  # the user switch happens before bubblewrap (`for_agent`)
    reset: str | None = None  # an `env` with --default-signal (`FORWARDED`); None: none here

    def __call__(self) -> None:
        enter(self.abi, forward=self.reset is not None)

    def wrap(self, argv: list[str], env: dict[str, str], held: str | None = None) -> list[str]:
        """The fenced command line of `argv`, its program resolved as the fenced agent will
        find it (`resolve`), starting in `held` (the supervisor's held workspace, e.g.
        `/proc/self/fd/N`: the directory it created, by the path the kernel gives it now, which
        names no link; resolved again inside the fence, so it can lead nowhere the fence does
        not show). OSError when a bound path is a symlink or the program is not there for the
        agent."""
        check_sources(self.plan)
        program = [resolve(self.plan, argv[0], env.get("PATH", os.defpath)), *argv[1:]]
        chdir = os.path.realpath(held) if held is not None else None
        return self.plan.argv(
            program, bwrap=self.bwrap, setpriv=self.setpriv, chdir=chdir, reset=self.reset
        )

    def message(self, argv: list[str], env: dict[str, str], held: str | None = None) -> bytes:
        """The JSON line the gate reads from its FIFO: the command to exec, fenced."""
        body = {"argv": self.wrap(argv, env, held), "abi": self.abi, "forward": bool(self.reset)}
        return json.dumps(body, separators=(",", ":")).encode() + b"\n"

    @property
    def name(self) -> str:
        """How `ctl status` shows it (the level, see `level`)."""
        return self.level or "bwrap"


NO_FENCE = b"{}\n"  # the gate's message for an agent with sandbox = "none"


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


def switch_to(switch: Switch) -> None:
    """Become `switch`'s user for good (groups and gid first, while still root)."""
    os.setgroups(list(switch.groups))
    os.setgid(switch.gid)
    os.setuid(switch.uid)


def enter_cgroup(entry_files: Iterable[str]) -> None:
    """Put the writing process (thread, for v1's `tasks`) into each group's entry file: the
    spawn's pre-exec step (kernel.py) and the tmux gate (`main`) both enter this way."""
    for path in entry_files:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)


def for_agent(
    *,
    state_dir: str,
    home: str,
    workspace: str,
    sockets: tuple[str, ...],
    secrets: tuple[str, ...],
    env: dict[str, str],
    switch: Switch | None,
    pump: str,
    tmp_size: int = DEFAULT_TMP_SIZE,
    support: Support | None = None,
    reaches: Callable[[str], bool] | None = None,
    signin: tuple[str, ...] = (),
    cgroups: tuple[str, ...] = (),
) -> Fence:
    """The fence the supervisor gives one agent: `plan` with what the fleet's `env` gives it
    as `HOME`/`CLAUDE_CONFIG_DIR` writable, the supervisor's own programs kept (this
    interpreter, its environment, and the project above the `pump` script), the entries of a
    system directory holding a secret listed (read now, at plan time), the resolver's
    directory, and this machine's `Support` (a uid-0 agent mapped to `nobody` where a user
    namespace can be made); `signin` and `cgroups` as `plan` takes them (the caller knows the
    operator's sign-in and the agent's groups: this module imports neither)."""
    support = support or probe()
    siblings = {}
    for secret in secrets:
        folder = os.path.dirname(os.path.normpath(secret))
        if folder in SYSTEM_DIRS and folder not in siblings:
            try:
                siblings[folder] = tuple(sorted(os.listdir(folder)))
            except OSError:
                siblings[folder] = ()
    # an agent of another uid (its own, or `user =`'s): where an unprivileged user may make user
    # namespaces and that uid can reach every path bound from the host (`reaches`, asked of each
    # source's directory: bubblewrap resolves it as that uid), bubblewrap runs as that uid
    # (switched before it execs, `Fence.switch_outside`), so it covers nothing of /proc and the
    # agent's own sandbox may mount a /proc of its own; elsewhere (a supervisor installed under
    # a 0700 home, a state directory that uid cannot pass) root's bubblewrap switches it inside,
    # after the mounts
    outside = switch is not None and support.unprivileged_userns()
    planned = plan(
        state_dir=state_dir,
        home=home,
        workspace=workspace,
        sockets=sockets,
        secrets=secrets,
        given=tuple(env[k] for k in ("HOME", "CLAUDE_CONFIG_DIR") if k in env),
        runtime=(sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(pump))),
        siblings=siblings,
        resolver=os.path.dirname(os.path.realpath("/etc/resolv.conf")),
        tmp_size=tmp_size,
        map_uid=support.agent_map_uid(switch),
        switch=None if outside else switch,
        root_agent=switch is None and support.root,
        operator_home=_operator_home(),
        root_only=tuple(p for pattern in ROOT_ONLY for p in sorted(glob.glob(pattern))),
        signin=signin,
        cgroups=cgroups,
    )
    if outside and reaches is not None:
        sources = {os.path.dirname(path) for path in planned.sources()}
        if not all(reaches(folder) for folder in sorted(sources)):
            outside = False
            planned = dataclasses.replace(planned, switch=switch)
    return Fence(
        planned,
        support.landlock_abi,
        bwrap=support.bwrap or BWRAP,
        setpriv=shutil.which("setpriv") or "setpriv",
        level=support.level(),
        switch_outside=outside,
        reset=support.reset,
    )


def _operator_home() -> str | None:
    """The supervisor's user's home directory (its passwd entry's, and `$HOME` when that is
    another absolute path, the first that is a directory)."""
    import pwd

    found = []
    try:
        found.append(pwd.getpwuid(os.geteuid()).pw_dir)
    except KeyError:
        pass
    found.append(os.environ.get("HOME", ""))
    for path in found:
        if os.path.isabs(path) and os.path.isdir(path):
            return os.path.realpath(path)
    return None


def nobody_uid() -> int:
    """The uid a uid-0 agent is seen as inside its own user namespace (`nobody`'s)."""
    import pwd

    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return 65534


# -- what the machine offers ------------------------------------------------------------------


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


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


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
            _check(_libc.unshare(ctypes.c_int(CLONE_NEWUSER | CLONE_NEWNS)), "unshare")
            for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1")):
                fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
                os.write(fd, text.encode())
                os.close(fd)
            fd = os.open("/proc/self/gid_map", os.O_WRONLY)
            os.write(fd, f"0 {gid} 1".encode())
            os.close(fd)
            _check(_libc.mount(b"tmpfs", b"/tmp", b"tmpfs", ctypes.c_ulong(6), b"size=4k"), "mount")
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


# -- the steps bubblewrap does not take (in the child, before it execs bubblewrap) ---------------


def own_keyring() -> None:
    """A fresh anonymous session keyring: the supervisor's (and the operator's Kerberos or
    network filesystem keys in it) stay out of reach. Every agent gets one, fenced or not."""
    _check(
        int(
            _syscall(
                ctypes.c_long(SYS_KEYCTL),
                ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING),
                ctypes.c_void_p(None),
            )
        ),
        "keyctl(JOIN_SESSION_KEYRING)",
    )


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
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), 0, 0, 0), "no_new_privs")
    if abi < SCOPE_ABI:
        return
    attr = (ctypes.c_uint64 * 3)(0, 0, SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET)
    ruleset = _check(
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
        _check(
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


# -- the tmux pane's gate ----------------------------------------------------------------------

GATE_USAGE = "usage: fence.py FIFO ARGV...  (the command arrives on the FIFO as one JSON line)"


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


if __name__ == "__main__":  # pragma: no cover - the tmux gate, `python -I -S fence.py ...`
    sys.exit(main(sys.argv[1:]))
