"""Agents over MQTT: events/s through mosquitto with four agent processes, end-to-end event latency, and the
clock-offset estimate's error on loopback (true offset zero). Peer: the one-process path (EventQueue →
EventLog.record) measured in the same run.

    python3 bench/mqtt.py [--seconds 3]

Starts its own mosquitto on 127.0.0.1 (free port, temporary config) and stops it. Prints figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from labctl.agents.agent import BATCH_GAP_NS, Agent
from labctl.agents.broker import BrokerSettings
from labctl.agents.hub import AgentHub
from labctl.core.clock import Timebase, now_ns
from labctl.core.events import Event, EventLog, EventQueue
from labctl.inventory.schema import load_inventory

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _table import record

HOSTS = ("h1", "h2", "h3", "h4")
REPO = Path(__file__).resolve().parent.parent


def pct(values: list[int], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class BenchSource:
    """A probe stand-in: the events this bench makes go through the agent's own pump, so they are batched
    and sent exactly as a probe's are (appending to the outbox alone would wait for the next flush)."""

    dropped = 0

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Event] = asyncio.Queue()

    async def events(self) -> AsyncIterator[Event]:
        while True:
            yield await self.queue.get()


async def agent_main(inv: Path, host: str) -> None:
    """Child process: one agent; on `flood S` / `paced S RATE` lines from stdin, feed its real batching and
    publishing path with events stamped at creation, then print `done`."""
    inventory = load_inventory(inv)
    agent = Agent(inventory, host, BrokerSettings.from_inventory(inventory))
    task = asyncio.create_task(agent.run())
    source_events = BenchSource()
    pump = asyncio.create_task(agent._pump(source_events))  # type: ignore[arg-type]  # the agent's own path
    source = agent.ports[0].source
    try:
        while True:
            line = await asyncio.to_thread(sys.stdin.readline)
            if not line:
                return
            cmd, *args = line.split()
            seconds = float(args[0])
            rate = float(args[1]) if cmd == "paced" else 0.0
            end = now_ns() + int(seconds * 1e9)
            sent = 0
            start = now_ns()
            while now_ns() < end:
                if rate:
                    due = int((now_ns() - start) * rate / 1e9) - sent
                    for _ in range(max(0, due)):
                        source_events.queue.put_nowait(
                            Event(t_ns=now_ns(), source=source, kind="rx_power", value=-2.5)
                        )
                    sent += max(0, due)
                    await asyncio.sleep(0.0005)
                else:
                    for _ in range(200):
                        source_events.queue.put_nowait(
                            Event(t_ns=now_ns(), source=source, kind="rx_power", value=-2.5)
                        )
                    await asyncio.sleep(0)
            while not source_events.queue.empty():  # noqa: ASYNC110  # the agent's pump takes them; no hook
                await asyncio.sleep(0.001)
            await agent.flush()
            print("done", flush=True)
    finally:
        pump.cancel()
        task.cancel()
        await asyncio.gather(pump, task, return_exceptions=True)


def spawn(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )


def one_process_rate(n: int = 400_000) -> float:
    """The peer: events through an EventQueue into an EventLog (no file), per second."""
    log = EventLog(None, Timebase.capture())
    q = EventQueue(n + 1)
    t = time.perf_counter()
    for _ in range(n):
        q.put(Event(t_ns=now_ns(), source="nic:h1/p0", kind="rx_power", value=-2.5))
    while len(q):
        log.record(q._items.popleft())
    return n / (time.perf_counter() - t)


async def main(seconds: float) -> None:
    if shutil.which("mosquitto") is None:
        sys.exit("bench/mqtt.py needs mosquitto (apt-get install mosquitto)")
    work = Path(tempfile.mkdtemp(prefix="labctl-bench-mqtt-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = work / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nset_tcp_nodelay true\n"
        "max_queued_messages 100000\n"
    )
    broker = spawn(["mosquitto", "-c", str(conf)])
    inv_text = (
        REPO / "inventory.yaml"
    ).read_text() + f"\nkind: agents\nbroker:\n  url: mqtt://127.0.0.1:{port}\n"
    inv = work / "inventory.yaml"
    inv.write_text(inv_text)
    agents: list[subprocess.Popen[str]] = []
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            await asyncio.sleep(0.05)
        inventory = load_inventory(inv)
        hub = AgentHub(inventory, BrokerSettings.from_inventory(inventory))
        await hub.start()
        for host in HOSTS:
            agents.append(spawn([sys.executable, __file__, "--agent", host, "--inventory", str(inv)]))
        for host in HOSTS:
            await hub.wait_online(host, 60)
            hub.links[host].started = True

        def delivered() -> int:
            return sum(link.delivered for link in hub.links.values())

        async def phase(line: str) -> float:
            """Run one phase on every agent; returns seconds until the controller got its last event."""
            t = time.perf_counter()
            for p in agents:
                assert p.stdin is not None
                p.stdin.write(line + "\n")
                p.stdin.flush()
            for p in agents:
                assert p.stdout is not None
                await asyncio.to_thread(p.stdout.readline)
            last, last_t = delivered(), time.perf_counter()
            while time.perf_counter() - last_t < 0.5:  # drain what the broker still holds
                await asyncio.sleep(0.05)
                if delivered() != last:
                    last, last_t = delivered(), time.perf_counter()
            return last_t - t

        # 1. Clock offset on loopback: the truth is 0.
        errors, uncert = [], []
        for _ in range(10):
            for host in HOSTS:
                est = await hub.measure(host, 16)
                errors.append(abs(est.offset_ns))
                uncert.append(est.uncertainty_ns)
        # 2. Throughput: every agent floods its real batch/publish path.
        before = delivered()
        elapsed = await phase(f"flood {seconds}")
        flooded = delivered() - before
        lost = sum(link.missing_events for link in hub.links.values())
        # 3. Latency at a moderate rate (1000 events/s per agent): stamp at creation → controller receipt.
        for link in hub.links.values():
            link.latency_ns.clear()
            link.record_latency = True
        await phase(f"paced {seconds} 1000")
        lat = [v for link in hub.links.values() for v in link.latency_ns]
        await hub.stop()
        peer = one_process_rate()
        rate = flooded / elapsed
        print(f"mosquitto 127.0.0.1, four agent processes, {seconds:g} s per phase")
        print(f"throughput: {rate:,.0f} events/s delivered to the controller ({lost} events counted lost)")
        print(
            f"peer (one process, EventQueue -> EventLog.record): {peer:,.0f} events/s; ratio mqtt/peer {rate / peer:.3f}"
        )
        print(
            f"end-to-end latency at 4 x 1000 events/s ({len(lat)} events): median {statistics.median(lat) / 1e3:.0f} µs, "
            f"p99 {pct(lat, 0.99) / 1e3:.0f} µs  (includes the agent's {BATCH_GAP_NS / 1e6:g} ms batching interval)"
        )
        print(
            f"clock offset error on loopback ({len(errors)} estimates of 16 pings): median {statistics.median(errors) / 1e3:.1f} µs, "
            f"p99 {pct(errors, 0.99) / 1e3:.1f} µs, max {max(errors) / 1e3:.1f} µs; "
            f"stated uncertainty median {statistics.median(uncert) / 1e3:.1f} µs"
        )
        record(
            "mqtt",
            "events/s through mosquitto, 4 agent processes",
            rate,
            "events/s",
            peer="one process, EventQueue -> EventLog.record",
            peer_value=peer,
        )
        record(
            "mqtt", "end-to-end event latency median, 4 x 1000 events/s", statistics.median(lat) / 1e3, "µs"
        )
        record("mqtt", "clock offset error median, loopback", statistics.median(errors) / 1e3, "µs")
    finally:
        for p in agents:
            if p.stdin:
                p.stdin.close()
        for p in agents:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        broker.terminate()
        broker.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--agent")
    ap.add_argument("--inventory")
    a = ap.parse_args()
    if a.agent:
        asyncio.run(agent_main(Path(a.inventory), a.agent))
    else:
        asyncio.run(main(a.seconds))
