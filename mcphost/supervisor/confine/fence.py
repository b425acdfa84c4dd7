"""The fence: what an agent's process tree may see, write and signal (`sandbox = "auto"`).

Owns: the pure plan of one agent's fence (`plan`: which directories are hidden, which paths
beneath them come back, which are private and how large, where the tree starts), its
translation into a bubblewrap command line (`FencePlan.argv`, pure), where the fenced agent
finds its program (`resolve`), which of its arguments name a path it hides (`hidden_arguments`,
for `--check`), and the check of what is bound (`check_sources`), and `Fence`, that
plan ready to run on this machine (`for_agent`: as the supervisor fills it for one agent, with
what the probe found, confine/probe.py). Not here: the steps bubblewrap does not take, run in
the child before it execs bubblewrap (a fresh session keyring, `PR_SET_NO_NEW_PRIVS`, Landlock's
scoping; the cgroup entry and the user switch before them), and the tmux pane's gate that runs
them: both in mcphost/gate.py, a standard-library-only script (`Fence.__call__` and
`Fence.message` hand over to it).

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
- bubblewrap ignores SIGTERM, SIGINT, SIGHUP and SIGQUIT (`FORWARDED`: set in gate.py's `enter`,
  given back to the agent by `env --default-signal`), so a stop or a forwarded ^C reaches the agent
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
Before bubblewrap runs, the child gives itself a session keyring of its own (never the
supervisor's) and, with Landlock ABI >= 6, a domain that scopes abstract Unix sockets and
signals to the tree (mcphost/gate.py `enter`). It handles no filesystem right, so the agent's
own sandbox (Claude Code's and Codex's bubblewrap, `unshare -U`) still nests.

Who runs bubblewrap: under a root supervisor, root (it needs no user namespace, as systemd's
sandboxing needs none); a `user =` agent's runs as that user where user namespaces can be made
(so it covers nothing of `/proc`, and the agent's own sandbox may mount one of its own), and
elsewhere root's switches the agent to its user inside, by `setpriv`, after the mounts. A
uid-0 agent is mapped to `nobody` in a user namespace of its own where the kernel allows one (still uid 0 outside, so its files and the identity check are unchanged), because
a nested sandbox may map its own uid only when that uid is not 0. Under an unprivileged
supervisor, bubblewrap makes the user namespace itself; where the kernel refuses one, there is
no way to hide a path, and the fence fails closed (probe.py `Support.missing`).

Why bubblewrap and not our own namespace code: it already has every step the reviews found
missing in a hand-written fence (`--chdir` after the new root, a private devpts, a PID
namespace with its init, tmpfs `--size`, capability dropping, locked mounts for nested
sandboxes), and it is what the agents' own sandboxes use.

Must never: bind a path that is a symlink (`check_sources`, at each spawn), or run an agent half
fenced (every failure before exec exits the child: fail closed).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import json
import os
import shutil
import stat
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

from mcphost.gate import FORWARDED, Switch, enter, fenced_message
from mcphost.supervisor.confine.probe import BWRAP, Support, probe

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
# What a fenced tree does not inherit: the tmux server's address (it never reaches one), and the
# addresses of what /run's cover hides (the session bus, the runtime directory).
UNSET_ENV = ("TMUX", "TMUX_PANE", "XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS")


# -- the pure plan ----------------------------------------------------------------------------


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

    def _ancestors(self) -> tuple[str, ...]:
        """The directories between a cover or private tmpfs and what comes back beneath it,
        outermost first: the fence makes them (`argv`'s `--dir`; `made` reads the same list).
        Worked out once per plan (`_ancestors_of`): the load-time reach check asks `made` of
        every step of every path it walks, for every agent."""
        return _ancestors_of(self.private, self.covers, self.readonly, self.keeps)

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


@functools.lru_cache(maxsize=1024)
def _ancestors_of(
    private: tuple[str, ...],
    covers: tuple[str, ...],
    readonly: tuple[str, ...],
    keeps: tuple[str, ...],
) -> tuple[str, ...]:
    """`FencePlan._ancestors` of a plan with these paths (pure, so cached)."""
    roots = (*private, *covers)
    found: list[str] = []
    for path in (*readonly, *keeps):
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
    return tuple(found)


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
    operator_home: str | tuple[str, ...] | None = None,
    root_only: tuple[str, ...] = (),
    signin: tuple[str, ...] = (),
    cgroups: tuple[str, ...] = (),
    programs: tuple[str, ...] = (),
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
    groups, beneath it) comes back, read-only. `programs` (the agent's program's install
    trees, `install_trees`) come back read-only where an operator's home hides them, and only
    there: never one beneath or holding a sign-in directory, a secret's directory or the state
    directory (`vendor_trees`). Pure."""
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
    homes = (operator_home,) if isinstance(operator_home, str) else operator_home or ()
    homes = tuple(norm(h) for h in homes if os.path.isabs(h) and norm(h) not in SYSTEM_DIRS)
    hidden_dirs += homes
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
    programs_kept = [
        norm(p)
        for p in runtime
        if os.path.isabs(p) and not beneath(norm(p), state) and not beneath(state, norm(p))
    ]
    fenced_off = (state, *(norm(d) for d in hidden_dirs if d not in homes))
    vendor = vendor_trees(programs, homes, fenced_off, tuple(secret_set))
    extra = [*programs_kept, *vendor, *back]
    extra += [norm(g) for g in cgroups if beneath(norm(g), CGROUPS)]
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


def vendor_trees(
    programs: tuple[str, ...],
    homes: tuple[str, ...],
    fenced_off: tuple[str, ...],
    secrets: tuple[str, ...],
) -> list[str]:
    """Of `programs` (install trees, absolute), those the fence may bring back read-only: each
    strictly beneath one of `homes` (the operator's), and neither beneath nor holding any of
    `fenced_off` (the state directory, the secrets' and sign-in directories) nor holding a
    secret (pure). What lies elsewhere is either visible already or hidden for a reason of its
    own (`/tmp`, `/run`, the state directory), and stays so."""
    norm = os.path.normpath
    kept = []
    for tree in (norm(p) for p in programs if os.path.isabs(p)):
        if not any(beneath(tree, h) and tree != h for h in homes):
            continue
        if any(beneath(tree, d) or beneath(d, tree) for d in fenced_off):
            continue
        if any(beneath(secret, tree) for secret in secrets):
            continue
        kept.append(tree)
    return kept


def install_trees(
    program: str, path: str, *, untrusted: tuple[str, ...] = (), depth: int = 2
) -> tuple[str, ...]:
    """What of the host makes up `program` (a path, or a name searched in `path` as an exec
    would, on the host): its file once every symlink is followed, or, when that file lies in
    an npm package, the package's directory (the `node_modules/<name>` or
    `node_modules/@scope/<name>` outermost on its path, holding a `package.json` and its own
    dependencies); then the same for the interpreter its `#!` line names (`/usr/bin/env node`:
    `node` in `path`). Claude Code's native installer (`~/.local/bin/claude` ->
    `~/.local/share/claude/versions/<v>`, one file), an npm global or user-prefix install
    (`<prefix>/bin/claude` -> `<prefix>/lib/node_modules/@anthropic-ai/claude-code/...`) and
    Codex's standalone binary (one file) each come to one tree.

    Never follows a path an agent controls: where the program is found, or any symlink on the
    way to it, lies beneath `untrusted` (what agents write: the state directory with their
    homes, their fleet-given paths, the world-writable temporary directories), nothing is
    returned, so a link an agent plants (`<home>/bin/claude` -> `~/.ssh/id_ed25519`) exposes
    nothing; and the file must be a regular, executable one. Empty when it is not found.
    Reads the filesystem only."""
    found = program if "/" in program else shutil.which(program, path=path)
    if not found or not os.path.isabs(found):
        return ()
    hop, hops = os.path.normpath(found), 0
    while True:
        where = os.path.join(os.path.realpath(os.path.dirname(hop)), os.path.basename(hop))
        if any(beneath(where, u) for u in untrusted):
            return ()
        if not os.path.islink(where) or hops > 40:
            break
        hop, hops = (
            os.path.normpath(os.path.join(os.path.dirname(where), os.readlink(where))),
            hops + 1,
        )
    real = os.path.realpath(found)
    try:
        info = os.stat(real)
    except OSError:
        return ()
    if any(beneath(real, u) for u in untrusted) or not stat.S_ISREG(info.st_mode):
        return ()
    if not os.access(real, os.X_OK):
        return ()
    parts = real.split("/")
    tree = real
    if "node_modules" in parts[:-1]:
        at = parts.index("node_modules")
        size = 3 if at + 2 < len(parts) and parts[at + 1].startswith("@") else 2
        package = "/".join(parts[: at + size])
        if os.path.isfile(os.path.join(package, "package.json")):
            tree = package
    trees = [tree]
    if depth > 0:
        for interpreter in _shebang(real):
            more = install_trees(interpreter, path, untrusted=untrusted, depth=depth - 1)
            trees += [t for t in more if t not in trees]
    return tuple(trees)


def _shebang(path: str) -> list[str]:
    """The programs a script's `#!` line runs: the interpreter, and for `env` its program."""
    try:
        with open(path, "rb") as file:
            head = file.read(256)
    except OSError:
        return []
    if not head.startswith(b"#!"):
        return []
    words = os.fsdecode(head[2:].split(b"\n", 1)[0]).split()
    if not words:
        return []
    if os.path.basename(words[0]) == "env":
        names = [w for w in words[1:] if not w.startswith("-")]
        return [words[0], *names[:1]]
    return words[:1]


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
        real = _brought_back(planned, full)
        if real is not None:
            return real
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
        real = _brought_back(planned, candidate)
        if real is not None:
            return real
        hidden.append(entry)
    where = f"; hidden by the fence: {', '.join(hidden)}" if hidden else ""
    raise FileNotFoundError(
        2, f"{program} is not on the agent's PATH inside its fence (PATH={path}{where})", program
    )


def hidden_arguments(planned: FencePlan, argv: list[str]) -> list[tuple[int, str, str]]:
    """The arguments of `argv` (after its program) that name a path the host has and the fence
    hides, as (position, the path, the cover or private directory that hides it): an argument
    that is an absolute path, or the value of an `--option=/path`. A script beside the fleet
    file (`python3 /srv/fleet/agent.py`) is there for the operator and not for the agent."""
    found = []
    for position, argument in enumerate(argv[1:], start=1):
        value = argument
        if argument.startswith("-"):
            if "=" not in argument:
                continue
            value = argument.split("=", 1)[1]
        if not os.path.isabs(value) or "\0" in value or not os.path.lexists(value):
            continue
        cover = planned.hidden_by(os.path.normpath(value))
        if cover is not None:
            found.append((position, value, cover))
    return found


def _brought_back(planned: FencePlan, hidden: str) -> str | None:
    """The file a hidden `hidden` leads to through its symlinks, when the fence brings that back
    read-only from beneath a cover (an install tree of `vendor_trees`: `~/.local/bin/claude` is
    hidden, its version file is not): the agent execs it there. Not a link to a file visible
    anyway: a virtualenv's `python` under a hidden home would run as the bare system one."""
    real = os.path.realpath(hidden)
    if real == os.path.normpath(hidden) or not os.access(real, os.X_OK):
        return None
    return real if any(beneath(real, tree) for tree in planned.readonly) else None


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


# -- the fence on this machine ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fence:
    """A plan ready to run on this machine: `wrap` an argv, gate.py's `enter` in the child
    before exec (a `preexec_fn` step: call it), or the tmux gate's message (`message(argv)`)."""

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
        return fenced_message(self.wrap(argv, env, held), self.abi, bool(self.reset))

    @property
    def name(self) -> str:
        """How `ctl status` shows it (the level, see `level`)."""
        return self.level or "bwrap"


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
    programs: tuple[str, ...] = (),
    homes: tuple[str, ...] | None = None,
) -> Fence:
    """The fence the supervisor gives one agent: `plan` with what the fleet's `env` gives it
    as `HOME`/`CLAUDE_CONFIG_DIR` writable, the supervisor's own programs kept (this
    interpreter, its environment, and the project above the `pump` script), the entries of a
    system directory holding a secret listed (read now, at plan time), the resolver's
    directory, and this machine's `Support` (a uid-0 agent mapped to `nobody` where a user
    namespace can be made); `signin` and `cgroups` as `plan` takes them (the caller knows the
    operator's sign-in and the agent's groups: this module imports neither), and `programs`
    too (the agent's program's `install_trees`, which the caller finds with its `PATH`), and
    `homes` (the operator's, default `operator_homes` of this process's environment)."""
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
        operator_home=operator_homes(os.environ) if homes is None else homes,
        root_only=tuple(p for pattern in ROOT_ONLY for p in sorted(glob.glob(pattern))),
        signin=signin,
        cgroups=cgroups,
        programs=programs,
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


def operator_homes(env: Mapping[str, str]) -> tuple[str, ...]:
    """The supervisor's user's home directories: its passwd entry's, and `env`'s `HOME` when
    that is another (where the agents' vendors' installers, which follow `$HOME`, put their
    programs); each that is a directory, resolved."""
    import pwd

    found = []
    try:
        found.append(pwd.getpwuid(os.geteuid()).pw_dir)
    except KeyError:
        pass
    found.append(env.get("HOME", ""))
    homes = (os.path.realpath(p) for p in found if os.path.isabs(p) and os.path.isdir(p))
    return tuple(dict.fromkeys(homes))
