"""Run a command as if on an older or stricter kernel: a real seccomp filter, no mocks (tests only).

`python tests/kernelsim.py MODE[,MODE...] -- ARGV...` installs a seccomp BPF filter in this
process, then execs ARGV. The filter is inherited by every descendant (the supervisor, bubblewrap,
the agents, their own sandboxes) and survives every exec, so the whole tree runs on what is, for
it, a kernel without the feature:

- `no-landlock`: `landlock_create_ruleset`, `landlock_add_rule` and `landlock_restrict_self`
  (444-446 on every architecture) fail with ENOSYS, as on a kernel built without Landlock or
  booted without it in `lsm=` (Debian 12 and RHEL 9 look like this to the fence, which needs
  ABI 6 for its scoping: below it, it uses none).
- `no-userns`: `unshare` and `clone` with `CLONE_NEWUSER` in their flags fail with EPERM, as
  with Debian's `kernel.unprivileged_userns_clone = 0` (here for root too: a filter cannot tell
  the initial namespace's root from the rest, so this is the stricter `user.max_user_namespaces
  = 0`); `clone3` fails with ENOSYS (its flags are behind a pointer a filter cannot read), so
  libc falls back to `clone`, whose flags it can. Other namespaces (mount, PID, IPC) stay: a root
  bubblewrap needs only those.

Modes combine (`no-landlock,no-userns`, or both words before `--`). What it cannot simulate:
Ubuntu's AppArmor restriction (`unshare(CLONE_NEWUSER)` succeeds, the new namespace has no
capabilities, mounts inside fail), a Landlock of ABI 1-5 (a filter cannot change a return value
it lets through). The fence's pure parts cover those (tests/supervisor/confine/test_probe.py).

Arch: x86_64 and aarch64 (their syscall numbers and `AUDIT_ARCH_*`); a syscall made under another
ABI (i386 `int 0x80`, x32) kills the process instead of slipping past the filter. Not root, it
sets `PR_SET_NO_NEW_PRIVS` first (the kernel requires it); root keeps setuid programs working.

Stdlib only (ctypes): a test starts it with the interpreter it has, and `argv(...)` builds the
prefix for a subprocess.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys
from typing import NamedTuple

MODES = ("no-landlock", "no-userns")
USAGE = (
    "usage: kernelsim.py MODE[,MODE...] [MODE...] -- ARGV...\n"
    f"  MODE: {', '.join(MODES)} (any combination)"
)

# linux/prctl.h, linux/seccomp.h, linux/audit.h, linux/filter.h, linux/sched.h
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, SECCOMP_RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JSET_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x45, 0x35, 0x06
CLONE_NEWUSER = 0x10000000
X32_SYSCALL_BIT = 0x40000000
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
OFF_NR, OFF_ARCH, OFF_ARG0_LOW = 0, 4, 16  # args[0]'s low half: both arches are little-endian

LANDLOCK = (444, 445, 446)  # create_ruleset, add_rule, restrict_self: the same everywhere
CLONE3 = 435


class Arch(NamedTuple):
    audit: int  # AUDIT_ARCH_*, seccomp_data.arch
    unshare: int
    clone: int
    x32: bool  # another ABI behind the same AUDIT_ARCH, told apart by a bit in the number


ARCHES = {
    "x86_64": Arch(0xC000003E, unshare=272, clone=56, x32=True),
    "aarch64": Arch(0xC00000B7, unshare=97, clone=220, x32=False),
}
ARCHES["arm64"] = ARCHES["aarch64"]
ARCHES["amd64"] = ARCHES["x86_64"]


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> tuple[int, int, int, int]:
    return (code, jt, jf, k)


def program(modes: tuple[str, ...], machine: str | None = None) -> list[tuple[int, int, int, int]]:
    """The BPF program (code, jt, jf, k) for `modes` on `machine` (default: this one). Pure."""
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ValueError(f"unknown mode {', '.join(unknown) or '(none)'}; modes: {MODES}")
    arch = ARCHES.get(machine or platform.machine())
    if arch is None:
        raise ValueError(f"unsupported architecture {machine or platform.machine()}")
    enosys = SECCOMP_RET_ERRNO | errno.ENOSYS
    eperm = SECCOMP_RET_ERRNO | errno.EPERM
    # Each rule: (syscall, verdict, needs CLONE_NEWUSER in args[0]).
    rules: list[tuple[int, int, bool]] = []
    if "no-landlock" in modes:
        rules += [(nr, enosys, False) for nr in LANDLOCK]
    if "no-userns" in modes:
        rules += [(CLONE3, enosys, False), (arch.unshare, eperm, True), (arch.clone, eperm, True)]
    prog = [
        _insn(BPF_LD_W_ABS, OFF_ARCH),
        _insn(BPF_JEQ_K, arch.audit, jt=1),
        _insn(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
        _insn(BPF_LD_W_ABS, OFF_NR),
    ]
    if arch.x32:  # the x32 ABI shares AUDIT_ARCH_X86_64, its numbers carry this bit
        prog += [
            _insn(BPF_JGE_K, X32_SYSCALL_BIT, jf=1),
            _insn(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
        ]
    for nr, verdict, flagged in rules:
        if not flagged:
            prog += [_insn(BPF_JEQ_K, nr, jf=1), _insn(BPF_RET_K, verdict)]
            continue
        # nr matches: load args[0]'s low half and return on CLONE_NEWUSER either way
        prog += [
            _insn(BPF_JEQ_K, nr, jf=4),
            _insn(BPF_LD_W_ABS, OFF_ARG0_LOW),
            _insn(BPF_JSET_K, CLONE_NEWUSER, jf=1),
            _insn(BPF_RET_K, verdict),
            _insn(BPF_RET_K, SECCOMP_RET_ALLOW),
        ]
    prog.append(_insn(BPF_RET_K, SECCOMP_RET_ALLOW))
    return prog


def install(modes: tuple[str, ...]) -> None:
    """Install the filter of `modes` on this process (and everything it starts from now on)."""
    prog = program(modes)
    raw = b"".join(struct.pack("=HBBI", *insn) for insn in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(prog), ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    ulong = ctypes.c_ulong
    libc.prctl.argtypes = [ctypes.c_int, ulong, ulong, ulong, ulong]  # unused ones must be 0
    if os.geteuid() != 0 and libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_SECCOMP): {os.strerror(err)}")


def parse(args: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """(modes, argv) from `MODE[,MODE] [MODE] -- ARGV...`; ValueError on a bad line."""
    if "--" not in args:
        raise ValueError("no `--` before the command")
    cut = args.index("--")
    modes = tuple(m for word in args[:cut] for m in word.split(",") if m)
    command = args[cut + 1 :]
    if not command:
        raise ValueError("no command after `--`")
    program(modes)  # validates the modes and the architecture
    return modes, command


def argv(modes: str | tuple[str, ...], command: list[str], python: str | None = None) -> list[str]:
    """The command line that runs `command` under `modes` (for a subprocess)."""
    words = modes if isinstance(modes, str) else ",".join(modes)
    return [python or sys.executable, os.path.abspath(__file__), words, "--", *command]


def main(args: list[str]) -> int:
    try:
        modes, command = parse(args)
    except ValueError as exc:
        sys.stderr.write(f"kernelsim: {exc}\n{USAGE}\n")
        return 2
    try:
        install(modes)
    except OSError as exc:
        sys.stderr.write(f"kernelsim: cannot install the filter: {exc}\n")
        return 1
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write(f"kernelsim: cannot run {command[0]}: {exc.strerror}\n")
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
