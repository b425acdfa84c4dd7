"""The contrib systemd unit under a real systemd, on Debian 12's kernel (`make test-kernels`).

tests/kernelvm.py boots the kernel with this machine's own systemd as PID 1 (`--init systemd`,
cgroup v2 as systemd mounts it) over this machine's files, and runs tests/kernels/guest_systemd.py
there with pytest: it installs `contrib/systemd/mcphost-supervisor.service` as the unit's
header says and checks, through `systemctl`, `journalctl`, `mcphost ctl` and /proc, what the
unit's comments promise (its docstring lists them), in the unit's user mode and its root mode.
One kernel only: what is tested is systemd's handling of the unit, the same on every kernel
the fence supports (test_kernels.py runs the fence and the limits on each).
"""

from __future__ import annotations

import sys

import pytest

from tests import kernelvm
from tests.kernelvm import KERNELS

SLOWDOWN = 4  # as test_kernels.py: the guest's deadlines under software emulation


@pytest.mark.kernels
@pytest.mark.timeout(1200)
def test_the_contrib_unit_runs_the_fleet_under_systemd() -> None:
    argv = ["env", "MCPHOST_TEST_DEPTH=full", f"MCPHOST_TEST_SLOWDOWN={SLOWDOWN}"]
    argv += [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-x"]
    argv += ["--timeout", "900", "-m", "deep or not deep", "tests/kernels/guest_systemd.py"]
    status, output = kernelvm.run(KERNELS["debian-12"], argv, init="systemd", stream=False)
    sys.stderr.write(output)
    failures = output[output.find("= FAILURES =") :] if "= FAILURES =" in output else output
    assert " passed" in output, output[-8000:]
    assert status == 0, failures[:12000] + "\n...\n" + output[-2000:]
