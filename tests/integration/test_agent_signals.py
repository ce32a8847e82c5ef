"""`labctl agent` exits cleanly on SIGTERM (or SIGINT) in every state of its connection: connecting to no
broker, connecting to a broker that does not answer, connected and idle, backing off after its broker went
away, probes running, and probes running while its broker goes away (decision 0068). A real agent process,
a real mosquitto started and stopped by the test.

The agent bounds its own stop: past labctl.agents.agent.STOP_BUDGET_S (+0.3 s) its watchdog ends it with a
non-zero status. So exit status 0 and a last line "stopped" say it stopped within its budget, by its own
clock; the seconds the test sees from outside include a busy machine's scheduling of two processes and are
not asserted (an outside 2.0 s limit failed at 2.71 s on a loaded run, issue 45)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from labctl.agents.broker import BrokerSettings
from labctl.agents.hub import AgentHub, RemoteProbe
from labctl.inventory.schema import load_inventory
from labctl.labs import agents as agents_lab
from labctl.probes.sampling import ProbeSettings
from tests.helpers.agents import broker_section, write_lab
from tests.mosquitto import Mosquitto

pytestmark = pytest.mark.xdist_group("agents")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


class AgentProcess:
    def __init__(self, inv: Path, log: Path, host: str = "h1") -> None:
        self.log = log
        argv = [sys.executable, "-m", "labctl.cli", "agent", "--host", host, "-i", str(inv)]
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(argv, stderr=out)

    async def wait_log(self, text: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.log.read_text(errors="replace"):
            assert self.proc.poll() is None, f"agent exited: {self.log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, (
                f"no {text!r} in the agent's log: {self.log.read_text()[-2000:]}"
            )
            await asyncio.sleep(0.05)

    async def signal_and_time(self, sig: int = signal.SIGTERM) -> tuple[float, int]:
        """Seconds from the signal to the process gone, and its exit status."""
        sent = time.monotonic()
        self.proc.send_signal(sig)
        code = await asyncio.to_thread(self.proc.wait, 10)
        return time.monotonic() - sent, code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def agents() -> Iterator[list[AgentProcess]]:
    started: list[AgentProcess] = []
    yield started
    for agent in started:
        agent.kill()


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[Mosquitto]:
    """A broker of this test alone: it is stopped, frozen and restarted."""
    (tmp_path / "broker").mkdir()
    broker = Mosquitto(tmp_path / "broker")
    broker.start()
    try:
        yield broker
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(broker.proc.pid, signal.SIGCONT)
        broker.stop()


@contextlib.asynccontextmanager
async def _probes_running(inv: Path) -> AsyncIterator[AgentHub]:
    """A controller that started h1's probes (as a run does), stopped afterwards without a stop request."""
    inventory = load_inventory(inv)
    hub = AgentHub(inventory, BrokerSettings.from_inventory(inventory))
    await hub.start()
    try:
        probe = RemoteProbe(hub, "h1", agents_lab.PROBES, ProbeSettings(), inventory.profile(), 1)
        await probe.__aenter__()
        await asyncio.sleep(0.5)  # sampling, publishing batches
        yield hub
    finally:
        await hub.stop()


async def _assert_stops(agent: AgentProcess, sig: int = signal.SIGTERM) -> None:
    _, code = await agent.signal_and_time(sig)
    log = agent.log.read_text(errors="replace")
    assert code == 0, f"exit status {code} (the watchdog, or an error): {log[-2000:]}"
    assert "stopped" in log.splitlines()[-1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_connecting_to_no_broker(tmp_path: Path, agents: list[AgentProcess], sig: int) -> None:
    inv, _ = write_lab(tmp_path, broker_section(f"mqtt://127.0.0.1:{_free_port()}"))
    agent = AgentProcess(inv, tmp_path / "agent.log")
    agents.append(agent)
    await agent.wait_log("broker connection lost")  # refused, backing off, trying again
    await _assert_stops(agent, sig)


async def test_connecting_to_a_broker_that_does_not_answer(
    tmp_path: Path, agents: list[AgentProcess]
) -> None:
    """TCP accepted, no CONNACK ever: the agent waits on it for up to its 5 s timeout."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        inv, _ = write_lab(tmp_path, broker_section(f"mqtt://127.0.0.1:{silent.getsockname()[1]}"))
        agent = AgentProcess(inv, tmp_path / "agent.log")
        agents.append(agent)
        await agent.wait_log('"agent h1: 2 ports')
        await asyncio.sleep(1.0)  # connected at TCP level, waiting for the CONNACK
        await _assert_stops(agent)
    finally:
        silent.close()


async def test_connected_and_idle(own_broker: Mosquitto, tmp_path: Path, agents: list[AgentProcess]) -> None:
    inv, _ = write_lab(tmp_path, broker_section(own_broker.url))
    agent = AgentProcess(inv, tmp_path / "agent.log")
    agents.append(agent)
    await agent.wait_log("connected to broker")
    await _assert_stops(agent)


async def test_backing_off_after_its_broker_went_away(
    own_broker: Mosquitto, tmp_path: Path, agents: list[AgentProcess]
) -> None:
    inv, _ = write_lab(tmp_path, broker_section(own_broker.url))
    agent = AgentProcess(inv, tmp_path / "agent.log")
    agents.append(agent)
    await agent.wait_log("connected to broker")
    own_broker.stop()
    await agent.wait_log("broker connection lost")
    await _assert_stops(agent)


async def test_probes_running(own_broker: Mosquitto, tmp_path: Path, agents: list[AgentProcess]) -> None:
    inv, _ = write_lab(tmp_path, broker_section(own_broker.url))
    agent = AgentProcess(inv, tmp_path / "agent.log")
    agents.append(agent)
    await agent.wait_log("connected to broker")
    async with _probes_running(inv):
        await agent.wait_log("probes started")
        await _assert_stops(agent)


async def _freeze(broker: Mosquitto) -> None:
    assert broker.proc is not None
    os.kill(broker.proc.pid, signal.SIGSTOP)  # there, but answering nothing: a broker host going away


async def _stop(broker: Mosquitto) -> None:
    await asyncio.to_thread(broker.stop)


@pytest.mark.parametrize("going", [_freeze, _stop], ids=["broker-frozen", "broker-stopping"])
async def test_probes_running_while_its_broker_goes_away(
    own_broker: Mosquitto,
    tmp_path: Path,
    agents: list[AgentProcess],
    going: Callable[[Mosquitto], Awaitable[None]],
) -> None:
    """The issue's case: the broker and its agents stopped together. The agent cannot get its last events
    acknowledged; it gives up on them within its stop budget instead of waiting on the broker."""
    inv, _ = write_lab(tmp_path, broker_section(own_broker.url))
    agent = AgentProcess(inv, tmp_path / "agent.log")
    agents.append(agent)
    await agent.wait_log("connected to broker")
    async with _probes_running(inv):
        await agent.wait_log("probes started")
        stopping = asyncio.create_task(going(own_broker))
        await asyncio.sleep(0)
        await _assert_stops(agent)
        await stopping
