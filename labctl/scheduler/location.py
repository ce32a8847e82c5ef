"""Where the queue is: a SQLite file (by default one per user, never in a clone) or a PostgreSQL URL,
checked, and printed only with its password masked."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from labctl.core.errors import InputError

QUEUE_DB_ENV = "LABCTL_QUEUE_DB"
LEGACY_DB = Path("labctl-queue.sqlite")  # where releases before 0.3 put it: in whatever directory serve ran


def default_queue_db() -> Path:
    """$LABCTL_QUEUE_DB, else $XDG_DATA_HOME/labctl/queue.sqlite (~/.local/share/labctl/queue.sqlite): one
    queue per user wherever labctl is started, never a stray file in a clone."""
    explicit = os.environ.get(QUEUE_DB_ENV)
    if explicit and not is_url(explicit):
        return Path(explicit)
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "labctl" / "queue.sqlite"


def resolve_db(db: Path | None) -> Path:
    """The SQLite queue file to use (the default's folder is created)."""
    if db is not None:
        return Path(db)
    path = default_queue_db()
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


URL_SCHEMES = ("postgresql", "postgres")


def is_url(db: str | Path) -> bool:
    return isinstance(db, str) and re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", db) is not None


def mask_url(url: str) -> str:
    """The URL with its password (if any) replaced by ***: the only form a URL is printed or logged in."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.hostname or ""
        netloc = f"{parts.username or ''}:***@{host}"
        if parts.port is not None:
            netloc += f":{parts.port}"
    except ValueError:
        return re.sub(r"(//[^:/@]*:)[^@]*@", r"\1***@", url)
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def check_url(url: str, *, from_env: bool) -> str:
    """A `postgresql://user@host:port/db` URL, validated (InputError, exit 2, on a malformed one). A password
    belongs in $PGPASSWORD or ~/.pgpass (libpq reads both), not on a command line: one in --db is refused;
    one in $LABCTL_QUEUE_DB is accepted (the environment is where secrets live) and never shown."""
    shown = mask_url(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise InputError(f"--db {shown}: not a valid PostgreSQL URL ({e})") from None
    if parts.scheme not in URL_SCHEMES:
        raise InputError(
            f"--db {shown}: unknown scheme {parts.scheme!r}: "
            "use postgresql://USER@HOST:PORT/DB or a file path"
        )
    if not parts.hostname and "host=" not in parts.query:
        raise InputError(f"--db {shown}: no host: use postgresql://USER@HOST:PORT/DB")
    if not parts.path.strip("/"):
        raise InputError(f"--db {shown}: no database name: use postgresql://USER@HOST:PORT/DB")
    if port is not None and not 0 < port < 65536:
        raise InputError(f"--db {shown}: port {port} out of range")
    if parts.password is not None and not from_env:
        raise InputError(
            f"--db {shown}: a password on the command line is visible to every user of this machine: "
            "put it in $PGPASSWORD or ~/.pgpass (or the URL in $LABCTL_QUEUE_DB)"
        )
    return url
