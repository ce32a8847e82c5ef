"""Connection settings for the MQTT broker between the controller and the agents."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiomqtt

from labctl.core.errors import InputError
from labctl.inventory.config import Secret
from labctl.inventory.schema import Inventory

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class BrokerSettings:
    """Resolved connection settings. Secrets stay `Secret` until the client is built."""

    lab: str
    hostname: str
    port: int
    tls: bool
    username: Secret | None = None
    password: Secret | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    auth_key: Secret | None = None
    clock_sync_interval_s: float = 0.5
    clock_samples: int = 8
    clock_exchange: str = "udp"  # "udp": pings straight to each agent (decision 0048); "broker": through it
    clock_udp_port: int = 0  # the agents' clock responder port (0: any free one, announced)
    feed_lead_ms: float = 50.0
    mirror_lag_ms: float = 50.0
    agent_grace_s: float = 5.0

    @staticmethod
    def check_names(inventory: Inventory) -> None:
        """The lab and host names become MQTT topic levels: no wildcards, separators or spaces."""
        for loc, name in [(("lab",), inventory.lab), *((("hosts", h), h) for h in inventory.hosts)]:
            if not _NAME.match(name):
                raise inventory.fail(loc, f"{name!r} cannot be part of an MQTT topic (use [A-Za-z0-9_.-])")

    @classmethod
    def from_inventory(cls, inventory: Inventory, url: str | None = None) -> BrokerSettings:
        spec = inventory.model.broker
        url = url or (spec.url if spec is not None else None)
        if url is None:
            raise InputError(f"{inventory.path}: no `broker:` section and no --broker URL")
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError as e:
            raise InputError(f"--broker {url!r}: {e}") from None
        if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
            raise InputError(f"--broker {url!r}: use mqtt://HOST:PORT or mqtts://HOST:PORT")
        cls.check_names(inventory)
        tls = parts.scheme == "mqtts" or (spec is not None and spec.tls is not None)
        where = "the inventory's broker section"
        return cls(
            lab=inventory.lab,
            hostname=parts.hostname,
            port=port or (8883 if tls else 1883),
            tls=tls,
            username=spec.username.resolve(where) if spec and spec.username else None,
            password=spec.password.resolve(where) if spec and spec.password else None,
            ca_file=spec.tls.ca_file if spec and spec.tls else None,
            cert_file=spec.tls.cert_file if spec and spec.tls else None,
            key_file=spec.tls.key_file if spec and spec.tls else None,
            auth_key=spec.auth_key.resolve(where) if spec and spec.auth_key else None,
            clock_sync_interval_s=spec.clock_sync_interval_s if spec else 0.5,
            clock_samples=spec.clock_samples if spec else 8,
            clock_exchange=spec.clock_exchange if spec else "udp",
            clock_udp_port=spec.clock_udp_port if spec else 0,
            feed_lead_ms=spec.feed_lead_ms if spec else 50.0,
            mirror_lag_ms=spec.mirror_lag_ms if spec else 50.0,
            agent_grace_s=spec.agent_grace_s if spec else 5.0,
        )

    def client(self, identifier: str, will: aiomqtt.Will | None = None) -> aiomqtt.Client:
        tls_params = (
            aiomqtt.TLSParameters(ca_certs=self.ca_file, certfile=self.cert_file, keyfile=self.key_file)
            if self.tls
            else None
        )
        return aiomqtt.Client(
            self.hostname,
            self.port,
            username=self.username.reveal() if self.username else None,
            password=self.password.reveal() if self.password else None,
            identifier=identifier,
            will=will,
            clean_session=True,
            tls_params=tls_params,
            keepalive=5,
            timeout=5,
            # Small messages both ways (ping/pong, commands): Nagle + delayed ACK would add ~40 ms each.
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        )
