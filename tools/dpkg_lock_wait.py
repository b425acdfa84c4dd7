"""Wait, bounded, until no other apt or dpkg holds the dpkg lock: `make system` runs it before
`apt-get install`.

    python3 tools/dpkg_lock_wait.py [--lock /var/lib/dpkg/lock-frontend] [--wait 300]

On a fresh VM, unattended-upgrades holds the dpkg lock for minutes, and `apt-get install` then
fails outright ("Could not get lock"). This takes the lock the way apt and dpkg take it (an
fcntl write lock, `F_SETLK`, on the lock file: `flock(1)` would not see theirs), every half
second, for at most `--wait` seconds; it says once on stderr that it waits, for what and how
long, and releases the lock as soon as it has it. Exit 0: the lock was free (or the file does
not exist: no dpkg here); 1: still held after `--wait` seconds, with a line saying what to do.
The window between this release and apt's own lock is closed by apt's `DPkg::Lock::Timeout`,
which the Makefile passes too (the same bound).

Standard library only: it runs before any virtualenv exists (`make system` needs only python3).
Must never: create the lock file, or hold the lock beyond the moment it got it.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import os
import sys
import time

LOCK = "/var/lib/dpkg/lock-frontend"  # apt >= 1.9 takes this first, then dpkg's own lock
WAIT = 300.0
EVERY = 0.5


def try_lock(path: str) -> bool | None:
    """Take and release the write lock on `path` at once: True when it was free, False when
    another process holds it, None when there is no such file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    finally:
        os.close(fd)  # closing releases the lock, if we took it
    return True


def wait(path: str, bound: float) -> int:
    """0 once `path` is free (or absent); 1 when it is still held after `bound` seconds."""
    deadline = time.monotonic() + bound
    said = False
    while True:
        free = try_lock(path)
        if free is None or free:
            if said:
                print(f"the dpkg lock {path} is free: going on", file=sys.stderr)
            return 0
        if not said:
            print(
                f"waiting for the dpkg lock {path}: another apt or dpkg holds it (on a fresh "
                f"machine, usually unattended-upgrades); waiting up to {bound:.0f} s",
                file=sys.stderr,
            )
            said = True
        if time.monotonic() >= deadline:
            print(
                f"the dpkg lock {path} is still held after {bound:.0f} s: wait for the other "
                "apt or dpkg to finish (`ps -C apt-get,apt,dpkg,unattended-upgr`), then run "
                "make again, or raise the bound (make ... LOCK_WAIT=900)",
                file=sys.stderr,
            )
            return 1
        time.sleep(EVERY)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lock", default=LOCK)
    parser.add_argument("--wait", type=float, default=WAIT, help="seconds, at most")
    args = parser.parse_args(argv)
    return wait(args.lock, args.wait)


if __name__ == "__main__":
    sys.exit(main())
