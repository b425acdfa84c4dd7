"""Boot a Debian release's own kernel under QEMU and run a command on it, with this machine's files.

    .venv/bin/python tests/kernelvm.py list
    .venv/bin/python tests/kernelvm.py fetch debian-12
    .venv/bin/python tests/kernelvm.py run debian-12 [--cgroup root|delegated] -- COMMAND [ARG ...]
    .venv/bin/python tests/kernelvm.py run debian-12 --init systemd -- COMMAND [ARG ...]

The fence and the per-agent limits depend on the kernel (Landlock's ABI, user namespaces,
cgroup v2 and its controllers), and the machine the suite runs on has one kernel. This boots the
kernels workers run, as Debian ships them (`KERNELS`: the `linux-image-amd64` package of each
release, fetched from deb.debian.org and checked against the release's package index), and runs
a command on each: `tests/kernels/test_kernels.py` runs the fence's and the limits' black-box
tests there (`make test-kernels`).

The guest: the kernel boots an initramfs made here (Debian's static busybox and the kernel's own
virtio, 9p and overlay modules, in their dependency order); it mounts this machine's `/`
read-only over 9p with a tmpfs overlay on top (the guest may write anywhere; nothing reaches the
host), fresh `/proc`, `/sys`, `/dev`, `/dev/pts` and `/dev/shm`, and a cgroup2 hierarchy at
`/sys/fs/cgroup` with every controller on it (what a systemd host gives a service). It brings
`lo` up and runs COMMAND as root in the current directory, with the current environment. With
`--cgroup delegated` the command runs in `/sys/fs/cgroup/mcphost.service`, a group whose
controllers are enabled for its children: what systemd's `Delegate=yes` hands a unit. Its output
and exit status come back through a second, writable 9p share; the exit status is this
program's.

With `--init systemd` the same root is built, then this machine's own systemd
(`/lib/systemd/systemd`) becomes PID 1 on it, as on a booted worker: it mounts the cgroup2
hierarchy itself (unified, the only one systemd 252 mounts by default), `/run` and the rest, and
boots `kernelvm.target` instead of the default target, so none of the machine's own
enabled services (a database, avahi, timers) start. The target wants one service,
`kernelvm.service` (`systemd_units()`, put in the overlay's `/etc/systemd/system`), which
mounts the out share and runs COMMAND as above, from its own cgroup under `system.slice`, with journald running beside it;
`tests/kernels/test_systemd_unit.py` uses this to run the contrib unit under a real systemd.

Why by hand: virtme-ng (PyPI) boots a kernel over the host's root the same way, but takes a
distribution kernel's modules only from an installed package (`/lib/modules/<release>`, made by
depmod), and installing a second kernel package on the worker is not a test's business. Here
the package is only read: `ar` and `tar` from the standard library, the modules' dependencies
from their own `.modinfo`, and the initramfs written as a `newc` archive.

Acceleration: QEMU's TCG (software, multi-threaded) by default; `MCPHOST_KERNELVM_ACCEL=kvm`
uses KVM where nested virtualisation works (inside this machine's own VM it hangs at boot).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import lzma
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MIRROR = "https://deb.debian.org/debian"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mcphost" / "kernels"
BUSYBOX_SUITE = "bookworm"
GUEST_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay")
OUT_TAG = "kvmout"
ROOT_TAG = "hostroot"
GUEST_OUT = "/run/kernelvm"
INITS = ("busybox", "systemd")
SYSTEMD = "/lib/systemd/systemd"
OUT_MOUNT = f"mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 {OUT_TAG}"
DELEGATED_GROUP = "/sys/fs/cgroup/mcphost.service"
NOT_PASSED = re.compile(r"^(TMUX|TMUX_PANE|PYTEST_.*|COV_.*|SSH_.*|DISPLAY|WAYLAND_.*)$")


@dataclass(frozen=True)
class Kernel:
    """A release's kernel as workers run it: what the suite expects of it is in `facts`."""

    name: str
    suite: str
    facts: str


KERNELS = {
    kernel.name: kernel
    for kernel in (
        Kernel("debian-11", "bullseye", "Linux 5.10: no Landlock (5.13 brought it), cgroup v2"),
        Kernel("debian-12", "bookworm", "Linux 6.1: Landlock ABI 2 (no scopes), cgroup v2"),
        Kernel("debian-13", "trixie", "Linux 6.12: Landlock ABI 6 (scopes), cgroup v2"),
    )
}


class KernelVmError(Exception):
    """A step that failed, said so that the operator knows what to do."""


# --- Debian's package index and .deb files (read, never installed) ---------------------------


def _download(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            return bytes(response.read())
    except OSError as error:
        raise KernelVmError(f"cannot download {url}: {error}") from error


def parse_index(text: str) -> dict[str, dict[str, str]]:
    """A Debian `Packages` file as {package: {field: value}}; the last stanza of a name wins."""
    packages: dict[str, dict[str, str]] = {}
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line and not line[0].isspace() and ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if "Package" in fields:
            packages[fields["Package"]] = fields
    return packages


def resolve(index: dict[str, dict[str, str]], package: str, *, meta: bool) -> dict[str, str]:
    """The stanza of `package`, or (`meta`) of the package its first dependency names."""
    fields = index.get(package)
    if fields is None:
        raise KernelVmError(f"{package} is not in the release's package index")
    if not meta:
        return fields
    target = re.match(r"[^\s,(|]+", fields.get("Depends", ""))
    return resolve(index, target.group(0), meta=False) if target else fields


def ar_members(data: bytes) -> Iterator[tuple[str, bytes]]:
    """The members of a `.deb` (an `ar` archive)."""
    if not data.startswith(b"!<arch>\n"):
        raise KernelVmError("not a Debian package (no ar header)")
    offset = 8
    while offset + 60 <= len(data):
        header = data[offset : offset + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        yield name, data[offset + 60 : offset + 60 + size]
        offset += 60 + size + (size & 1)


def package_tar(deb: bytes) -> tarfile.TarFile:
    for name, member in ar_members(deb):
        if name.startswith("data.tar"):
            if name.endswith(".zst"):
                raise KernelVmError("data.tar.zst: this package needs zstd, which we do not read")
            return tarfile.open(fileobj=io.BytesIO(member), mode="r:*")
    raise KernelVmError("the package has no data.tar")


def fetch_package(suite: str, package: str, into: Path, *, meta: bool) -> tuple[Path, str]:
    """Download `package` (or what its meta package points to) into `into`, checked by SHA256."""
    index = parse_index(
        lzma.decompress(_download(f"{MIRROR}/dists/{suite}/main/binary-amd64/Packages.xz")).decode()
    )
    fields = resolve(index, package, meta=meta)
    deb = _download(f"{MIRROR}/{fields['Filename']}")
    if hashlib.sha256(deb).hexdigest() != fields.get("SHA256"):
        raise KernelVmError(f"{fields['Filename']}: its SHA256 is not the index's")
    into.mkdir(parents=True, exist_ok=True)
    path = into / Path(fields["Filename"]).name
    path.write_bytes(deb)
    return path, f"{fields['Package']} {fields['Version']}"


# --- The kernel's modules ----------------------------------------------------------------------


def module_name(path: str) -> str:
    base = Path(path).name
    for suffix in (".ko.xz", ".ko"):
        if base.endswith(suffix):
            return base[: -len(suffix)].replace("-", "_")
    return ""


def module_bytes(path: str, data: bytes) -> bytes:
    return lzma.decompress(data) if path.endswith(".xz") else data


def module_depends(module: bytes) -> list[str]:
    found = re.search(rb"\x00depends=([^\x00]*)\x00", module)
    if not found:
        return []
    return [name.replace("-", "_") for name in found.group(1).decode().split(",") if name]


def load_order(wanted: tuple[str, ...], depends: dict[str, list[str]]) -> list[str]:
    """The modules to load, each after what it depends on (builtins are absent from `depends`)."""
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order or name not in depends:
            return
        for dependency in depends[name]:
            visit(dependency)
        order.append(name)

    for name in wanted:
        visit(name)
    return order


def fetch_kernel(kernel: Kernel, cache: Path = CACHE) -> Path:
    """The kernel's image and guest modules, unpacked once into the cache; returns its folder."""
    home = cache / kernel.name
    if (home / "ready").exists():
        return home
    shutil.rmtree(home, ignore_errors=True)
    with tempfile.TemporaryDirectory() as scratch:
        deb, version = fetch_package(kernel.suite, "linux-image-amd64", Path(scratch), meta=True)
        data = deb.read_bytes()
        modules: dict[str, tuple[str, bytes]] = {}
        depends: dict[str, list[str]] = {}
        with package_tar(data) as tar:
            for member in tar:
                name = module_name(member.name)
                extracted = tar.extractfile(member) if member.isfile() else None
                if extracted is None:
                    continue
                if re.search(r"/boot/vmlinuz-", member.name):
                    home.mkdir(parents=True, exist_ok=True)
                    (home / "vmlinuz").write_bytes(extracted.read())
                    (home / "release").write_text(member.name.rsplit("vmlinuz-", 1)[1])
                elif name:
                    module = module_bytes(member.name, extracted.read())
                    depends[name] = module_depends(module)
                    modules[name] = (member.name, module)
        if not (home / "vmlinuz").exists():
            raise KernelVmError(f"{version}: no /boot/vmlinuz in the package")
        order = load_order(GUEST_MODULES, depends)
        (home / "modules").mkdir()
        for index, name in enumerate(order):
            (home / "modules" / f"{index:02d}-{name}.ko").write_bytes(modules[name][1])
        busybox_deb, _ = fetch_package(BUSYBOX_SUITE, "busybox-static", Path(scratch), meta=False)
        with package_tar(busybox_deb.read_bytes()) as tar:
            binary = tar.extractfile("./bin/busybox")
            if binary is None:
                raise KernelVmError("busybox-static has no /bin/busybox")
            (home / "busybox").write_bytes(binary.read())
        (home / "version").write_text(version)
    (home / "ready").write_text("")
    return home


# --- The initramfs and the guest's first program -----------------------------------------------


def cpio_newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A `newc` cpio archive (what the kernel unpacks as an initramfs): (name, mode, data)."""
    out = io.BytesIO()
    for inode, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        encoded = name.encode() + b"\0"
        fields = (inode, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        out.write(b"070701" + "".join(f"{value:08x}" for value in fields).encode() + encoded)
        out.write(b"\0" * (-(110 + len(encoded)) % 4))
        out.write(data + b"\0" * (-len(data) % 4))
    return out.getvalue()


def init_script(modules: list[str], init: str = "busybox") -> str:
    """PID 1 in the initramfs: load the modules, build the root, hand over to the command, or
    (`init="systemd"`) to systemd. The first `/proc`, `/sys` and `/dev` are moved, not mounted
    again: a proc mount left behind on the initramfs would be a fully visible proc, which lets a
    user namespace mount a new one where the fence's covered `/proc` must not
    (confine/test_fence_nesting.py). systemd leaves those three as they are and mounts the rest
    itself, as on a booted machine (`/run`, `/dev/shm`, `/dev/pts`, the cgroup2 hierarchy): a
    `/run` mounted here would not propagate mounts as systemd's does, and `LoadCredential`'s
    directories would stay empty. So would they if systemd took the guest for a container (it
    then leaves `/` private): this machine's `/.dockerenv` is removed from the overlay. Its
    units go in the overlay's `/etc/systemd/system`, and its service mounts the out share."""
    loads = "\n".join(
        f"insmod /modules/{name} || echo 'kernelvm: insmod {name} failed'" for name in modules
    )
    common = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc && mount -t sysfs sys /sys && mount -t devtmpfs dev /dev
{loads}
fail() {{ echo "kernelvm: $1"; poweroff -f; }}
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=524288,cache=loose {ROOT_TAG} /lower || fail "no 9p root"
mount -t tmpfs -o size=75% upper /upper && mkdir /upper/data /upper/work
mount -t overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work root /root || fail "no overlay"
ip link set lo up
mount --move /proc /root/proc && mount --move /sys /root/sys && mount --move /dev /root/dev
"""
    if init == "systemd":
        return common + (
            "rm -f /root/.dockerenv /root/run/.containerenv\n"
            "mkdir -p /root/etc/systemd/system && cp /units/* /root/etc/systemd/system/\n"
            f"exec switch_root /root {SYSTEMD} --unit=kernelvm.target\n"
        )
    return (
        common
        + f"""mkdir -p /root/dev/pts /root/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /root/dev/pts && ln -sf pts/ptmx /root/dev/ptmx
mount -t tmpfs shm /root/dev/shm && mount -t cgroup2 cgroup2 /root/sys/fs/cgroup
mount -t tmpfs run /root/run && mkdir -p /root{GUEST_OUT}
{OUT_MOUNT} /root{GUEST_OUT} || fail "no out share"
exec switch_root /root /bin/sh {GUEST_OUT}/guest.sh
"""
    )


def systemd_units() -> dict[str, str]:
    """The units of `--init systemd`: a target that wants only the command's service, and that
    service, which needs nothing of the default boot but journald (its socket is started with
    it), mounts the out share and runs the guest script. The script ends the machine itself
    (sysrq), so the service has no time limit."""
    return {
        "kernelvm.target": (
            "[Unit]\nDescription=kernelvm: the command and nothing else\n"
            "Wants=kernelvm.service\nAllowIsolate=yes\n"
        ),
        "kernelvm.service": (
            "[Unit]\nDescription=kernelvm: the command, its output and status to the out share\n"
            "DefaultDependencies=no\n"
            "Wants=systemd-journald.socket\nAfter=systemd-journald.socket\n"
            "[Service]\nType=simple\nTimeoutStartSec=infinity\n"
            f"ExecStartPre=/bin/mkdir -p {GUEST_OUT}\n"
            f"ExecStartPre=/bin/{OUT_MOUNT} {GUEST_OUT}\n"
            f"ExecStart=/bin/sh {GUEST_OUT}/guest.sh\n"
        ),
    }


def guest_script(command: list[str], cwd: str, env: dict[str, str], cgroup: str) -> str:
    """The command's wrapper in the guest (the host's /bin/sh): its placement, output, status."""
    lines = ["#!/bin/sh", f"cd {shlex.quote(cwd)} || exit 1"]
    if cgroup == "delegated":
        lines += [
            f"mkdir {DELEGATED_GROUP}",
            'echo "+memory +pids +cpu" > /sys/fs/cgroup/cgroup.subtree_control',
            f"echo $$ > {DELEGATED_GROUP}/cgroup.procs",
        ]
    assignments = " ".join(shlex.quote(f"{key}={value}") for key, value in sorted(env.items()))
    lines += [
        f"env -i {assignments} {shlex.join(command)} > {GUEST_OUT}/output 2>&1 < /dev/null",
        f"echo $? > {GUEST_OUT}/rc",
        "sync",
        "echo o > /proc/sysrq-trigger",
    ]
    return "\n".join(lines) + "\n"


def initramfs(home: Path, init: str = "busybox") -> bytes:
    modules = sorted(path.name for path in (home / "modules").iterdir())
    entries: list[tuple[str, int, bytes]] = [
        (folder, 0o40755, b"")
        for folder in ("bin", "dev", "proc", "sys", "modules", "lower", "upper", "root", "units")
    ]
    if init == "systemd":
        entries += [
            (f"units/{name}", 0o100644, text.encode()) for name, text in systemd_units().items()
        ]
    entries.append(("bin/busybox", 0o100755, (home / "busybox").read_bytes()))
    entries += [
        (f"modules/{name}", 0o100644, (home / "modules" / name).read_bytes()) for name in modules
    ]
    entries.append(("init", 0o100755, init_script(modules, init).encode()))
    return cpio_newc(entries)


# --- Running ---------------------------------------------------------------------------------


def passed_environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if not NOT_PASSED.match(key)}


def qemu_argv(
    home: Path, initrd: Path, out: Path, console: Path, cpus: int, memory_mb: int
) -> list[str]:
    accel = os.environ.get("MCPHOST_KERNELVM_ACCEL", "tcg")
    return [
        "qemu-system-x86_64",
        *("-accel", "tcg,thread=multi" if accel == "tcg" else accel),
        *(["-cpu", "host"] if accel == "kvm" else ["-cpu", "max"]),
        *("-m", str(memory_mb), "-smp", str(cpus)),
        *("-kernel", str(home / "vmlinuz"), "-initrd", str(initrd)),
        *("-append", "console=ttyS0 panic=-1 quiet loglevel=3 sysrq_always_enabled"),
        *("-display", "none", "-nodefaults", "-no-reboot", "-serial", f"file:{console}"),
        "-virtfs",
        f"local,path=/,mount_tag={ROOT_TAG},security_model=none,readonly=on,multidevs=remap",
        "-virtfs",
        f"local,path={out},mount_tag={OUT_TAG},security_model=none,multidevs=remap",
    ]


def run(
    kernel: Kernel,
    command: list[str],
    *,
    cgroup: str = "root",
    init: str = "busybox",
    cpus: int = 2,
    memory_mb: int = 4096,
    stream: bool = True,
) -> tuple[int, str]:
    """Run `command` on `kernel`; returns its exit status and output."""
    if init == "systemd" and cgroup != "root":
        raise KernelVmError("--init systemd: systemd owns the cgroup tree (no --cgroup delegated)")
    if init == "systemd" and not Path(SYSTEMD).exists():
        raise KernelVmError(f"--init systemd: no {SYSTEMD} here: install the systemd package")
    if shutil.which("qemu-system-x86_64") is None:
        raise KernelVmError("qemu-system-x86_64 not found: install the qemu-system-x86 package")
    home = fetch_kernel(kernel)
    with tempfile.TemporaryDirectory(prefix="kernelvm-") as scratch:
        out = Path(scratch) / "out"
        out.mkdir()
        initrd = Path(scratch) / "initrd.cpio"
        initrd.write_bytes(initramfs(home, init))
        (out / "guest.sh").write_text(
            guest_script(command, os.getcwd(), passed_environment(), cgroup)
        )
        console = Path(scratch) / "console.log"
        done = threading.Event()
        streamer = threading.Thread(target=_stream, args=(out / "output", done), daemon=True)
        if stream:
            streamer.start()
        try:
            subprocess.run(
                qemu_argv(home, initrd, out, console, cpus, memory_mb),
                check=False,
                stdin=subprocess.DEVNULL,
            )
        finally:
            done.set()
            if stream:
                streamer.join()
        output = (out / "output").read_text(errors="replace") if (out / "output").exists() else ""
        if not (out / "rc").exists():
            tail = console.read_text(errors="replace")[-4000:] if console.exists() else ""
            raise KernelVmError(
                f"{kernel.name}: the guest ended before the command did; its console:\n{tail}"
            )
        return int((out / "rc").read_text().strip() or "1"), output


def _stream(path: Path, done: threading.Event) -> None:
    """Copy the guest's output to stderr as it grows (the 9p share is the host's own folder)."""
    offset = 0
    while True:
        finished = done.wait(1.0)
        if path.exists():
            with path.open("rb") as handle:
                handle.seek(offset)
                chunk = handle.read()
            offset += len(chunk)
            sys.stderr.buffer.write(chunk)
            sys.stderr.flush()
        if finished:
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    verbs.add_parser("list", help="the kernels, with what the suite expects of each")
    fetch = verbs.add_parser("fetch", help="download and unpack a kernel into the cache")
    fetch.add_argument("kernel", choices=sorted(KERNELS))
    runner = verbs.add_parser("run", help="run a command on a kernel")
    runner.add_argument("kernel", choices=sorted(KERNELS))
    runner.add_argument("--cgroup", choices=("root", "delegated"), default="root")
    runner.add_argument("--init", choices=INITS, default="busybox")
    runner.add_argument("--cpus", type=int, default=2)
    runner.add_argument("--memory", type=int, default=4096, help="MiB")
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:split]), argv[split + 1 :]
    try:
        if args.verb == "list":
            for kernel in KERNELS.values():
                print(f"{kernel.name:10} {kernel.suite:9} {kernel.facts}")
            return 0
        if args.verb == "fetch":
            home = fetch_kernel(KERNELS[args.kernel])
            print(f"{args.kernel}: {(home / 'version').read_text()} in {home}")
            return 0
        if not command:
            parser.error("run: give the command after --")
        status, _ = run(
            KERNELS[args.kernel],
            command,
            cgroup=args.cgroup,
            init=args.init,
            cpus=args.cpus,
            memory_mb=args.memory,
        )
        return status
    except KernelVmError as error:
        print(f"kernelvm: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
