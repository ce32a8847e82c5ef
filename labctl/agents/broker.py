"""Connection settings for the MQTT broker between the controller and the agents, and the identities they
log in and sign as (decision 0067)."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiomqtt

from labctl.core.errors import InputError
from labctl.inventory.config import Secret
from labctl.inventory.schema import BrokerIdentitiesSpec, Inventory

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

CONTROLLER = "controller"
"""The controller's identity (an inventory host may not take this name where identities are per host)."""


def secret_env(identities: BrokerIdentitiesSpec, name: str) -> str:
    """The environment variable holding identity `name`'s secret: <secret_env>_<NAME>."""
    return f"{identities.secret_env}_{re.sub(r'[^A-Z0-9]', '_', name.upper())}"


def username(identities: BrokerIdentitiesSpec, name: str) -> str:
    """Identity `name`'s user on the broker: <prefix>-controller, <prefix>-agent-<host>."""
    return f"{identities.user_prefix}-{CONTROLLER if name == CONTROLLER else f'agent-{name}'}"


def derive(secret: Secret, purpose: str) -> Secret:
    """A key for one purpose from an identity's secret (HMAC-SHA256 of the purpose under the secret, hex):
    the broker only ever sees the MQTT password, from which neither the secret nor the message key follows."""
    value = hmac.new(secret.reveal().encode(), f"labctl/{purpose}".encode(), hashlib.sha256).hexdigest()
    return Secret(f"{secret.name}:{purpose}", value)


def resolve_identity(identities: BrokerIdentitiesSpec, name: str) -> Secret:
    """Identity `name`'s secret from its environment variable; one line naming both if it is not set."""
    env = secret_env(identities, name)
    value = os.environ.get(env)
    if not value:
        who = "the controller" if name == CONTROLLER else f"host {name}'s agent"
        raise InputError(f"environment variable {env} is not set (the broker secret of {who})")
    return Secret(env, value)


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
    identity: str = CONTROLLER
    """Who connects: `controller` or an agent's host name (the user it logs in as, the key it signs with)."""
    login: str | None = None
    """The broker user, in words for error lines (never the password)."""
    secret_name: str | None = None
    """Per-host identities: the environment variable this side's secret came from (for error lines)."""
    identities: BrokerIdentitiesSpec | None = None
    """Per-host identities: whose secrets make this side's login and keys (read from the environment when
    first needed: building a lab needs none of them, connecting does)."""
    hosts: tuple[str, ...] = ()
    """The hosts this side talks to: every one for the controller, its own for an agent."""

    @property
    def per_host(self) -> bool:
        return self.identities is not None

    def credentials(self) -> tuple[Secret | None, Secret | None]:
        """(user, password) to log in with; a secret not in the environment is one line."""
        if self.identities is None:
            return self.username, self.password
        mine = resolve_identity(self.identities, self.identity)
        return Secret("user", username(self.identities, self.identity)), derive(mine, "mqtt-password")

    clock_sync_interval_s: float = 0.5
    clock_samples: int = 8
    clock_exchange: str = "udp"  # "udp": pings straight to each agent (decision 0048); "broker": through it
    clock_udp_port: int = 0  # the agents' clock responder port (0: any free one, announced)
    feed_lead_ms: float = 50.0
    mirror_lag_ms: float = 50.0
    agent_grace_s: float = 5.0
    agent_return_s: float = 30.0

    def key_for(self, host: str) -> Secret | None:
        """The key that signs and checks the messages on `host`'s topics (both ways): the host's own with
        per-host identities, else the shared `auth_key` (None: unsigned)."""
        if self.identities is not None:
            if host not in self.hosts:
                return None
            return derive(resolve_identity(self.identities, host), "message-key")
        return self.auth_key

    @property
    def where(self) -> str:
        return f"MQTT broker {self.hostname}:{self.port}"

    @staticmethod
    def check_names(inventory: Inventory) -> None:
        """The lab and host names become MQTT topic levels: no wildcards, separators or spaces; with per-host
        identities, each host's secret variable and user are its own."""
        for loc, name in [(("lab",), inventory.lab), *((("hosts", h), h) for h in inventory.hosts)]:
            if not _NAME.match(name):
                raise inventory.fail(loc, f"{name!r} cannot be part of an MQTT topic (use [A-Za-z0-9_.-])")
        spec = inventory.model.broker
        if spec is None or spec.identities is None:
            return
        seen = {secret_env(spec.identities, CONTROLLER): CONTROLLER}
        for host in inventory.hosts:
            if host.lower() == CONTROLLER:
                raise inventory.fail(("hosts", host), f"{host!r} is the controller's broker identity")
            env = secret_env(spec.identities, host)
            if env in seen:
                raise inventory.fail(
                    ("hosts", host), f"its broker secret variable {env} is also that of {seen[env]}"
                )
            seen[env] = host

    @classmethod
    def from_inventory(
        cls, inventory: Inventory, url: str | None = None, identity: str = CONTROLLER
    ) -> BrokerSettings:
        """Settings for `identity` (the controller, or the agent of that host): its user and password, the
        keys it signs and checks with, its client certificate."""
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
        if identity != CONTROLLER and identity not in inventory.model.hosts:
            raise InputError(f"{identity!r} is not a host of {inventory.path}")
        ids = spec.identities if spec is not None else None
        user: Secret | None = None
        password: Secret | None = None
        if ids is None and spec is not None:
            user = spec.username.resolve(where) if spec.username else None
            password = spec.password.resolve(where) if spec.password else None

        def client_file(path: str | None) -> str | None:
            return path.replace("{identity}", identity) if path is not None else None

        return cls(
            lab=inventory.lab,
            hostname=parts.hostname,
            port=port or (8883 if tls else 1883),
            tls=tls,
            username=user,
            password=password,
            ca_file=spec.tls.ca_file if spec and spec.tls else None,
            cert_file=client_file(spec.tls.cert_file) if spec and spec.tls else None,
            key_file=client_file(spec.tls.key_file) if spec and spec.tls else None,
            auth_key=spec.auth_key.resolve(where) if spec and spec.auth_key else None,
            identity=identity,
            login=f"user {username(ids, identity)}"
            if ids is not None
            else (f"user {user.reveal()}" if user is not None else None),
            secret_name=secret_env(ids, identity) if ids is not None else None,
            identities=ids,
            # The controller talks to every host, with each one's key; an agent to itself.
            hosts=tuple(inventory.hosts) if identity == CONTROLLER else (identity,),
            clock_sync_interval_s=spec.clock_sync_interval_s if spec else 0.5,
            clock_samples=spec.clock_samples if spec else 8,
            clock_exchange=spec.clock_exchange if spec else "udp",
            clock_udp_port=spec.clock_udp_port if spec else 0,
            feed_lead_ms=spec.feed_lead_ms if spec else 50.0,
            mirror_lag_ms=spec.mirror_lag_ms if spec else 50.0,
            agent_grace_s=spec.agent_grace_s if spec else 5.0,
            agent_return_s=spec.agent_return_s if spec else 30.0,
        )

    def tls_context(self) -> ssl.SSLContext:
        """The broker's certificate checked against `ca_file` (else the system's CAs) and its host name;
        this identity's client certificate where there is one. A file that cannot be read is one line."""
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
            if self.cert_file is not None:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as e:
            files = ", ".join(f for f in (self.ca_file, self.cert_file, self.key_file) if f)
            raise InputError(f"broker TLS files ({files}): {e}") from None
        context.sslsocket_class = _ClosingSSLSocket
        return context

    def client(self, identifier: str, will: aiomqtt.Will | None = None) -> aiomqtt.Client:
        user, password = self.credentials()
        return aiomqtt.Client(
            self.hostname,
            self.port,
            username=user.reveal() if user else None,
            password=password.reveal() if password else None,
            identifier=identifier,
            will=will,
            clean_session=True,
            tls_context=self.tls_context() if self.tls else None,
            keepalive=5,
            timeout=5,
            # Small messages both ways (ping/pong, commands): Nagle + delayed ACK would add ~40 ms each.
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        )


class _ClosingSSLSocket(ssl.SSLSocket):
    """Closes itself when its handshake fails (paho drops such a socket without closing it)."""

    def do_handshake(self, block: bool = False) -> None:
        try:
            super().do_handshake(block)
        except BaseException:
            self.close()
            raise


# CONNACK codes that mean "you may not", not "not now": MQTT 3.1.1 4 and 5, MQTT 5 134, 135 and 138.
REFUSALS = frozenset({4, 5, 134, 135, 138})


def is_refusal(error: BaseException) -> bool:
    rc = getattr(error, "rc", None)
    return isinstance(error, aiomqtt.MqttCodeError) and int(getattr(rc, "value", rc) or 0) in REFUSALS


def tls_failure(error: BaseException) -> ssl.SSLError | None:
    """The TLS error under a failed connect (aiomqtt re-raises it as a bare MqttError), if that is what
    it was: a certificate the other side does not trust is not fixed by trying again."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def login_failure(settings: BrokerSettings, error: BaseException) -> str | None:
    """One line for a connect failure that retrying cannot fix (the broker refused this identity's login,
    or TLS failed either way), naming who connects and what to check; None for one that may pass (the
    broker not there yet, a connection reset)."""
    who = "the controller" if settings.identity == CONTROLLER else f"agent {settings.identity}"
    login = f" ({settings.login})" if settings.login else ""
    if is_refusal(error):
        rc = getattr(error, "rc", None)
        reason = str(rc).lower() if rc is not None else "refused"
        if settings.secret_name is not None:
            check = (
                f"check {settings.secret_name} against the broker's password file (`labctl lab "
                "broker-config`) and its ACL"
            )
        else:
            check = "check the inventory's broker username/password and the broker's ACL"
        return f"{settings.where} refused {who}{login}: {reason} ({check})"
    tls = tls_failure(error)
    if tls is not None and settings.tls:
        reason = getattr(tls, "reason", None) or str(tls)
        if isinstance(tls, ssl.SSLCertVerificationError):  # the broker's certificate, checked here
            reason = f"certificate verify failed: {tls.verify_message or reason}"
        files = [f"ca_file {settings.ca_file}" if settings.ca_file else "the system CAs"]
        if settings.cert_file:
            files.append(f"client certificate {settings.cert_file}")
        return f"{settings.where}: TLS with {who}{login} failed: {str(reason).lower()} ({', '.join(files)})"
    return None
