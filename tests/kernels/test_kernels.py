"""On the kernels workers run: the fence's and the limits' black-box tests, on Debian's own kernels.

`make test-kernels` (CI runs it after `make test-slow`): tests/kernelvm.py boots each kernel of
`KERNELS` (Debian 11's 5.10, 12's 6.1, 13's 6.12, each its release's `linux-image-amd64`) under
QEMU over this machine's files, with a cgroup2 hierarchy holding every controller, and runs the
GUEST_FILES there with pytest (the fence's, the real Codex's and Claude Code's own sandboxes
inside it, the limits' and the usage figures'), as root in a delegated group (`--cgroup delegated`: what the
contrib systemd unit's `Delegate=yes` gives), so the supervisor moves itself into its own leaf
group. Before them, the guest prints what the fence and the limits find on that kernel
(`probe.probe()`, `cgroups.detect()`), and the test pins it: the level `ctl status` will show and
the `v2` backend, never a fallback.

The tests in this file without the `kernels` mark are the pure parts of tests/kernelvm.py
(`make test`).
"""

from __future__ import annotations

import io
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests import kernelvm
from tests.kernelvm import KERNELS

ROOT = Path(__file__).resolve().parents[2]
SLOWDOWN = 4  # the guest's deadlines (tests/waiting.py): software emulation is that much slower

# What depends on the kernel: the hostile agent against the fence and the operator's renames
# around it, the agents' own sandboxes nested in it (bubblewrap and user namespaces, and the real
# Codex and Claude Code with their own sandboxes on), the per-agent limits (fork loop, memory
# hog, OOM report), the usage figures, and the agents' own uids against a cgroup remount.
GUEST_FILES = (
    "tests/supervisor/confine/test_fence.py",
    "tests/supervisor/confine/test_fence_field.py",
    "tests/supervisor/confine/test_fence_nesting.py",
    "tests/blackbox/test_fenced_codex.py",
    "tests/blackbox/test_fenced_claude.py",
    "tests/supervisor/test_supervise_cgroups.py",
    "tests/supervisor/test_supervise_usage.py",
    "tests/supervisor/test_supervise_uids.py",
)

# What the fence must find on each kernel: its Landlock ABI (the LSM list Debian boots with) and
# the level every fenced agent gets (docs/concepts.md, "Kernels and distributions").
EXPECTED = {
    "debian-11": {"landlock_abi": 0, "level": "bwrap"},
    "debian-12": {"landlock_abi": 2, "level": "bwrap"},
    "debian-13": {"landlock_abi": 6, "level": "bwrap+landlock6"},
}

PROBE = """
import json, os
from mcphost.supervisor.confine import cgroups
from mcphost.supervisor.confine import probe as machine
support, backend = machine.probe(), cgroups.detect()
print("KERNELVM-PROBE " + json.dumps({
    "release": os.uname().release, "landlock_abi": support.landlock_abi,
    "level": support.level(), "missing": support.missing(), "lacks": support.lacks(),
    "cgroups": backend.as_json(),
}))
"""


@pytest.mark.kernels
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_the_fence_and_the_limits_hold_on_the_kernel(name: str) -> None:
    pytest_argv = ["env", "MCPHOST_TEST_DEPTH=full", f"MCPHOST_TEST_SLOWDOWN={SLOWDOWN}"]
    pytest_argv += [sys.executable, "-m", "pytest"]
    pytest_argv += ["-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile", "--timeout", "900"]
    pytest_argv += ["-m", "deep or not deep", *GUEST_FILES]
    probe_then_test = '"$1" -c "$2" && shift 2 && exec "$@"'
    command = ["sh", "-c", probe_then_test, "sh", sys.executable, PROBE, *pytest_argv]
    status, output = kernelvm.run(KERNELS[name], command, cgroup="delegated", stream=False)
    sys.stderr.write(output)
    failures = output[output.find("= FAILURES =") :] if "= FAILURES =" in output else output
    probes = [line for line in output.splitlines() if line.startswith("KERNELVM-PROBE ")]
    assert probes, output[-8000:]
    found = json.loads(probes[0].split(" ", 1)[1])
    assert found["missing"] is None, found
    assert {key: found[key] for key in EXPECTED[name]} == EXPECTED[name], found
    assert found["cgroups"]["backend"] == "v2", found
    assert status == 0, failures[:12000] + "\n...\n" + output[-2000:]


# --- tests/kernelvm.py's pure parts (make test) -------------------------------------------------


def read_newc(archive: bytes) -> dict[str, tuple[int, bytes]]:
    """Read a newc archive back (the kernel's reader, in short): {name: (mode, data)}."""
    out, offset = {}, 0
    while True:
        header = archive[offset : offset + 110]
        assert header[:6] == b"070701"
        fields = [int(header[6 + 8 * i : 14 + 8 * i], 16) for i in range(13)]
        mode, size, name_size = fields[1], fields[6], fields[11]
        name_at = offset + 110
        name = archive[name_at : name_at + name_size - 1].decode()
        data_at = name_at + name_size + (-(110 + name_size) % 4)
        if name == "TRAILER!!!":
            return out
        out[name] = (mode, archive[data_at : data_at + size])
        offset = data_at + size + (-size % 4)


def test_the_initramfs_is_a_newc_archive_the_kernel_reads_back_whole() -> None:
    entries = [("bin", 0o40755, b""), ("bin/busybox", 0o100755, b"\x7fELF" + b"x" * 7)]
    entries.append(("init", 0o100755, b"#!/bin/busybox sh\n"))
    archive = kernelvm.cpio_newc(entries)
    assert len(archive) % 4 == 0
    assert read_newc(archive) == {name: (mode, data) for name, mode, data in entries}


def test_modules_load_after_what_they_depend_on_and_builtins_are_skipped() -> None:
    depends = {"9p": ["9pnet", "netfs"], "9pnet": [], "netfs": ["fscache"], "fscache": []}
    depends |= {"9pnet_virtio": ["9pnet", "virtio"], "virtio": [], "overlay": []}
    order = kernelvm.load_order(("9pnet_virtio", "9p", "virtio_pci", "overlay"), depends)
    assert order == ["9pnet", "virtio", "9pnet_virtio", "fscache", "netfs", "9p", "overlay"]
    # virtio_pci is built in (absent from the modules read): nothing to load


def test_a_module_names_its_dependencies_in_its_modinfo_compressed_or_not() -> None:
    module = b"\x7fELF...\x00license=GPL\x00depends=9pnet,net-fs\x00vermagic=6.1\x00"
    assert kernelvm.module_depends(module) == ["9pnet", "net_fs"]
    assert kernelvm.module_depends(b"\x00license=GPL\x00") == []
    packed = lzma.compress(module, format=lzma.FORMAT_XZ)
    assert kernelvm.module_bytes("kernel/fs/9p/9p.ko.xz", packed) == module
    assert kernelvm.module_name("./lib/modules/6.1/kernel/fs/9p/9p.ko.xz") == "9p"
    assert kernelvm.module_name("./lib/modules/6.1/kernel/net/9p/9pnet-virtio.ko") == "9pnet_virtio"
    assert kernelvm.module_name("./boot/vmlinuz-6.1") == ""


def test_the_meta_package_leads_to_the_kernel_its_release_ships() -> None:
    index = kernelvm.parse_index(
        "Package: linux-image-amd64\nVersion: 6.1.176-1\n"
        "Depends: linux-image-6.1.0-50-amd64 (= 6.1.176-1)\nFilename: pool/meta.deb\n\n"
        "Package: linux-image-6.1.0-50-amd64\nVersion: 6.1.176-1\n"
        "Description: Linux 6.1\n for 64-bit PCs\nFilename: pool/l/image.deb\nSHA256: ab\n"
    )
    assert kernelvm.resolve(index, "linux-image-amd64", meta=True)["Filename"] == "pool/l/image.deb"
    assert kernelvm.resolve(index, "linux-image-amd64", meta=False)["Filename"] == "pool/meta.deb"
    with pytest.raises(kernelvm.KernelVmError, match="busybox-static is not in"):
        kernelvm.resolve(index, "busybox-static", meta=False)


def test_a_package_is_read_from_its_ar_archive_without_installing_it() -> None:
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w:xz") as tar:
        info = tarfile.TarInfo("./bin/busybox")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"\x7fELF"))
    members = [(b"debian-binary", b"2.0\n"), (b"data.tar.xz", payload.getvalue())]
    deb = b"!<arch>\n"
    for name, data in members:
        header = name.ljust(16) + b"0".ljust(12) + b"0".ljust(6) * 2 + b"100644".ljust(8)
        deb += header + str(len(data)).encode().ljust(10) + b"`\n" + data + b"\n" * (len(data) & 1)
    assert [name for name, _ in kernelvm.ar_members(deb)] == ["debian-binary", "data.tar.xz"]
    with kernelvm.package_tar(deb) as tar:
        extracted = tar.extractfile("./bin/busybox")
        assert extracted is not None and extracted.read() == b"\x7fELF"
    with pytest.raises(kernelvm.KernelVmError, match="not a Debian package"):
        list(kernelvm.ar_members(b"PK\x03\x04"))


def test_the_guest_runs_the_command_as_given_in_its_folder_and_group(tmp_path: Path) -> None:
    """The wrapper is run by a real shell here (the guest's is the host's): arguments with
    spaces, quotes and `$` reach the command intact, with exactly the environment given."""
    out = tmp_path / "out"
    out.mkdir()
    script = kernelvm.guest_script(
        [
            sys.executable,
            "-c",
            "import os, sys; print(os.getcwd(), sys.argv[1:], os.environ['X'])",
            "a b",
            "$HOME",
        ],
        str(tmp_path),
        {"X": "it's $x", "PATH": "/usr/bin:/bin"},
        "root",
    )
    script = script.replace(kernelvm.GUEST_OUT, str(out)).replace(
        "echo o > /proc/sysrq-trigger", ""
    )
    subprocess.run(["sh", "-c", script], check=True)
    assert (out / "rc").read_text().strip() == "0"
    assert (out / "output").read_text() == f"{tmp_path} ['a b', '$HOME'] it's $x\n"
    delegated = kernelvm.guest_script(["true"], "/", {}, "delegated")
    assert f"echo $$ > {kernelvm.DELEGATED_GROUP}/cgroup.procs" in delegated


def test_with_systemd_as_init_the_root_is_built_the_same_and_systemd_mounts_the_rest() -> None:
    """`--init systemd`: the same overlaid root, then systemd as PID 1 on the command's own
    target; nothing pre-mounted that systemd mounts on a booted machine (the cgroup2
    hierarchy, `/run`), no container marker left for systemd to find, the units in the
    overlay's unit directory."""
    busybox = kernelvm.init_script(["00-overlay.ko"])
    systemd = kernelvm.init_script(["00-overlay.ko"], "systemd")
    for step in ("mount -t cgroup2", "mount -t tmpfs run", kernelvm.OUT_TAG):
        assert step in busybox and step not in systemd
    assert systemd.rstrip().endswith(
        "exec switch_root /root /lib/systemd/systemd --unit=kernelvm.target"
    )
    assert "rm -f /root/.dockerenv" in systemd and "/.dockerenv" not in busybox
    assert "cp /units/* /root/etc/systemd/system/" in systemd
    for step in ("mount -t overlay", "mount --move /proc /root/proc"):
        assert step in busybox and step in systemd
    with pytest.raises(kernelvm.KernelVmError, match="systemd owns the cgroup tree"):
        kernelvm.run(KERNELS["debian-12"], ["true"], init="systemd", cgroup="delegated")


def test_the_systemd_units_run_the_guest_script_and_nothing_of_the_default_boot(
    tmp_path: Path,
) -> None:
    """The units as systemd itself reads them (`systemd-analyze verify`, this machine's
    systemd, the guest's): the target wants the service alone, the service has no default
    dependencies (sysinit.target would start the machine's own services) and runs the guest
    script from the out share it mounts, with journald beside it."""
    units = kernelvm.systemd_units()
    assert set(units) == {"kernelvm.target", "kernelvm.service"}
    assert "Wants=kernelvm.service" in units["kernelvm.target"]
    service = units["kernelvm.service"]
    assert "DefaultDependencies=no" in service and "Wants=systemd-journald.socket" in service
    assert f"ExecStart=/bin/sh {kernelvm.GUEST_OUT}/guest.sh" in service
    assert f"ExecStartPre=/bin/{kernelvm.OUT_MOUNT} {kernelvm.GUEST_OUT}" in service
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not found: install systemd to verify the units")
    for name, text in units.items():
        (tmp_path / name).write_text(text)
    verify = [analyze, "verify", *(str(tmp_path / name) for name in units)]
    done = subprocess.run(verify, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    home = tmp_path / "kernel"
    (home / "modules").mkdir(parents=True)
    (home / "modules" / "00-overlay.ko").write_bytes(b"\x7fELF")
    (home / "busybox").write_bytes(b"\x7fELF")
    archive = read_newc(kernelvm.initramfs(home, "systemd"))
    assert archive["units/kernelvm.service"] == (0o100644, service.encode())
    assert "units/kernelvm.service" not in read_newc(kernelvm.initramfs(home))
