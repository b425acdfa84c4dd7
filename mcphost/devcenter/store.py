"""SQLite state of the reference center: schema, first-start seed, and small queries.

Owns: the database file (`<state>/center.db`, WAL mode), the seeded world (workers, agents,
projects, issues) and row-level reads and writes. One connection, used from the event loop;
every write is one short transaction (`with self.tx():`).
Must never: store a plaintext token (only its SHA-256), know about HTTP, or decide policy
(who may do what lives in `tools`/`files`).
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mcphost.fsutil import write_atomic

SCHEMA = """
CREATE TABLE IF NOT EXISTS workers (worker_id TEXT PRIMARY KEY, token_sha256 TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS retired_tokens (
    token_sha256 TEXT PRIMARY KEY, worker_id TEXT NOT NULL, until REAL NOT NULL);
CREATE TABLE IF NOT EXISTS agents (agent_id TEXT PRIMARY KEY, worker_id TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS projects (project_id TEXT PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS project_members (
    project_id TEXT NOT NULL, agent_id TEXT NOT NULL, PRIMARY KEY (project_id, agent_id));
CREATE TABLE IF NOT EXISTS issues (
    issue_id TEXT PRIMARY KEY, project_id TEXT NOT NULL, title TEXT NOT NULL,
    description TEXT NOT NULL, status TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY, project_id TEXT NOT NULL, title TEXT NOT NULL,
    description TEXT, status TEXT NOT NULL, assignee TEXT, creator TEXT NOT NULL,
    derived_from_issue TEXT, dispatch INTEGER NOT NULL, dispatch_mode TEXT NOT NULL,
    lease_expires_at TEXT, created_at TEXT NOT NULL, updated_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS task_messages (
    message_id TEXT PRIMARY KEY, task_id TEXT NOT NULL, author TEXT NOT NULL,
    content TEXT NOT NULL, posted_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS subscriptions (
    task_id TEXT NOT NULL, identity TEXT NOT NULL, PRIMARY KEY (task_id, identity));
CREATE TABLE IF NOT EXISTS generations (agent_id TEXT PRIMARY KEY, generation INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS transfers (
    transfer_id TEXT PRIMARY KEY, file_id TEXT NOT NULL UNIQUE, agent_id TEXT NOT NULL,
    filename TEXT NOT NULL, content_type TEXT NOT NULL, size INTEGER NOT NULL,
    scope TEXT, scope_id TEXT, received_sha256 TEXT, received_size INTEGER,
    completed INTEGER NOT NULL DEFAULT 0, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files (
    file_id TEXT PRIMARY KEY, sha256 TEXT NOT NULL, size INTEGER NOT NULL,
    mime_type TEXT NOT NULL, filename TEXT NOT NULL, uploader TEXT NOT NULL,
    created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS file_refs (
    reference_id TEXT PRIMARY KEY, file_id TEXT NOT NULL, scope TEXT NOT NULL,
    scope_id TEXT NOT NULL, created_by TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS forks (
    fork_id TEXT PRIMARY KEY, agent_id TEXT NOT NULL, task_id TEXT NOT NULL,
    model TEXT, context TEXT, created_at TEXT NOT NULL, generation TEXT);
"""

TOKEN_PREFIX = "acat_"
SEED_AGENT = "agent-1"
SEED_WORKER = "w-1"


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_file(state: Path, worker_id: str = SEED_WORKER) -> Path:
    """Where the plaintext worker token lives (0600): `worker-token` for w-1, else a suffix."""
    return state / ("worker-token" if worker_id == SEED_WORKER else f"worker-token.{worker_id}")


class Store:
    """One SQLite connection plus the queries the center needs. Rows come back as dicts."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # -- generic helpers -------------------------------------------------------------------

    def one(self, sql: str, *args: Any) -> dict[str, Any] | None:
        row = self.db.execute(sql, args).fetchone()
        return dict(row) if row is not None else None

    def all(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        return [dict(row) for row in self.db.execute(sql, args).fetchall()]

    def run(self, sql: str, *args: Any) -> int:
        with self.tx() as db:
            return db.execute(sql, args).rowcount

    # -- seed ------------------------------------------------------------------------------

    def seed(self, state: Path) -> None:
        """First start: create the seeded world and token files. Later starts: no-op."""
        if self.one("SELECT 1 AS x FROM workers LIMIT 1"):
            return
        tokens = {"w-1": new_token(), "w-2": new_token()}
        with self.tx() as db:
            for worker_id, token in tokens.items():
                db.execute("INSERT INTO workers VALUES (?, ?)", (worker_id, token_digest(token)))
            db.executemany(
                "INSERT INTO agents VALUES (?, ?)",
                [("agent-1", "w-1"), ("agent-2", "w-1"), ("agent-x", "w-2")],
            )
            db.executemany(
                "INSERT INTO projects VALUES (?, ?)",
                [("p-1", "Project One"), ("p-2", "Project Two (agent-1 is not a member)")],
            )
            db.executemany(
                "INSERT INTO project_members VALUES (?, ?)",
                [("p-1", "agent-1"), ("p-1", "agent-2"), ("p-1", "agent-x"), ("p-2", "agent-x")],
            )
            db.executemany(
                "INSERT INTO issues VALUES (?, ?, ?, ?, 'open')",
                [
                    ("i-1", "p-1", "Seeded issue in p-1", "An issue agent-1 can read."),
                    ("i-2", "p-2", "Seeded issue in p-2", "An issue agent-1 cannot read."),
                ],
            )
        for worker_id, token in tokens.items():
            write_atomic(token_file(state, worker_id), token + "\n")

    def add_worker(self, state: Path, worker_id: str) -> bool:
        """A new worker with a fresh token in `token_file(state, worker_id)`; False if it exists."""
        token = new_token()
        with self.tx() as db:
            added = db.execute(
                "INSERT OR IGNORE INTO workers VALUES (?, ?)", (worker_id, token_digest(token))
            ).rowcount
        if added:
            write_atomic(token_file(state, worker_id), token + "\n")
        return bool(added)

    # -- identity --------------------------------------------------------------------------

    def worker_for_token(self, token: str) -> str | None:
        """The worker of a current token, or of a rotated-out one still inside its overlap."""
        digest = token_digest(token)
        row = self.one("SELECT worker_id FROM workers WHERE token_sha256 = ?", digest) or self.one(
            "SELECT worker_id FROM retired_tokens WHERE token_sha256 = ? AND until > ?",
            digest,
            time.time(),
        )
        return None if row is None else str(row["worker_id"])

    def rotate_token(self, state: Path, worker_id: str, overlap_seconds: float) -> float | None:
        """Give `worker_id` a new token, written atomically (0600) to its token file; the old
        one stays valid for `overlap_seconds`. Returns when it stops (None: no such worker)."""
        row = self.one("SELECT token_sha256 FROM workers WHERE worker_id = ?", worker_id)
        if row is None:
            return None
        token, until = new_token(), time.time() + overlap_seconds
        with self.tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO retired_tokens VALUES (?, ?, ?)",
                (row["token_sha256"], worker_id, until),
            )
            db.execute(
                "UPDATE workers SET token_sha256 = ? WHERE worker_id = ?",
                (token_digest(token), worker_id),
            )
        write_atomic(token_file(state, worker_id), token + "\n")
        return until

    def agent(self, agent_id: str) -> dict[str, Any] | None:
        return self.one("SELECT * FROM agents WHERE agent_id = ?", agent_id)

    def is_member(self, project_id: str, agent_id: str) -> bool:
        return bool(
            self.one(
                "SELECT 1 AS x FROM project_members WHERE project_id = ? AND agent_id = ?",
                project_id,
                agent_id,
            )
        )

    def fence_generation(self, agent_id: str, generation: int) -> int | None:
        """Record `generation` if it is not lower than the highest seen; else return that."""
        with self.tx() as db:
            row = db.execute(
                "SELECT generation FROM generations WHERE agent_id = ?", (agent_id,)
            ).fetchone()
            if row is not None and int(row["generation"]) > generation:
                return int(row["generation"])
            db.execute(
                "INSERT INTO generations VALUES (?, ?) ON CONFLICT(agent_id) "
                "DO UPDATE SET generation = excluded.generation",
                (agent_id, generation),
            )
        return None

    def reserve_generation(self, agent_id: str, at_least: int, limit: int) -> int | None:
        """The agent's next generation: above every one seen and at least `at_least`, recorded
        as the highest seen in the same transaction; None when it would exceed `limit`."""
        with self.tx() as db:
            row = db.execute(
                "SELECT generation FROM generations WHERE agent_id = ?", (agent_id,)
            ).fetchone()
            generation = max(at_least, 1 if row is None else int(row["generation"]) + 1)
            if generation > limit:
                return None
            db.execute(
                "INSERT INTO generations VALUES (?, ?) ON CONFLICT(agent_id) "
                "DO UPDATE SET generation = excluded.generation",
                (agent_id, generation),
            )
        return generation

    # -- domain reads ----------------------------------------------------------------------

    def project(self, project_id: str) -> dict[str, Any] | None:
        return self.one("SELECT * FROM projects WHERE project_id = ?", project_id)

    def issue(self, issue_id: str) -> dict[str, Any] | None:
        return self.one("SELECT * FROM issues WHERE issue_id = ?", issue_id)

    def task(self, task_id: str) -> dict[str, Any] | None:
        return self.one("SELECT * FROM tasks WHERE task_id = ?", task_id)

    def file(self, file_id: str) -> dict[str, Any] | None:
        return self.one("SELECT * FROM files WHERE file_id = ?", file_id)

    def transfer(self, transfer_id: str) -> dict[str, Any] | None:
        return self.one("SELECT * FROM transfers WHERE transfer_id = ?", transfer_id)
