"""The supervisor's start-up before it serves anything: the token, its state directory, then what
it stands on.

Owns, in this order (`supervisor.supervise` calls them before anything else under `<state>`):
the link to the center with the token read from the fleet's `token_file` (`open_link`: a bad
token file is exit 2, one line); the state directory's lock (`control.server.take_lock` on
`<state>/control.sock.lock`, creating `<state>` 0700 if it is missing and touching nothing else:
another supervisor holding it is exit `EXIT_STATE_IN_USE`, one line naming the directory and its
pid); only then the modes of `<state>`, `run/` and `agents/` (`claim_state`). Then, once the
supervisor's journal keeps its events (operator/journal.py), the `Ground` it stands on
(`open_ground`), every part opened whole and handed to the `Supervisor`, which closes them at
its shutdown: the descriptor limit (`RLIMIT_NOFILE`'s soft limit raised to its hard one,
`raise_descriptor_limit`; systemd starts services at 1024, the figure logged), the fence's
probe of this machine (before the reaper owns `waitpid`), the state file (with the runs a crash
cut short recorded as lost), the process records and the reaper, the processes a crashed
supervisor left (ended before anything is spawned: records.py), the agents' cgroups (cgroups.py)
and the center's clients and health (`center.link.Center`).

Must never: change anything under a state directory whose lock another supervisor holds (modes,
files, processes), follow a symlink for `<state>`, `run/` or `agents/`, or print more than one
line for a refusal (cli.py's contract for every start-up refusal).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mcphost import events, fsutil, procs
from mcphost.settings import SettingError
from mcphost.supervisor.confine import cgroups, kernel
from mcphost.supervisor.confine.probe import probe
from mcphost.supervisor.control.server import ControlInUse, take_lock
from mcphost.supervisor.plan import runs_apart
from mcphost.supervisor.records import ProcessRecords
from mcphost.supervisor.state import StateStore

if TYPE_CHECKING:
    from mcphost.supervisor.center.link import Center, CenterLink
    from mcphost.supervisor.confine.cgroups import Cgroups
    from mcphost.supervisor.plan import Fleet

# `mcphost supervise`'s exit status when another supervisor holds the state directory's lock.
EXIT_STATE_IN_USE = 3


class StartRefused(Exception):
    """Start-up cannot go on: `line` for stderr, `status` to exit with."""

    def __init__(self, status: int, line: str) -> None:
        super().__init__(line)
        self.status = status
        self.line = line


def open_link(fleet: Fleet) -> CenterLink:
    """The link to the center with the token of the fleet's `token_file`; `StartRefused` (2)."""
    from mcphost.binding import BindingError
    from mcphost.supervisor.center.link import CenterLink, read_token

    try:
        return CenterLink(fleet.center, *read_token(fleet.center.token_file))
    except BindingError as exc:  # one line, like every start-up refusal (cli.py)
        raise StartRefused(
            2,
            f"mcphost supervise: {fleet.path}: center.token_file {exc.problem}: "
            f"expected {exc.expected}",
        ) from None


def claim_state(state_dir: str, fleet: Fleet) -> int:
    """Take the state directory's lock, then set its modes; the lock's descriptor (held until
    closed). `StartRefused` (`EXIT_STATE_IN_USE`, or 2 for a directory that is not ours)."""
    lock_fd: int | None = None
    try:
        # The lock before anything else under <state>: a second supervisor must change
        # nothing (modes, files, processes) of the one that runs there.
        own_dir(state_dir)
        lock_fd = take_lock(os.path.join(state_dir, "control.sock"))
        prepare_state_dir(state_dir, fleet)
    except (SettingError, ControlInUse) as exc:
        in_use = isinstance(exc, ControlInUse)
        problem = exc.message if isinstance(exc, ControlInUse) else str(exc)
        if lock_fd is not None:
            os.close(lock_fd)
        raise StartRefused(
            EXIT_STATE_IN_USE if in_use else 2,
            f"mcphost supervise: {state_dir}: {problem}" + (" (control_in_use)" if in_use else ""),
        ) from None
    return lock_fd


def own_dir(directory: str) -> None:
    """Create `directory` (0700) if missing; refuse it unless it is a directory of ours."""
    try:
        fsutil.private_dir(directory, parents=True, mode=None)
    except fsutil.NotPrivate:
        raise SettingError(
            directory,
            None,
            "a directory owned by the supervisor's user",
            problem="is a symlink, not a directory, or someone else's",
        ) from None


def prepare_state_dir(state_dir: str, fleet: Fleet) -> None:
    """`<state>`, `run/` and `agents/`: ours, not symlinks, 0700 (0711 where agents running
    as another user must pass through to reach their home and the attach sockets). Only
    once the state lock is held: the modes are the running supervisor's to set."""
    shared = any(runs_apart(plan) for plan in fleet.agents)
    for directory in (state_dir, os.path.join(state_dir, "run"), os.path.join(state_dir, "agents")):
        own_dir(directory)
        os.chmod(directory, 0o711 if shared else 0o700)


def raise_descriptor_limit() -> int:
    """Raise `RLIMIT_NOFILE`'s soft limit to its hard one (`procs.raise_nofile`: the agents and
    every other child get the soft limit back that the supervisor was given), so a flood that
    the listeners' bounds (loopback.py) let through never meets systemd's default 1024 first;
    the soft limit now, logged as `supervisor.descriptors` (at debug level: the first line an
    operator reads is `supervisor.started`, supervisor.py)."""
    soft, hard, before = procs.raise_nofile()
    events.emit(
        "supervisor.descriptors", "debug", soft=soft, hard=hard, was=before, children=before
    )
    return soft


@dataclass(frozen=True, slots=True)
class Ground:
    """What the supervisor stands on, opened by `open_ground` (module doc): the state directory's
    lock (its descriptor, closed last), the state file, every process run or adopted, the reaper
    of every child, the agents' cgroups and the center's clients and health."""

    lock_fd: int
    store: StateStore
    records: ProcessRecords
    reaper: kernel.Reaper
    cgroups: Cgroups
    center: Center


async def open_ground(fleet: Fleet, state_dir: str, link: CenterLink, lock_fd: int) -> Ground:
    """Open what the supervisor stands on, in the module doc's order, on the running loop:
    `state_dir` is claimed (`lock_fd`) and the journal keeps the events from here on."""
    from mcphost.host.server import call_timeout_from_env
    from mcphost.supervisor.center.link import Center

    raise_descriptor_limit()  # soft RLIMIT_NOFILE to its hard limit, logged
    loop = asyncio.get_running_loop()
    events.bound_accept_errors(loop)  # asyncio's EMFILE tracebacks: one line per 10 s
    probe()  # forks and waits for its own child: before the Reaper owns waitpid
    store = StateStore(os.path.join(state_dir, "state.sqlite3"))
    lost = store.record_lost_runs()  # before any runner reads its agent's last exit
    if lost:
        events.emit(
            "supervisor.lost_runs_recorded",
            level="warning",
            agents={record.agent_id: record.generation for record in lost},
        )
    records = ProcessRecords(store)
    reaper = kernel.Reaper()
    reaper.install(loop)
    # what a crashed supervisor left running, before any spawn
    await records.end_leftovers(max((plan.stop_grace for plan in fleet.agents), default=10.0))
    return Ground(
        lock_fd=lock_fd,
        store=store,
        records=records,
        reaper=reaper,
        # each agent in a cgroup of its own (and what a crashed supervisor left there ended)
        cgroups=cgroups.open_cgroups(state_dir),
        center=Center(link, call_timeout=call_timeout_from_env()),
    )
