"""The fence: what an agent's process tree may see, write and signal (`sandbox = "auto"`).

Owns: the pure plan of one agent's fence (`plan`: which directories are hidden under a fresh
tmpfs, which paths beneath them are bound back, which files are blanked, where writes are
allowed; `for_agent`: that plan as the supervisor fills it for one agent), the thin syscall layer that applies it in a child before `execve` (`apply`), the
probe of what this kernel offers (`probe`, `Support`), and the tmux pane's gate (`main`: run as
a script, it waits for its plan on a FIFO, fences itself, then execs the agent).

Mechanism, in `apply`'s order (every step in the child, after the user switch):
1. a user namespace mapping only the caller's own uid and gid (`setgroups` denied) and a mount
   namespace (`unshare(CLONE_NEWUSER | CLONE_NEWNS)`), all mounts made private;
2. descriptors (`O_PATH`) of what stays visible are opened *before* anything is covered: the
   agent's home (its workspace is inside), its attach sockets, the paths the fleet gave it as
   `HOME`/`CLAUDE_CONFIG_DIR`;
3. a tmpfs over each hidden directory: the supervisor's state directory (control socket,
   state file, every other home, logs, the relay's store, configuration and inscriptions, tmux
   sockets), `/tmp`, `/var/tmp` and `/dev/shm` (private to the agent), the user's runtime
   directory (its systemd and D-Bus sockets would start processes outside the fence); then the
   kept paths bound back at their own paths from those descriptors (the supervisor's own
   programs -- interpreter, environment, pump -- read-only, where a cover would hide them), and
   the token and fleet
   files (when they are not hidden already) covered by an empty, unreadable, read-only file;
4. the capability bounding set emptied (an agent running as uid 0 gets no capability back at
   `execve`), `PR_SET_NO_NEW_PRIVS`;
5. a Landlock domain: writes only beneath the agent's home, its fleet-given paths, `/tmp`,
   `/var/tmp`, `/dev/shm` and the terminal and null devices; scoped signals and abstract Unix
   sockets (ABI >= 6), so nothing in the tree can signal or reach what is outside its domain,
   and (all ABIs) no ptrace of a process outside it. Landlock also refuses every mount operation to a
   sandboxed process, so the covers cannot be unmounted, not even from a nested user namespace.
Both layers are inherited by every descendant and survive `setsid`, double forks and re-exec;
nothing (`prctl` included) removes them. Reads elsewhere are not restricted: the system's
programs and libraries stay visible; the network is untouched.

Why ctypes and not a binding: PyPI has no maintained Landlock binding that also does user and
mount namespaces (the `landlock` package covers filesystem rules only and lags the ABI), the
calls are five syscalls and two libc functions, and the tmux gate runs this file with
`python -I -S` (no site-packages), so it must be stdlib-only. Why not bubblewrap: no extra
binary to install on every worker, and Landlock stacks under an agent's own sandbox (Claude
Code's and Codex's bubblewrap run inside ours).

Must never: import anything outside the standard library (the gate runs it without the venv),
follow a symlink while binding back (every source is opened `O_NOFOLLOW`), leave a step half
done (any failure raises, so the child exits before exec: fail closed), or be undone by the
agent: every mount is made before Landlock forbids mounts.
"""

from __future__ import annotations

import ctypes
import json
import os
import stat
import sys
from dataclasses import asdict, dataclass

# -- constants (linux/landlock.h, linux/sched.h, linux/mount.h, linux/prctl.h) ------------------

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 24, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4

SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_WRITE_FILE = 1 << 1
FS_REMOVE_DIR, FS_REMOVE_FILE = 1 << 4, 1 << 5
FS_MAKE_CHAR, FS_MAKE_DIR, FS_MAKE_REG, FS_MAKE_SOCK = 1 << 6, 1 << 7, 1 << 8, 1 << 9
FS_MAKE_FIFO, FS_MAKE_BLOCK, FS_MAKE_SYM = 1 << 10, 1 << 11, 1 << 12
FS_REFER, FS_TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6
MIN_ABI = 6  # signal scoping: below it, an agent could signal the supervisor and its peers

_WRITES_V1 = (
    FS_WRITE_FILE
    | FS_REMOVE_DIR
    | FS_REMOVE_FILE
    | FS_MAKE_CHAR
    | FS_MAKE_DIR
    | FS_MAKE_REG
    | FS_MAKE_SOCK
    | FS_MAKE_FIFO
    | FS_MAKE_BLOCK
    | FS_MAKE_SYM
)
_FILE_RIGHTS = FS_WRITE_FILE | FS_TRUNCATE  # the only write rights a rule on a file may hold

# Devices every program may write: the terminal (a tmux pane's), null sinks, random sources.
DEVICES = (
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
)
# Each fenced tree gets its own, empty. /var/tmp too: SQLite (Codex's state database) and other
# programs take it before /tmp, and Landlock does not answer access(2), so a read-only /var/tmp
# would look writable and fail only at open.
PRIVATE = ("/tmp", "/var/tmp", "/dev/shm")
BLANK = ".mcphost-fence-blank"


# -- the pure plan ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FencePlan:
    """One agent's fence. Paths are absolute and normalized; see the module docstring."""

    covers: tuple[str, ...]  # directories hidden under a fresh tmpfs, outermost first
    keeps: tuple[str, ...]  # paths beneath a cover bound back at the same path
    blanks: tuple[str, ...]  # files covered by an empty, unreadable, read-only file
    writable: tuple[str, ...]  # the only places the tree may write (Landlock)
    readonly: tuple[str, ...] = ()  # keeps bound back read-only (the supervisor's programs)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> FencePlan:
        data = json.loads(text)
        keys = ("covers", "keeps", "blanks", "writable", "readonly")
        return cls(**{key: tuple(data.get(key, ())) for key in keys})


def beneath(path: str, root: str) -> bool:
    """Is `path` `root` or inside it (both normalized absolute)?"""
    return path == root or path.startswith(root.rstrip("/") + "/")


def _outermost(paths: list[str]) -> tuple[str, ...]:
    kept: list[str] = []
    for path in sorted(set(paths), key=lambda p: (p.count("/"), p)):
        if not any(beneath(path, other) for other in kept):
            kept.append(path)
    return tuple(kept)


def plan(
    *,
    state_dir: str,
    home: str,
    sockets: tuple[str, ...],
    secrets: tuple[str, ...],
    given: tuple[str, ...] = (),
    hidden: tuple[str, ...] = (),
    runtime: tuple[str, ...] = (),
) -> FencePlan:
    """The fence of the agent whose home is `home` (beneath `state_dir`), reaching `sockets`
    (its attach sockets), never `secrets` (the token and fleet files), writing also in `given`
    (the absolute `HOME`/`CLAUDE_CONFIG_DIR` its fleet entry gives it; ignored beneath the state
    directory, which belongs to the supervisor), with `hidden` (e.g. the user's runtime
    directory) covered too. `runtime`: what the agent needs to run the supervisor's own
    programs (the interpreter, its environment, the pump's directory): bound back where a cover
    would hide it (an installation under /tmp), never writable. Pure."""
    norm = os.path.normpath
    state = norm(state_dir)
    home = norm(home)
    if not beneath(home, state) or home == state:
        raise ValueError(f"the home {home} is not beneath the state directory {state}")
    own = [norm(p) for p in given if os.path.isabs(p) and not beneath(norm(p), state)]
    covers = _outermost([state, *PRIVATE, *(norm(p) for p in hidden)])
    programs = [
        norm(p)
        for p in runtime
        if os.path.isabs(p) and not beneath(norm(p), state) and not beneath(state, norm(p))
    ]
    wanted = [home, *(norm(s) for s in sockets), *own, *programs]
    keeps = tuple(
        p
        for p in _outermost(wanted)
        if any(beneath(p, c) for c in covers) and not any(beneath(c, p) for c in covers)
    )
    blanks = []
    for secret in (norm(s) for s in secrets):
        shown = any(beneath(secret, k) for k in keeps)
        if shown or not any(beneath(secret, c) for c in covers):
            blanks.append(secret)
    private = [*PRIVATE, *(norm(p) for p in hidden)]
    writable = tuple(dict.fromkeys([home, *own, *private, *DEVICES]))
    # Landlock cannot carve a bound-back program tree out of the writable private /tmp, so it is
    # bound read-only (unless something the agent writes lies inside it)
    mine = [home, *(norm(s) for s in sockets), *own]
    readonly = tuple(
        k
        for k in keeps
        if any(beneath(p, k) for p in programs) and not any(beneath(m, k) for m in mine)
    )
    return FencePlan(covers, keeps, tuple(blanks), writable, readonly)


@dataclass(frozen=True, slots=True)
class Fence:
    """A plan ready to apply with this kernel's Landlock ABI: a `preexec_fn` step (call it),
    or the tmux gate's message (`message()`)."""

    plan: FencePlan
    abi: int

    def __call__(self) -> None:
        apply(self.plan, self.abi)

    def message(self) -> bytes:
        """The JSON line the gate reads from its FIFO."""
        body = {"plan": json.loads(self.plan.to_json()), "abi": self.abi}
        return json.dumps(body, separators=(",", ":")).encode() + b"\n"

    @property
    def name(self) -> str:
        """How `ctl status` shows it."""
        return f"namespaces+landlock{self.abi}"


def for_agent(
    *,
    state_dir: str,
    home: str,
    sockets: tuple[str, ...],
    secrets: tuple[str, ...],
    env: dict[str, str],
    uid: int,
    pump: str,
) -> Fence:
    """The fence the supervisor gives one agent: `plan` with what the fleet's `env` gives it
    as `HOME`/`CLAUDE_CONFIG_DIR` writable, the runtime directory of `uid` hidden (its systemd
    and D-Bus sockets), and the supervisor's own programs kept (this interpreter, its
    environment, and the project above the `pump` script), with this kernel's Landlock ABI."""
    runtime_dir = f"/run/user/{uid}"
    planned = plan(
        state_dir=state_dir,
        home=home,
        sockets=sockets,
        secrets=secrets,
        given=tuple(env[k] for k in ("HOME", "CLAUDE_CONFIG_DIR") if k in env),
        hidden=(runtime_dir,) if os.path.isdir(runtime_dir) else (),
        runtime=(sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(pump))),
    )
    return Fence(planned, probe().landlock_abi)


NO_FENCE = b"{}\n"  # the gate's message for an agent with sandbox = "none"


# -- what the kernel offers -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Support:
    """What this machine offers the fence: Landlock's ABI (0: none) and whether this user may
    create a user and mount namespace and mount a tmpfs in it (`userns_error` says why not)."""

    landlock_abi: int
    userns: bool
    userns_error: str | None = None

    def missing(self) -> str | None:
        """What is missing for the fence, as one phrase; None when nothing is."""
        lacks = []
        if not self.userns:
            lacks.append(f"unprivileged user and mount namespaces ({self.userns_error})")
        if self.landlock_abi < MIN_ABI:
            have = f"ABI {self.landlock_abi}" if self.landlock_abi else "not enabled"
            lacks.append(f"Landlock ABI >= {MIN_ABI} for signal scoping (this kernel: {have})")
        return " and ".join(lacks) or None

    def describe(self) -> str:
        """`--check`'s line: what the fence will be on this machine."""
        missing = self.missing()
        if missing is None:
            return (
                f"user+mount namespaces (state, token, fleet, other agents and tmux hidden; "
                f"private /tmp) + Landlock ABI {self.landlock_abi} (writes to the home only; "
                "signals, ptrace and abstract sockets scoped to the agent's tree)"
            )
        return f"unavailable: this machine lacks {missing}"


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
    """Try the namespaces for real in a forked child (once per process: the kernel and this
    user do not change). Call it before the event loop runs: it waits for its child itself."""
    global _SUPPORT
    if _SUPPORT is None:
        _SUPPORT = Support(landlock_abi(), *_probe_userns())
    return _SUPPORT


def _probe_userns() -> tuple[bool, str | None]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        code = 0
        try:
            _enter_namespaces()
            _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=4k")
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


# -- the syscall layer (in the child, before execve) ----------------------------------------


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    enc = os.fsencode
    _check(
        _libc.mount(
            None if source is None else enc(source),
            enc(target),
            None if fstype is None else enc(fstype),
            ctypes.c_ulong(flags),
            enc(data) if data else None,
        ),
        f"mount {target}",
    )


def _write(path: str, data: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


def _enter_namespaces() -> None:
    """The namespaces and the 1:1 maps. A child of the (non-dumpable) supervisor has its /proc
    files owned by root, so it could not write its own maps: it is dumpable for exactly these
    writes, then not again until `execve` (only an unfenced process of the same uid could attach
    in that window, and such a process can read the token file anyway)."""
    uid, gid = os.geteuid(), os.getegid()
    dumpable = _libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)
    if dumpable != 1:
        _check(_libc.prctl(PR_SET_DUMPABLE, ctypes.c_ulong(1), 0, 0, 0), "set_dumpable")
    try:
        _check(_libc.unshare(ctypes.c_int(CLONE_NEWUSER | CLONE_NEWNS)), "unshare")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    finally:
        if dumpable != 1:
            _libc.prctl(PR_SET_DUMPABLE, ctypes.c_ulong(0), 0, 0, 0)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)


def _mountpoint(path: str, cover: str, directory: bool) -> None:
    """Create `path` (a directory or an empty file) and its parents beneath `cover` (a tmpfs
    of ours), unless it exists."""
    parts = os.path.relpath(path, cover).split("/")
    current = cover
    for part in parts[:-1]:
        current = os.path.join(current, part)
        if not os.path.isdir(current):
            os.mkdir(current, 0o755)
    if os.path.lexists(path):
        return
    if directory:
        os.mkdir(path, 0o755)
    else:
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600))


def _landlock(plan: FencePlan, abi: int) -> None:
    handled = _WRITES_V1 | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0)
    scoped = SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET if abi >= 6 else 0
    attr = (ctypes.c_uint64 * 3)(handled, 0, scoped)
    size = ctypes.sizeof(attr) if abi >= 6 else 16
    ruleset = _check(
        int(
            _syscall(
                ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET),
                ctypes.byref(attr),
                ctypes.c_size_t(size),
                ctypes.c_uint32(0),
            )
        ),
        "landlock_create_ruleset",
    )
    try:
        for path in plan.writable:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
                rule = _PathBeneath(handled if is_dir else handled & _FILE_RIGHTS, fd)
                _check(
                    int(
                        _syscall(
                            ctypes.c_long(SYS_LANDLOCK_ADD_RULE),
                            ctypes.c_int(ruleset),
                            ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                            ctypes.byref(rule),
                            ctypes.c_uint32(0),
                        )
                    ),
                    f"landlock_add_rule {path}",
                )
            finally:
                os.close(fd)
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), 0, 0, 0), "no_new_privs")
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


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _drop_capabilities() -> None:
    """Empty the bounding set: at `execve` nothing (not uid 0) regains a capability."""
    with open("/proc/sys/kernel/cap_last_cap", "rb") as handle:
        last = int(handle.read())
    for cap in range(last + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0), "capbset_drop")
    _libc.prctl(PR_CAP_AMBIENT, ctypes.c_ulong(PR_CAP_AMBIENT_CLEAR_ALL), 0, 0, 0)


def apply(plan: FencePlan, abi: int) -> None:
    """Fence the calling process (single-threaded: a child between fork and exec, or the tmux
    gate) as the module docstring says. Raises OSError at the first step that fails."""
    _enter_namespaces()
    sources = []
    for path in plan.keeps:
        try:
            sources.append((path, os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)))
        except FileNotFoundError:  # e.g. no relay socket: nothing to bind back
            continue
    for cover in plan.covers:
        if os.path.isdir(cover):
            mode = "1777" if cover in PRIVATE else "0755"
            _mount("tmpfs", cover, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode}")
    for path, fd in sources:
        cover = next(c for c in plan.covers if beneath(path, c))
        _mountpoint(path, cover, stat.S_ISDIR(os.fstat(fd).st_mode))
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        if path in plan.readonly:
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.close(fd)
    blanks = [p for p in plan.blanks if os.path.exists(p)]
    if blanks:
        source = os.path.join(PRIVATE[0], BLANK)
        os.close(os.open(source, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0))
        for path in blanks:
            _mount(source, path, None, MS_BIND)
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.unlink(source)
    _drop_capabilities()
    _landlock(plan, abi)


# -- the tmux pane's gate ----------------------------------------------------------------------

GATE_USAGE = "usage: fence.py FIFO ARGV...  (the plan arrives on the FIFO as one JSON line)"


def main(argv: list[str]) -> int:
    """The pane's process: read one line from the FIFO (a plan as JSON, or `{}` for none;
    EOF: the runner gave up, exit 1), fence itself, drop `TMUX`/`TMUX_PANE` from a fenced
    environment, then exec the agent (same pid). 126 when the fence fails, 127 when the
    program cannot be run."""
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
    text = data.decode().strip()
    env = dict(os.environ)
    if text != "{}":
        message = json.loads(text)
        try:
            apply(FencePlan.from_json(json.dumps(message["plan"])), int(message["abi"]))
        except OSError as exc:
            sys.stderr.write(f"mcphost: cannot fence the agent: {exc}\n")
            return 126
        env.pop("TMUX", None)
        env.pop("TMUX_PANE", None)
    try:
        os.execvpe(argv[1], argv[1:], env)
    except OSError as exc:
        sys.stderr.write(f"mcphost: cannot run {argv[1]}: {exc.strerror}\n")
        return 127


if __name__ == "__main__":  # pragma: no cover - the tmux gate, `python -I -S fence.py ...`
    sys.exit(main(sys.argv[1:]))
