"""The attach pump's costs: start-up, PSS per live pump, and the latency one pump hop adds.

Every figure sits next to a baseline measured in the same run:
- start-up of a whole pump process (connect, status line, stdin EOF, exit) against
  `python -c pass`, `python -S -c pass` and `socat STDIO UNIX-CONNECT:` (when installed), run in
  turn (A B C ... A B C ...) so each round's ratio compares runs made under the same load;
- PSS of N live pumps attached to one socket (`/proc/<pid>/smaps_rollup`), against socat;
- p50 of one JSON line echoed through a pump against the same line over the socket directly.
Targets (issue 12): start-up <= 1x `python3 -c pass`, PSS <= 4 MB per pump.

The stand-in supervisor is a threaded echo server in a process of its own (so the measuring
process's GIL is not in its path): it sends the status line, echoes, and closes at EOF. Run alone with `python -m bench.attach`.
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.harness import Stats

RUNS = int(os.environ.get("BENCH_ATTACH_RUNS", "20"))
CALLS = int(os.environ.get("BENCH_ATTACH_CALLS", "2000"))
LIVE = int(os.environ.get("BENCH_ATTACH_LIVE", "10"))
PY = sys.executable
ATTACH = str(Path(__file__).resolve().parent.parent / "mcphost" / "attach.py")
LINE = (
    b'{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"name":"get_task",'
    b'"arguments":{"task_id":"t-0123456789abcdef"}},"_meta":{"progressToken":17}}\n'
)


SERVER = """
import os, socket, sys, threading
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
listener.listen(128)
def serve(conn):
    with conn:
        try:
            conn.sendall(b"ok bench 1\\n")
            while data := conn.recv(65536):
                conn.sendall(data)
        except OSError:
            pass
print("ready", flush=True)
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


class EchoServer:
    """Status line `ok bench 1`, then echo until EOF; a process of its own (no shared GIL)."""

    def __init__(self, path: str) -> None:
        self.proc = subprocess.Popen(
            [PY, "-I", "-S", "-c", SERVER, path], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline() == b"ready\n"

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def whole_run(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return time.perf_counter() - started


def ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}×" if base else "n/a"


def startup(path: str, out: list[str]) -> None:
    commands = {
        "pump `python -I -S attach.py` (connect, status, EOF, exit)": [
            *(PY, "-I", "-S", ATTACH, path)
        ],
        "`python -c pass`": [PY, "-c", "pass"],
        "`python -S -c pass`": [PY, "-S", "-c", "pass"],
    }
    socat = shutil.which("socat")
    if socat:
        commands["`socat STDIO UNIX-CONNECT:` (connect, EOF, exit)"] = [
            socat,
            "STDIO",
            f"UNIX-CONNECT:{path}",
        ]
    for argv in commands.values():  # warm-up: page cache, dentries
        whole_run(argv)
    samples: dict[str, list[float]] = {label: [] for label in commands}
    for _ in range(RUNS):
        for label, argv in commands.items():
            samples[label].append(whole_run(argv))
    pump_label, pass_label = list(commands)[:2]
    pump = samples[pump_label]
    out += [
        f"### Start-up, whole process ({RUNS} rounds, commands in turn each round)",
        "",
        "| command | wall | pump ÷ this (median of per-round ratios) |",
        "|---|---|---|",
    ]
    for label, times in samples.items():
        paired = statistics.median(p / t for p, t in zip(pump, times, strict=True))
        out.append(f"| {label} | {Stats.of(times).fmt()} | {paired:.2f}× |")
    target = statistics.median(p / t for p, t in zip(pump, samples[pass_label], strict=True))
    out += ["", f"Target ≤ 1× `python3 -c pass`: {target:.2f}×.", ""]


def pss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    raise RuntimeError(f"no Pss in /proc/{pid}/smaps_rollup")


def live_pss(argv: list[str]) -> list[int]:
    """PSS (kB) of LIVE copies of `argv`, each attached and proven in its loop by one echo."""
    procs = [
        subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE) for _ in range(LIVE)
    ]
    try:
        for proc in procs:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(LINE)
            proc.stdin.flush()
            while proc.stdout.readline() != LINE:  # socat shows the status line; skip it
                pass
        return [pss_kb(proc.pid) for proc in procs]
    finally:
        for proc in procs:
            proc.communicate()


def memory(path: str, out: list[str]) -> None:
    rows = [("pump", live_pss([PY, "-I", "-S", ATTACH, path]))]
    socat = shutil.which("socat")
    if socat:
        rows.append(("socat", live_pss([socat, "STDIO", f"UNIX-CONNECT:{path}"])))
    pump = statistics.median(rows[0][1])
    out += [
        f"### PSS of {LIVE} live pumps attached to one socket (`smaps_rollup`)",
        "",
        "| process | PSS each (median) | total | pump ÷ this | vs 4 MB target |",
        "|---|---|---|---|---|",
    ]
    for label, kbs in rows:
        each = statistics.median(kbs)
        out.append(
            f"| {label} | {each / 1024:.2f} MB | {sum(kbs) / 1024:.1f} MB | "
            f"{ratio(pump, each)} | {each / 4096:.2f}× |"
        )
    out.append("")


def latency(path: str, out: list[str]) -> None:
    """Direct and through-the-pump calls alternate, so both see the same machine load."""
    pump = subprocess.Popen(
        [PY, "-I", "-S", ATTACH, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert pump.stdin is not None and pump.stdout is not None
    stdin, stdout = pump.stdin, pump.stdout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as direct:
        direct.connect(path)
        reader = direct.makefile("rb")
        assert reader.readline() == b"ok bench 1\n"

        def over_socket() -> None:
            direct.sendall(LINE)
            assert reader.readline() == LINE

        def through_pump() -> None:
            stdin.write(LINE)
            stdin.flush()
            assert stdout.readline() == LINE

        for _ in range(min(200, CALLS)):
            over_socket()
            through_pump()
        pairs = [(timed(over_socket), timed(through_pump)) for _ in range(CALLS)]
        reader.close()
    pump.communicate()
    base = Stats.of([b for b, _ in pairs])
    hop = Stats.of([h for _, h in pairs])
    added = statistics.median(h - b for b, h in pairs)
    out += [
        f"### One JSON line echoed ({CALLS} pairs, direct and pump in turn, after warm-up)",
        "",
        "| path | p50 | p99 | vs direct |",
        "|---|---|---|---|",
        f"| direct Unix socket | {base.median * 1e3:.3f} ms | {base.p99 * 1e3:.3f} ms | 1.00× |",
        f"| through one pump | {hop.median * 1e3:.3f} ms | {hop.p99 * 1e3:.3f} ms | "
        f"{ratio(hop.median, base.median)} |",
        f"| added by the pump hop (median of per-pair differences) | {added * 1e3:.3f} ms | | |",
        "",
    ]


def timed(call: Callable[[], None]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


async def section(out: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="mcphost-bench-attach-") as tmp:
        path = os.path.join(tmp, "center.sock")
        server = EchoServer(path)
        try:
            out += ["## 8. Attach pump (one per surface per supervised agent)", ""]
            startup(path, out)
            memory(path, out)
            latency(path, out)
        finally:
            server.close()


if __name__ == "__main__":
    import asyncio

    report: list[str] = []
    asyncio.run(section(report))
    print("\n".join(report))
