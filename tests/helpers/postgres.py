"""A private PostgreSQL server for the shared queue's tests: started once per test session (per xdist worker)
from the Debian package's binaries in a temporary directory, on 127.0.0.1 and a free port, trust auth; one
database per test, dropped after it. Without the binaries (or psycopg) the tests skip with one line naming
the package; in labctl's CI (LABCTL_CI=1, .ci/run installs `postgresql`) they fail instead."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from labctl.testing.support import require

USER = "labctl"
START_TIMEOUT_S = 60


def _bin_dir() -> Path | None:
    """The newest PostgreSQL server's bin/ (Debian: /usr/lib/postgresql/N/bin), else one on PATH."""
    found = sorted(
        (Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/postgres")),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if found:
        return found[-1]
    on_path = shutil.which("postgres")
    return Path(on_path).parent if on_path and (Path(on_path).parent / "initdb").exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PostgresServer:
    port: int
    proc: subprocess.Popen[bytes]
    root: Path

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def admin(self) -> Any:
        import psycopg

        return psycopg.connect(self.url(), autocommit=True, connect_timeout=10)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        require(False, "psycopg is not installed: pip install -e '.[test]' (or '.[postgres]')")
    bin_dir = _bin_dir()
    require(bin_dir is not None, "PostgreSQL server binaries not found: apt-get install postgresql")
    assert bin_dir is not None
    root = Path(tempfile.mkdtemp(prefix="labctl-pg-"))
    # initdb and postgres refuse to run as root: as root, run them as the package's `postgres` user.
    as_user: dict[str, Any] = {}
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(root)
            require(False, "running as root without a `postgres` user: apt-get install postgresql")
            raise
        os.chown(root, pw.pw_uid, pw.pw_gid)
        as_user = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
    data = root / "data"
    log_path = root / "server.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(
            [str(bin_dir / "initdb"), "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync"],
            check=True,
            capture_output=True,
            timeout=120,
            cwd=root,
            **as_user,
        )
        port = _free_port()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [
                    str(bin_dir / "postgres"),
                    "-D", str(data),
                    "-h", "127.0.0.1",
                    "-p", str(port),
                    "-k", str(root),
                    "-c", "fsync=off",
                    "-c", "synchronous_commit=off",
                    "-c", "full_page_writes=off",
                    "-c", "max_connections=200",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=root,
                **as_user,
            )  # fmt: skip
        server = PostgresServer(port, proc, root)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                server.admin().close()
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"PostgreSQL did not start: {log_path.read_text(errors='replace')[-2000:]}"
                    ) from None
                time.sleep(0.1)
        yield server
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGINT)  # fast shutdown: clients left over are disconnected
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh, empty database on the session's server, as a URL; dropped after the test."""
    name = f"t_{secrets.token_hex(6)}"
    with contextlib.closing(postgres_server.admin()) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield postgres_server.url(name)
    with contextlib.closing(postgres_server.admin()) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
