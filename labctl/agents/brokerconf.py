"""What mosquitto needs for a lab's per-host identities (decision 0067): its password file, its ACL file and
a configuration that uses them (`labctl lab broker-config`).

The password file holds PBKDF2-SHA512 hashes in mosquitto's own format (`$7$`, what `mosquitto_passwd`
writes), computed here: no password is ever put on a command line. The ACL lets the controller alone
publish commands and the world feed, and each agent publish only its own host's events, replies and status
and read only its own commands (and the world feed).
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from labctl.agents.broker import (
    CONTROLLER,
    BrokerSettings,
    derive,
    resolve_identity,
    username,
)
from labctl.agents.wire import topic, world_topic
from labctl.core.errors import InputError
from labctl.inventory.config import Secret
from labctl.inventory.schema import BrokerIdentitiesSpec, Inventory

PBKDF2_ITERATIONS = 10_000
"""Per password hash (mosquitto 2 reads the count from the file; its own tool writes 101)."""


def mosquitto_hash(password: Secret, salt: bytes | None = None) -> str:
    """`$7$ITERATIONS$SALT$HASH`: PBKDF2-HMAC-SHA512, a 12-byte salt, as mosquitto 2 reads it."""
    salt = salt if salt is not None else secrets.token_bytes(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.reveal().encode(), salt, PBKDF2_ITERATIONS)
    b64 = base64.b64encode
    return f"$7${PBKDF2_ITERATIONS}${b64(salt).decode()}${b64(digest).decode()}"


def acl_text(inventory: Inventory, ids: BrokerIdentitiesSpec) -> str:
    lab = inventory.lab
    lines = [
        f"# labctl broker ACL of lab {lab} (written by `labctl lab broker-config`; decision 0067)",
        "# anonymous clients: nothing (allow_anonymous false as well)",
        "",
        f"user {username(ids, CONTROLLER)}",
        f"topic write {topic(lab, '+', 'cmd')}",
        f"topic write {world_topic(lab)}",
        *(f"topic read {topic(lab, '+', leaf)}" for leaf in ("events", "reply", "status")),
    ]
    for host in inventory.hosts:
        lines += [
            "",
            f"user {username(ids, host)}",
            *(f"topic write {topic(lab, host, leaf)}" for leaf in ("events", "reply", "status")),
            f"topic read {topic(lab, host, 'cmd')}",
            f"topic read {world_topic(lab)}",
        ]
    return "\n".join(lines) + "\n"


def password_text(inventory: Inventory, ids: BrokerIdentitiesSpec) -> str:
    """One line per identity; every identity's secret must be in the environment (one line if not)."""
    lines = []
    for name in (CONTROLLER, *inventory.hosts):
        password = derive(resolve_identity(ids, name), "mqtt-password")
        lines.append(f"{username(ids, name)}:{mosquitto_hash(password)}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ServerTls:
    """The broker's side of TLS: its certificate and key, the CA that signs the clients' certificates."""

    cert_file: Path
    key_file: Path
    ca_file: Path | None = None
    require_client_cert: bool = False


def conf_text(
    listeners: list[tuple[str, int]], password_file: Path, acl_file: Path, tls: ServerTls | None
) -> str:
    lines = [
        "# mosquitto configuration for labctl's per-host identities (`labctl lab broker-config`)",
        "per_listener_settings false",
        "allow_anonymous false",
        f"password_file {password_file}",
        f"acl_file {acl_file}",
        # Without it the broker's Nagle + the clients' delayed ACK add ~40 ms to small messages (0017).
        "set_tcp_nodelay true",
    ]
    for host, port in listeners:
        # Each client's id is its user (decision 0072): an agent host cannot connect under the controller's
        # client id and end its session (the broker drops the older of two equal ids). A listener option:
        # before any `listener` line it would open mosquitto's default listener on port 1883.
        lines += ["", f"listener {port} {host}", "use_username_as_clientid true"]
        if tls is not None:
            lines += [f"certfile {tls.cert_file}", f"keyfile {tls.key_file}"]
            if tls.ca_file is not None:
                lines.append(f"cafile {tls.ca_file}")
            if tls.require_client_cert:
                lines += ["require_certificate true", "use_identity_as_username false"]
            lines.append("tls_version tlsv1.2")
    return "\n".join(lines) + "\n"


def parse_listener(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"--listen {text!r}: use ADDRESS:PORT, e.g. 127.0.0.1:8883")
    return host.strip("[]"), int(port)


def write_broker_config(
    inventory: Inventory,
    out: Path,
    listeners: list[tuple[str, int]] | None = None,
    tls: ServerTls | None = None,
) -> dict[str, Path]:
    """Write `passwd` (0600), `acl` and `mosquitto.conf` into `out`; their paths by name. The listeners
    default to the inventory's broker address."""
    spec = inventory.model.broker
    if spec is None or spec.identities is None:
        raise InputError(
            f"{inventory.path}: broker-config writes per-host identities: add `identities: {{}}` to the "
            "inventory's `broker:` section (decision 0067)"
        )
    BrokerSettings.check_names(inventory)
    url = urlsplit(spec.url)
    secure = url.scheme == "mqtts" or spec.tls is not None
    if secure and tls is None:
        raise InputError(
            f"{inventory.path}: the broker is reached over TLS ({spec.url}): give the broker's certificate "
            "and key (--tls-cert, --tls-key)"
        )
    if tls is not None and not secure:
        raise InputError(
            f"{inventory.path}: --tls-cert for a broker the inventory reaches without TLS ({spec.url}): use "
            "mqtts:// and a `tls:` section with ca_file"
        )
    if listeners is None:
        listeners = [(url.hostname or "127.0.0.1", url.port or (8883 if secure else 1883))]
    passwords = password_text(inventory, ids := spec.identities)  # first: a missing secret writes nothing
    out.mkdir(parents=True, exist_ok=True)
    paths = {"passwd": out / "passwd", "acl": out / "acl", "conf": out / "mosquitto.conf"}
    fd = os.open(paths["passwd"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(passwords)
    paths["acl"].write_text(acl_text(inventory, ids))
    paths["conf"].write_text(conf_text(listeners, paths["passwd"].resolve(), paths["acl"].resolve(), tls))
    return paths
