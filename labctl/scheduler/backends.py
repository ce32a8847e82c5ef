"""Which queue `--db` names: a `postgresql://` URL (the shared PostgreSQL backend, labctl.scheduler.store_pg)
or a SQLite file (labctl.scheduler.store_sqlite, the default). Apart from both so that neither imports the
other."""

from __future__ import annotations

from pathlib import Path

from labctl.scheduler.location import check_url, is_url
from labctl.scheduler.store import Store
from labctl.scheduler.store_sqlite import QueueStore


def open_store(db: str | Path | None, *, from_env: bool = False) -> Store:
    """The queue `--db` names: a `postgresql://` URL (PostgreSQL, shared) or a SQLite file (the default)."""
    if db is not None and is_url(db):
        assert isinstance(db, str)
        check_url(db, from_env=from_env)
        from labctl.scheduler.store_pg import PostgresStore  # psycopg: only for a URL

        return PostgresStore(db)
    return QueueStore(Path(db) if db is not None else None)
