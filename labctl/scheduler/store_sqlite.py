"""The queue in a SQLite file (WAL), embedded, the default: its schema, and `QueueStore` on it."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from labctl.core.errors import InputError
from labctl.scheduler.location import resolve_db
from labctl.scheduler.store import RunRow
from labctl.scheduler.store_sql import SqlStore

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    experiment TEXT NOT NULL,
    inventory TEXT NOT NULL,
    profile TEXT,
    priority INTEGER NOT NULL DEFAULT 0,
    due_ns INTEGER NOT NULL,
    submitted_ns INTEGER NOT NULL,
    state TEXT NOT NULL DEFAULT 'queued',
    resources TEXT NOT NULL,
    baseline TEXT NOT NULL,
    schedule_id INTEGER,
    missed_fires INTEGER NOT NULL DEFAULT 0,
    attempt INTEGER NOT NULL DEFAULT 1,
    retry_of INTEGER,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    pid INTEGER,
    started_ns INTEGER,
    finished_ns INTEGER,
    run_dir TEXT,
    error TEXT,
    recovery TEXT,
    owner TEXT
);
CREATE INDEX IF NOT EXISTS runs_state ON runs(state);
CREATE TABLE IF NOT EXISTS schedules (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    experiment TEXT NOT NULL,
    inventory TEXT NOT NULL,
    profile TEXT,
    priority INTEGER NOT NULL DEFAULT 0,
    cron TEXT NOT NULL,
    next_fire_ns INTEGER NOT NULL,
    enabled INTEGER NOT NULL DEFAULT 1,
    created_ns INTEGER NOT NULL
);
"""


def _check_writable(path: Path) -> None:
    """SQLite would say 'attempt to write a readonly database' much later: say whose file it is, now."""
    target = path if path.exists() else path.parent
    if not os.access(target, os.W_OK) or (path.exists() and not os.access(path.parent, os.W_OK)):
        try:
            owner = f"belongs to uid {target.stat().st_uid}"
        except OSError:
            owner = "cannot be read"
        raise InputError(
            f"{path}: no write permission on the queue database (it {owner}, you are uid {os.geteuid()}): "
            "run labctl as its owner, or pass --db"
        )


class QueueStore(SqlStore):
    """The queue in a SQLite file (WAL). Clients and `serve` each open their own connection; one `serve` per
    file (service.exclusive_serve), so leases are implicit: the one serve holds what its runs hold."""

    shared = False

    def __init__(self, path: Path | None = None) -> None:
        self.path = resolve_db(path)
        self.label = str(self.path)
        _check_writable(self.path)
        try:
            self.db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        except sqlite3.Error as e:
            raise InputError(f"{self.path}: cannot open the queue database: {e}") from None
        self.db.row_factory = sqlite3.Row
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)
            columns = {r["name"] for r in self.db.execute("PRAGMA table_info(runs)")}
            if "owner" not in columns:  # a queue from before the shared queue (decision 0061)
                self.db.execute("ALTER TABLE runs ADD COLUMN owner TEXT")
        except sqlite3.DatabaseError as e:
            self.db.close()
            raise InputError(f"{self.path}: not a labctl queue database ({e})") from None

    def close(self) -> None:
        self.db.close()

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[dict[str, Any]]:
        return [dict(r) for r in self.db.execute(sql, tuple(args)).fetchall()]

    def _exec(self, sql: str, args: Sequence[Any] = ()) -> int:
        return self.db.execute(sql, tuple(args)).rowcount

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One short write transaction; BEGIN IMMEDIATE takes the write lock first (no upgrade deadlock).
        Nested use joins the transaction already open, so several writes can commit together."""
        if self.db.in_transaction:
            yield self.db
            return
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def orphans_at_start(self, owner: str, lease_s: float) -> list[RunRow]:
        """Every row still `running`: with one serve per file, its serve is gone."""
        with self.tx():
            rows = self.runs("state='running'")
            self._exec("UPDATE runs SET owner=? WHERE state='running'", (owner,))
        return rows
