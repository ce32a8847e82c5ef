"""Per-host identities on a real mosquitto (decision 0067): the configuration `labctl lab broker-config`
writes (password file, ACL), what the broker refuses to one agent's credentials, the main experiment through
four agents over TLS with their own users, keys and client certificates, and a wrong secret or certificate
as one line naming the host."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from labctl.agents.broker import CONTROLLER, BrokerSettings, derive, resolve_identity
from labctl.agents.brokerconf import acl_text
from labctl.agents.hub import AgentHub
from labctl.agents.wire import topic, world_topic
from labctl.core.errors import HardwareError
from labctl.inventory.schema import load_inventory
from labctl.run.lifecycle import run_experiment
from tests.conftest import require
from tests.helpers.agents import MIRROR_LAG_MS, write_lab
from tests.mosquitto import Mosquitto, configured_mosquitto, make_certs

pytestmark = pytest.mark.xdist_group("agents")

HOSTS = ("h1", "h2", "h3", "h4")
REPO = Path(__file__).resolve().parents[2]
SECRETS = {name: f"s3cret-of-{name}-{os.getpid()}" for name in (CONTROLLER, *HOSTS)}
ENV = {f"LABCTL_TEST_MQTT_{name.upper()}": value for name, value in SECRETS.items()}


@pytest.fixture(autouse=True)
def _mosquitto_installed() -> None:
    require(shutil.which("mosquitto") is not None, "mosquitto is not installed (apt-get install mosquitto)")


@pytest.fixture
def secrets_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The controller's environment: every identity's secret (an agent gets only its own)."""
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    return ENV


def _identities(url: str, tls: str = "") -> str:
    return (
        f"kind: agents\nbroker:\n  url: {url}\n  clock_sync_interval_s: 0.5\n"
        f"  mirror_lag_ms: {MIRROR_LAG_MS}\n"
        f"  identities: {{secret_env: LABCTL_TEST_MQTT}}\n{tls}"
    )


def _broker_config(inv: Path, out: Path, port: int, *tls_args: str) -> Path:
    """`labctl lab broker-config`, as an operator runs it (the secrets in its environment)."""
    argv = [sys.executable, "-m", "labctl.cli", "lab", "broker-config", "-i", str(inv), "--out", str(out)]
    argv += ["--listen", f"127.0.0.1:{port}", *tls_args]
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **ENV}, timeout=60)
    assert done.returncode == 0, done.stderr
    conf = out / "mosquitto.conf"
    # Root's test directories are closed to the `mosquitto` user it would drop to before reading the files.
    conf.write_text(conf.read_text() + "persistence false\nlog_dest stderr\nuser root\n")
    return conf


@pytest.fixture
def closed_broker(tmp_path: Path, secrets_env: dict[str, str]) -> Iterator[tuple[Mosquitto, Path]]:
    """mosquitto on the generated configuration (no TLS), and the lab's inventory."""
    broker = configured_mosquitto(tmp_path / "m", tmp_path / "m.conf")
    inv, _ = write_lab(tmp_path, _identities(broker.url))
    broker.conf = _broker_config(inv, tmp_path / "broker", broker.port)
    broker.start()
    try:
        yield broker, inv
    finally:
        broker.stop()


def test_broker_config_writes_hashes_and_an_acl_per_identity(
    closed_broker: tuple[Mosquitto, Path], tmp_path: Path
) -> None:
    broker, inv = closed_broker
    out = tmp_path / "broker"
    inventory = load_inventory(inv)
    lab = inventory.lab
    acl = (out / "acl").read_text()
    assert acl == acl_text(inventory, inventory.model.broker.identities)  # type: ignore[union-attr]
    assert f"user labctl-agent-h1\ntopic write labctl/{lab}/h1/events\n" in acl
    assert f"topic read labctl/{lab}/h1/cmd\n" in acl and f"topic write labctl/{lab}/+/cmd\n" in acl
    assert (out / "passwd").stat().st_mode & 0o777 == 0o600
    lines = dict(line.split(":", 1) for line in (out / "passwd").read_text().splitlines())
    assert set(lines) == {"labctl-controller", *(f"labctl-agent-{h}" for h in HOSTS)}
    # mosquitto's PBKDF2-SHA512 format, of the password derived from each identity's secret
    _, seven, rounds, salt, digest = lines["labctl-agent-h2"].split("$")
    ids = inventory.model.broker.identities  # type: ignore[union-attr]
    password = derive(resolve_identity(ids, "h2"), "mqtt-password").reveal()
    assert seven == "7"
    assert base64.b64decode(digest) == hashlib.pbkdf2_hmac(
        "sha512", password.encode(), base64.b64decode(salt), int(rounds)
    )
    conf = (out / "mosquitto.conf").read_text()
    assert "allow_anonymous false" in conf and f"listener {broker.port} 127.0.0.1" in conf
    for path in out.iterdir():  # no secret, and no derived password, in any file written
        text = path.read_text()
        assert not any(value in text for value in SECRETS.values()), path
        assert password not in text, path


class RawClient:
    """paho over MQTT 5 with one identity's credentials: the broker's answer to each publish (its PUBACK
    reason code) and to each subscription."""

    def __init__(self, broker: Mosquitto, inv: Path, identity: str) -> None:
        settings = BrokerSettings.from_inventory(load_inventory(inv), identity=identity)
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2, client_id=f"raw-{identity}-{os.getpid()}", protocol=paho.MQTTv5
        )
        user, password = settings.credentials()
        assert user is not None and password is not None
        self.client.username_pw_set(user.reveal(), password.reveal())
        self.acks: dict[int, ReasonCode] = {}
        self.subacks: dict[int, list[ReasonCode]] = {}
        self.received: list[str] = []
        self._cond = threading.Condition()
        self.client.on_publish = self._on_publish
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = lambda _c, _u, m: self.received.append(m.topic)
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()

    def _on_publish(self, _c: object, _u: object, mid: int, rc: ReasonCode, _p: Properties) -> None:
        with self._cond:
            self.acks[mid] = rc
            self._cond.notify_all()

    def _on_subscribe(self, _c: object, _u: object, mid: int, rcs: list[ReasonCode], _p: object) -> None:
        with self._cond:
            self.subacks[mid] = rcs
            self._cond.notify_all()

    def publish(self, name: str) -> int:
        """The broker's PUBACK reason code for a QoS 1 publish (0: accepted, 0x87: not authorized)."""
        info = self.client.publish(name, b"x", qos=1)
        with self._cond:
            assert self._cond.wait_for(lambda: info.mid in self.acks, 5), f"no PUBACK for {name}"
            return self.acks[info.mid].value

    def subscribe(self, name: str) -> int:
        _, mid = self.client.subscribe(name, qos=1)
        assert mid is not None
        with self._cond:
            assert self._cond.wait_for(lambda: mid in self.subacks, 5), f"no SUBACK for {name}"
            return self.subacks[mid][0].value

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


NOT_AUTHORIZED = 0x87


def _wait_for(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_an_agents_credentials_cannot_publish_as_another_host_or_the_controller(
    closed_broker: tuple[Mosquitto, Path],
) -> None:
    broker, inv = closed_broker
    lab = load_inventory(inv).lab
    h1 = RawClient(broker, inv, "h1")
    controller = RawClient(broker, inv, CONTROLLER)
    try:
        for leaf in ("events", "reply", "status"):
            assert controller.subscribe(topic(lab, "+", leaf)) == 1  # granted QoS 1
        # h1 publishing as h2, or as the controller (commands to h1 or h2, the world feed): refused.
        for name in (
            topic(lab, "h2", "events"),
            topic(lab, "h2", "reply"),
            topic(lab, "h2", "status"),
            topic(lab, "h2", "cmd"),
            topic(lab, "h1", "cmd"),
            world_topic(lab),
        ):
            assert h1.publish(name) == NOT_AUTHORIZED, name
        # Its own topics: accepted, and the controller receives them (and only them).
        assert h1.publish(topic(lab, "h1", "events")) == 0
        # Reading another host's commands, or every host's events: mosquitto 2.0 grants the subscription
        # but delivers only what the ACL lets h1 read: its own commands.
        for name in (topic(lab, "h2", "cmd"), topic(lab, "h1", "cmd"), topic(lab, "+", "events")):
            h1.subscribe(name)
        assert controller.publish(topic(lab, "h2", "cmd")) == 0
        assert controller.publish(topic(lab, "h1", "cmd")) == 0
        _wait_for(lambda: topic(lab, "h1", "events") in controller.received)
        _wait_for(lambda: topic(lab, "h1", "cmd") in h1.received)
        time.sleep(0.2)  # anything else in flight would show up now
        assert controller.received == [topic(lab, "h1", "events")]
        assert h1.received == [topic(lab, "h1", "cmd")]
        # The controller cannot pose as an agent either.
        assert controller.publish(topic(lab, "h1", "events")) == NOT_AUTHORIZED
    finally:
        h1.close()
        controller.close()


# -- TLS -------------------------------------------------------------------------------------------------------
def _agent_env(host: str, **override: str) -> dict[str, str]:
    """An agent host's environment: its own secret only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABCTL_TEST_MQTT_")}
    env[f"LABCTL_TEST_MQTT_{host.upper()}"] = SECRETS[host]
    return {**env, **override}


def _spawn_agent(inv: Path, host: str, log: Path, **env: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "labctl.cli", "agent", "--host", host, "-i", str(inv)]
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stderr=out, env=_agent_env(host, **env), cwd=REPO)


@pytest.fixture
def agent_procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture
def tls_broker(
    tmp_path: Path, secrets_env: dict[str, str]
) -> Iterator[tuple[Mosquitto, Path, dict[str, Path]]]:
    """mosquitto with a TLS listener (certificates made now), client certificates required, per-host users;
    the lab's inventory presents each identity's own certificate."""
    certs = make_certs(tmp_path / "pki", clients=(CONTROLLER, *HOSTS))
    broker = configured_mosquitto(tmp_path / "m", tmp_path / "m.conf")
    tls = (
        f"  tls:\n    ca_file: {certs['ca']}\n    cert_file: {certs['ca'].parent}/{{identity}}.pem\n"
        f"    key_file: {certs['ca'].parent}/{{identity}}.key\n"
    )
    inv, _ = write_lab(tmp_path, _identities(f"mqtts://127.0.0.1:{broker.port}", tls))
    tls_args = ("--tls-cert", str(certs["server"]), "--tls-key", str(certs["server.key"]))
    tls_args += ("--tls-ca", str(certs["ca"]), "--require-client-cert")
    broker.conf = _broker_config(inv, tmp_path / "broker", broker.port, *tls_args)
    broker.start()
    try:
        yield broker, inv, certs
    finally:
        broker.stop()


@pytest.mark.slow
async def test_the_main_experiment_runs_through_agents_with_their_own_identities_over_tls(
    tls_broker: tuple[Mosquitto, Path, dict[str, Path]],
    tmp_path: Path,
    agent_procs: list[subprocess.Popen[bytes]],
) -> None:
    broker, inv, _ = tls_broker
    for host in HOSTS:
        agent_procs.append(_spawn_agent(inv, host, tmp_path / f"agent-{host}.log"))
    outcome = await run_experiment(
        REPO / "experiments" / "reconfig-timeline.yaml",
        inv,
        profile="fast",
        out_dir=tmp_path / "runs",
        plots=False,
        seed=1,
    )
    logs = {h: (tmp_path / f"agent-{h}.log").read_text() for h in HOSTS}
    assert outcome.status == "completed", (outcome.error, logs)
    meta = json.loads((outcome.run_dir / "run.json").read_text())
    agents = meta["agents"]
    assert agents["identities"] == "per-host"
    assert agents["broker"] == f"127.0.0.1:{broker.port}"
    streams = agents["streams"]
    assert set(streams) == set(HOSTS)
    assert all(s["events"] > 0 and s["missing_events"] == 0 for s in streams.values()), streams
    rejected = agents["rejected"]
    assert (
        rejected["malformed"] == rejected["unauthorised"] == rejected["replayed"] == rejected["forged"] == 0
    )
    assert set(agents["agent_rejected"]) == set(HOSTS)
    assert all(
        r["unauthorised"] == r["forged"] == r["replayed"] == 0 for r in agents["agent_rejected"].values()
    )
    assert all(p.poll() is None for p in agent_procs), logs
    # No secret reaches the run directory or an agent's log.
    written = "".join(p.read_text(errors="replace") for p in outcome.run_dir.rglob("*") if p.is_file())
    for value in SECRETS.values():
        assert value not in written and not any(value in log for log in logs.values())


async def test_a_wrong_secret_or_certificate_is_one_line_naming_the_host(
    tls_broker: tuple[Mosquitto, Path, dict[str, Path]],
    tmp_path: Path,
    agent_procs: list[subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broker, inv, certs = tls_broker
    where = f"MQTT broker 127.0.0.1:{broker.port}"
    other_ca = make_certs(tmp_path / "other-pki", ca_name="another CA")["ca"]
    wrong_ca_inv = tmp_path / "wrong-ca.yaml"
    wrong_ca_inv.write_text(inv.read_text().replace(str(certs["ca"]), str(other_ca)))
    # Agents: h1 with a secret the broker does not know, h2 trusting another CA.
    wrong_secret = _spawn_agent(inv, "h1", tmp_path / "h1.log", LABCTL_TEST_MQTT_H1="not-the-secret")
    wrong_ca = _spawn_agent(wrong_ca_inv, "h2", tmp_path / "h2.log")
    agent_procs += [wrong_secret, wrong_ca]
    for proc in (wrong_secret, wrong_ca):
        assert await asyncio.to_thread(proc.wait, 30) == 1
    h1_lines = (tmp_path / "h1.log").read_text().strip().splitlines()
    h2_lines = (tmp_path / "h2.log").read_text().strip().splitlines()
    assert h1_lines[-1] == (
        f"error: {where} refused agent h1 (user labctl-agent-h1): not authorized (check LABCTL_TEST_MQTT_H1 "
        "against the broker's password file (`labctl lab broker-config`) and its ACL)"
    ), h1_lines
    assert h2_lines[-1].startswith(f"error: {where}: TLS with agent h2 (user labctl-agent-h2) failed: ")
    assert "certificate verify failed" in h2_lines[-1] and str(other_ca) in h2_lines[-1], h2_lines
    assert "Traceback" not in "".join(h1_lines + h2_lines)

    # The controller: a wrong secret of its own, a CA it does not trust.
    monkeypatch.setenv("LABCTL_TEST_MQTT_CONTROLLER", "not-the-secret")
    hub = AgentHub(load_inventory(inv), BrokerSettings.from_inventory(load_inventory(inv)))
    with pytest.raises(HardwareError) as refused:
        await hub.start(timeout_s=10)
    assert str(refused.value) == (
        f"{where} refused the controller (user labctl-controller): not authorized (check "
        "LABCTL_TEST_MQTT_CONTROLLER against the broker's password file (`labctl lab broker-config`) and its ACL)"
    )
    monkeypatch.setenv("LABCTL_TEST_MQTT_CONTROLLER", SECRETS[CONTROLLER])
    untrusting = load_inventory(wrong_ca_inv)
    hub = AgentHub(untrusting, BrokerSettings.from_inventory(untrusting))
    started = time.monotonic()
    with pytest.raises(HardwareError) as tls_failed:
        await hub.start(timeout_s=10)
    assert time.monotonic() - started < 8  # a certificate is final: no waiting out the connect deadline
    assert str(tls_failed.value).startswith(
        f"{where}: TLS with the controller (user labctl-controller) failed"
    )

    # The controller holding another secret for h3 than h3's agent: h3's messages fail its signature check.
    agent_procs.append(_spawn_agent(inv, "h3", tmp_path / "h3.log"))
    monkeypatch.setenv("LABCTL_TEST_MQTT_H3", "not-h3s-secret")
    lab = load_inventory(inv)
    hub = AgentHub(lab, BrokerSettings.from_inventory(lab))
    await hub.start()
    try:
        with pytest.raises(HardwareError) as mismatch:
            await hub.wait_online("h3", timeout_s=15)
    finally:
        await hub.stop()
    assert str(mismatch.value).startswith("agent h3: ") and str(mismatch.value).endswith(
        "failed the signature check: LABCTL_TEST_MQTT_H3 differs between this controller and the agent on h3"
    )
