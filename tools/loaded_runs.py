"""Run the pre-commit suite several times in a row while other processes keep every CPU busy.

    .venv/bin/python tools/loaded_runs.py [--runs 5] [--burners N] [-- PYTEST ARGS]

This is how the suite's determinism claim is checked (README, "Tests"): `--burners` processes
(default: one per CPU) spin at normal priority for the whole session, and `pytest` (the same
command `make test` runs, with the same options from pyproject.toml) runs `--runs` times,
one after another. Each run's outcome and wall time are printed to stderr; the exit status is 0
only when every run passed. The burners are ended however the script ends.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time


def burn() -> None:
    while True:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--burners", type=int, default=os.cpu_count() or 1)
    parser.add_argument("pytest_args", nargs="*")
    options = parser.parse_args(argv)
    burners = [multiprocessing.Process(target=burn, daemon=True) for _ in range(options.burners)]
    for burner in burners:
        burner.start()
    failures = 0
    try:
        for run in range(1, options.runs + 1):
            started = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "pytest", *options.pytest_args],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            took = time.monotonic() - started
            summary = done.stdout.decode(errors="replace").strip().splitlines()[-1:]
            outcome = "passed" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
            print(f"run {run}: {outcome} in {took:.0f} s: {' '.join(summary)}", file=sys.stderr)
            if done.returncode != 0:
                failures += 1
                sys.stderr.write(done.stdout.decode(errors="replace")[-20000:])
    finally:
        for burner in burners:
            burner.terminate()
    print(f"{options.runs - failures} of {options.runs} runs passed", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
