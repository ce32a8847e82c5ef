"""The dashboard's rules, pure: where it listens, the token anything that changes state needs, and which
run ids and file names a request may name. No I/O but reading and writing the token file.

Loopback is the default and needs no token (the pages are read-only then); any other address needs one,
from `--token-file` (a missing file gets a new token, written 0600 and printed once), else the command
exits 2. Mutating endpoints are POST only and compare the `X-Labctl-Token` header with `hmac.compare_digest`
(constant time), so that neither a cross-site form nor a timing probe gets through.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from labctl.core.errors import InputError

DEFAULT_HOST = "127.0.0.1"
TOKEN_HEADER = "X-Labctl-Token"
TOKEN_BYTES = 32
"""A generated token's entropy: 256 bits, URL-safe base64."""


@dataclass(frozen=True)
class Bind:
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def url(self, port: int | None = None) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port if port is None else port}/"


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or `localhost`; a name that is not an address is not loopback (it may resolve to
    anything)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_bind(text: str) -> Bind:
    """`--http [ADDR:]PORT`: `8080`, `127.0.0.1:0`, `0.0.0.0:8080`, `[::1]:8080`. Port 0 picks a free one."""
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host = DEFAULT_HOST
    elif host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host or not host:
        raise InputError(f"--http {text}: give [ADDR:]PORT (an IPv6 address in brackets: [::1]:8080)")
    if not port_text.isascii() or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise InputError(f"--http {text}: the port must be a number from 0 to 65535")
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise InputError(f"--http {text}: {host!r} is not an IP address") from None
    return Bind(host, int(port_text))


def make_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def load_token(token_file: Path | None, bind: Bind) -> tuple[str | None, bool]:
    """(the token, whether it was generated now). No file on loopback: no token (read-only pages). No file
    elsewhere: InputError (exit 2). A file that does not exist gets a new token, written owner-only."""
    if token_file is None:
        if not bind.loopback:
            raise InputError(
                f"--http {bind.host}: not a loopback address, so a token is required: "
                "pass --token-file FILE (a missing FILE gets a new token)"
            )
        return None, False
    if token_file.exists():
        try:
            token = token_file.read_text().strip()
        except OSError as e:
            raise InputError(f"--token-file {token_file}: cannot read it: {e.strerror}") from None
        if len(token) < 16:
            raise InputError(f"--token-file {token_file}: the token must be at least 16 characters")
        return token, False
    token = make_token()
    try:
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    except OSError as e:
        raise InputError(f"--token-file {token_file}: cannot write a new token there: {e.strerror}") from None
    return token, True


def token_matches(expected: str | None, given: str | None) -> bool:
    """Whether a request's token is the server's; no server token: nothing matches (read-only)."""
    if expected is None or given is None:
        return False
    return hmac.compare_digest(expected.encode(), given.encode())


RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
SERVED_SUFFIXES = frozenset({".png", ".svg", ".pdf", ".json", ".jsonl", ".csv", ".parquet", ".vcd", ".txt"})
"""What a run's file route serves: its figures, tables and logs; nothing executable, nothing hidden."""


def run_dir_of(runs_dir: Path, run_id: str) -> Path | None:
    """The run directory `run_id` names inside `runs_dir`, or None: a name with a separator, `..`, a leading
    dot, or one that resolves outside the runs directory (a symbolic link out) is refused like a missing
    one."""
    if not RUN_ID.fullmatch(run_id) or ".." in run_id:
        return None
    root = runs_dir.resolve()
    path = (root / run_id).resolve()
    if path.parent != root or not (path / "run.json").is_file():
        return None
    return path


def run_file_of(run_dir: Path, name: str) -> Path | None:
    """A file directly in a run directory that a page may link to, or None (traversal, hidden, other)."""
    if not FILE_NAME.fullmatch(name) or ".." in name or Path(name).suffix not in SERVED_SUFFIXES:
        return None
    path = (run_dir / name).resolve()
    if path.parent != run_dir.resolve() or not path.is_file():
        return None
    return path
