"""The supervisor's persistent state: one SQLite file under `--state` (`state.sqlite3`, 0600).

Owns: the generation of every agent, strictly increasing across spawns and across supervisor
restarts (and at least what the center reserved, so across state directories too:
docs/concepts.md "Restarts and generations"), by the one rule of the next generation
(`generation_after`, which the runner and the center's reservation use too): `next_generation`
applies it inside one `BEGIN IMMEDIATE` transaction (so two
processes on the same file serialise) and commits (synchronous=FULL, write-ahead log) before it
returns, so a generation once handed to an agent is never handed out again, even if the
supervisor is killed right after or the machine loses power; `next_generations` does the same
for many agents in one transaction (one fsync: the start-up of a fleet,
test_state.py::test_a_start_up_s_generations_are_one_durable_commit). Also the last exit of every agent (`record_exit`), so
`ctl status` can show it after a supervisor restart; a generation handed out with no exit
recorded after it was running when the supervisor died (`kill -9`, a crash): the next
supervisor records that as its exit (`record_lost_runs`, before any runner reads an exit). And every process the supervisor started
or adopted (`record_process`: pid, /proc start time, process group, session; agents, `ctl exec`
commands, and escapees reparented to it as subreaper), committed before the call returns, so a
supervisor started after a crash (`kill -9`) can end what the dead one left running before it
spawns anything (`kernel.end_leftovers`); a row is dropped (`forget_processes`) once its process
and its group are gone. Those rows, and the exits, are committed with synchronous=NORMAL (in
the write-ahead log, no fsync of their own): durable across the supervisor's death, which is all
they are for (a machine that lost power has no process left to end), and one fsync fewer per
spawn (test_state.py::test_process_records_cost_no_fsync_and_generations_one_each). And each agent's own uid (`uids`, `keep_uids`: uids.py decides, this
keeps), so an agent's home keeps its owner across supervisor restarts; a uid whose agent left
the fleet is dropped, free for another.
Must never: store a secret (no token, no environment), or hand out a generation that is not
committed. Calls are synchronous and short (one row); it is used from the event loop's thread.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS generations (
    agent_id   TEXT PRIMARY KEY,
    generation INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS exits (
    agent_id   TEXT PRIMARY KEY,
    generation INTEGER NOT NULL,
    at         REAL NOT NULL,
    exit       TEXT,
    reason     TEXT
);
CREATE TABLE IF NOT EXISTS uids (
    agent_id TEXT PRIMARY KEY,
    uid      INTEGER NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS processes (
    pid       INTEGER NOT NULL,
    starttime INTEGER NOT NULL,
    pgid      INTEGER NOT NULL,
    sid       INTEGER NOT NULL,
    agent_id  TEXT,
    kind      TEXT NOT NULL,
    PRIMARY KEY (pid, starttime)
);
"""


# The exit of a run the supervisor never saw end: it died (`kill -9`, a crash) while it ran.
LOST_EXIT = "unknown"
LOST_REASON = "the supervisor died while this generation ran (no exit was recorded)"


@dataclass(frozen=True, slots=True)
class ExitRecord:
    agent_id: str
    generation: int
    at: float  # wall clock
    exit: str | None  # "exit 1", "signal 9", or None (never started: spawn failed)
    reason: str | None


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """A process the supervisor started or adopted: (pid, starttime) names it for all time."""

    pid: int
    starttime: int  # /proc/<pid>/stat field 22
    pgid: int
    sid: int
    agent_id: str | None  # None: adopted (an escapee reparented to the supervisor)
    kind: str  # "agent" | "exec" | "adopted"


MAX_GENERATION = (1 << 63) - 1  # what X-AC-MCP-Generation (and an SQLite INTEGER) can carry


class GenerationExhausted(ValueError):
    """No generation follows: the agent's last one (here or at the center) is `MAX_GENERATION`.
    `code` is the stable code the runner fails the agent with."""

    code = "generation_exhausted"


def generation_after(last: int | None, *, at_least: int = 1) -> int:
    """The generation that follows `last` (None: there was none): one more, or `at_least` when
    that is higher. The one rule of the next generation, for the state file, the runner's ask of
    the center and the center's last word alike. `GenerationExhausted` past `MAX_GENERATION`."""
    generation = max((last or 0) + 1, at_least)
    if generation > MAX_GENERATION:
        raise GenerationExhausted(
            f"generation {MAX_GENERATION} (the highest X-AC-MCP-Generation can carry) was "
            "already used for this agent, here or at the center, so it cannot be spawned again; "
            "give the agent another id, or have the center's operators reset its generations"
        )
    return generation


class StateStore:
    """Generations (and last exits) per agent in one SQLite file."""

    def __init__(self, path: str) -> None:
        self.path = path
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, mode=0o700, exist_ok=True)
        # Create the file 0600 before SQLite does (it would use the umask); journal files
        # SQLite creates next to it take the database file's mode.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
        self._db = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        # WAL: a commit is one append, and with synchronous=FULL one fsync of the log (the
        # rollback journal took several). NORMAL (no fsync) by default: process records and
        # exits need only survive this process; generations and uids commit FULL (`_durable`).
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def _durable(self, write: Callable[[sqlite3.Connection], T]) -> T:
        """`write` in one `BEGIN IMMEDIATE` transaction committed with synchronous=FULL: on
        disk (the log fsynced, with every NORMAL commit before it) when this returns."""
        db = self._db
        db.execute("PRAGMA synchronous=FULL")
        try:
            db.execute("BEGIN IMMEDIATE")  # the read and the write in one writer's transaction
            try:
                result = write(db)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        finally:
            db.execute("PRAGMA synchronous=NORMAL")
        return result

    def next_generation(self, agent_id: str, at_least: int = 1) -> int:
        """Allocate the agent's next generation, `generation_after` the last here (1 for the
        first spawn) and at least `at_least` (what the center reserved); committed on return."""
        return self.next_generations({agent_id: at_least})[agent_id]

    def next_generations(self, at_least: Mapping[str, int]) -> dict[str, int]:
        """`next_generation` of each agent in `at_least` (agent id -> its floor), in one
        transaction and one fsync: all are committed on return, or none (GenerationExhausted
        for any leaves every one as it was)."""

        def write(db: sqlite3.Connection) -> dict[str, int]:
            given = {
                agent_id: generation_after(self.generation(agent_id), at_least=floor)
                for agent_id, floor in at_least.items()
            }
            db.executemany(
                "INSERT INTO generations (agent_id, generation) VALUES (?, ?) "
                "ON CONFLICT(agent_id) DO UPDATE SET generation = excluded.generation",
                given.items(),
            )
            return given

        return self._durable(write)

    def generation(self, agent_id: str) -> int | None:
        """The last generation handed out for the agent; None if it never had one."""
        row = self._db.execute(
            "SELECT generation FROM generations WHERE agent_id = ?", (agent_id,)
        ).fetchone()
        return None if row is None else int(row[0])

    def record_exit(
        self,
        agent_id: str,
        generation: int,
        exit: str | None,
        reason: str | None,
        at: float | None = None,
    ) -> None:
        """Remember the agent's latest exit (one row per agent, replaced)."""
        self._db.execute(
            "INSERT INTO exits (agent_id, generation, at, exit, reason) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT(agent_id) DO UPDATE SET generation = excluded.generation, "
            "at = excluded.at, exit = excluded.exit, reason = excluded.reason",
            (agent_id, generation, time.time() if at is None else at, exit, reason),
        )

    def last_exit(self, agent_id: str) -> ExitRecord | None:
        row = self._db.execute(
            "SELECT generation, at, exit, reason FROM exits WHERE agent_id = ?", (agent_id,)
        ).fetchone()
        if row is None:
            return None
        return ExitRecord(agent_id, int(row[0]), float(row[1]), row[2], row[3])

    def record_lost_runs(self) -> list[ExitRecord]:
        """Record `LOST_EXIT` as the exit of every agent whose last generation has no exit
        recorded (it was running, or starting, when the supervisor died without stopping it),
        in one transaction; the records written. Call at start, before any spawn."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            rows = db.execute(
                "SELECT g.agent_id, g.generation FROM generations AS g "
                "LEFT JOIN exits AS e ON e.agent_id = g.agent_id "
                "WHERE e.generation IS NULL OR e.generation < g.generation ORDER BY g.agent_id"
            ).fetchall()
            now = time.time()
            lost = [
                ExitRecord(str(agent_id), int(generation), now, LOST_EXIT, LOST_REASON)
                for agent_id, generation in rows
            ]
            for record in lost:
                self.record_exit(
                    record.agent_id, record.generation, record.exit, record.reason, at=now
                )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return lost

    def record_process(self, record: ProcessRecord) -> None:
        """Remember a process (committed on return, synchronous=NORMAL: see the module)."""
        self._db.execute(
            "INSERT OR REPLACE INTO processes (pid, starttime, pgid, sid, agent_id, kind) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (
                record.pid,
                record.starttime,
                record.pgid,
                record.sid,
                record.agent_id,
                record.kind,
            ),
        )

    def processes(self) -> list[ProcessRecord]:
        rows = self._db.execute(
            "SELECT pid, starttime, pgid, sid, agent_id, kind FROM processes ORDER BY pid"
        ).fetchall()
        return [ProcessRecord(int(r[0]), int(r[1]), int(r[2]), int(r[3]), r[4], r[5]) for r in rows]

    def forget_processes(self, keys: list[tuple[int, int]]) -> None:
        """Drop the rows of these (pid, starttime) pairs, in one transaction."""
        if not keys:
            return
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany("DELETE FROM processes WHERE pid = ? AND starttime = ?", keys)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def uids(self) -> dict[str, int]:
        """Each agent's own uid, as last kept (uids.py)."""
        rows = self._db.execute("SELECT agent_id, uid FROM uids").fetchall()
        return {str(r[0]): int(r[1]) for r in rows}

    def keep_uids(self, assigned: dict[str, int]) -> None:
        """Make `assigned` the whole table (the uids of agents outside it are released), in one
        transaction, committed on return."""
        if assigned == self.uids():
            return

        def write(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM uids")
            db.executemany("INSERT INTO uids (agent_id, uid) VALUES (?, ?)", assigned.items())

        self._durable(write)

    def close(self) -> None:
        self._db.close()
