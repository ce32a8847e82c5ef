"""RDMA recovery on the emulated fabric: the RC transport (labctl.rdma.rc over UDP, the rc-traffic probe)
against the model's expectation, its highest sustained ping-pong rate against our UDP ping-pong, and, on a
host with an RDMA device, pyverbs beside perftest (skipped here: no device).

One circuit (two NIC ports patched through the tc OCS). Part 1: for timeout in {10, 12, 14, 16}, the
fiber ends go dark for 30-70 ms (drawn per gap) and come back, 10 times: link up → first completed SEND,
against the model: the SEND outstanding at the cut is retried once per local ACK timeout (4.096 us x
2^timeout) from its post, so it completes ceil(dark / period) periods after the cut; when that is past
retry_cnt periods (timeout 10: 29.4 ms) the QP errors (IBV_WC_RETRY_EXC_ERR) and, under
`reconnect`, is reset (those gaps are counted, not compared). Part 2: both directions pinging at
shrinking intervals for 1.5 s each; completions/s and RTT median, RC vs UDP. Part 3, on a host with an
RDMA device: the verbs-rc probe's SEND/RECV ping-pong between two QPs on one port (loopback through the
NIC), one direction, beside perftest's `ib_send_lat` and `ib_write_lat` on the same device; one-way latency
(round trip / 2) as perftest reports it: t_typical (median) and the 99th percentile. Without pyverbs, a
device or perftest, each part says so in one line.
Run as root: python bench/rdma.py (part 3 alone, no root needed: python bench/rdma.py --verbs-only)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

from labctl.core.clock import now_ns
from labctl.core.events import Event, Kind
from labctl.emulators.fabric import FabricLayout, KernelFabric
from labctl.inventory.schema import RdmaPortSpec, load_inventory
from labctl.linux import netns
from labctl.probes.rdma import RcTrafficProbe
from labctl.probes.sampling import QueueProbe, RdmaSettings
from labctl.probes.traffic import TrafficEndpoint, UdpTrafficProbe
from labctl.probes.verbs_rc import VerbsRcProbe
from labctl.rdma import compat
from labctl.rdma.exchange import LocalExchange
from labctl.rdma.perftest import latency_report, run_latency_tool
from labctl.rdma.rc import QpAttrs
from labctl.rdma.verbs import VerbsQpFactory

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _table import record

PREFIX = f"lb{os.getpid()}-r-"
INVENTORY = textwrap.dedent(
    """
    lab: bench-rdma
    kind: kernel
    switches: {ocs1: {driver: sim, size: 4x4}}
    hosts:
      h1: {nics: [{ifname: eth0, rail: 0, switch: ocs1, tx: 1, rx: 5, address: 10.9.1.1/24}]}
      h2: {nics: [{ifname: eth0, rail: 0, switch: ocs1, tx: 2, rx: 6, address: 10.9.1.2/24}]}
    """
)
DARK_MS = (30.0, 70.0)  # drawn per gap (a fixed one would lock onto the retry phase)
CUTS = 10


async def _collect(probe: QueueProbe, out: list[Event]) -> None:
    async for e in probe.events():
        out.append(e)


async def recovery(fabric: KernelFabric, endpoints: list[TrafficEndpoint], exponent: int) -> dict[str, float]:
    """Dark gaps of random length; per gap the model's expectation: the SEND outstanding when the light
    went is retried every period from its post, so the first retry after the link is back comes
    ceil(dark / period) periods after it (while that is within retry_cnt periods)."""
    settings = RdmaSettings(timeout=exponent, retry_cnt=7, policy="reconnect")
    probe = RcTrafficProbe(endpoints, interval_us=200, settings=settings)
    period = 4096 << exponent
    a, b = endpoints
    events: list[Event] = []
    rt = fabric._control()
    gaps: list[tuple[int, int]] = []  # (link back, expected first completion)
    rng = random.Random(exponent)
    async with probe:
        task = asyncio.create_task(_collect(probe, events))
        probe.set_circuits({a.source: b.source, b.source: a.source})
        await asyncio.sleep(0.2)
        for _ in range(CUTS):
            dark_ns = round(rng.uniform(*DARK_MS) * 1e6)
            t_cut = now_ns()
            for fp in fabric.layout.ports:
                rt.set_up(fp.index, False)
            await asyncio.sleep(dark_ns / 1e9)
            t_up = now_ns()
            for fp in fabric.layout.ports:
                rt.set_up(fp.index, True)
            tries = -(-(t_up - t_cut) // period)  # the first retry at or after the link is back
            if tries <= settings.retry_cnt:  # tries go out at 0..retry_cnt periods; then RETRY_EXC
                gaps.append((t_up, t_cut + tries * period))
            await asyncio.sleep(max(0.1, 2.5 * period / 1e9))
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    ok = sorted(e.t_ns for e in events if e.kind == Kind.TRAFFIC_OK and e.source == a.source)
    delays, expected, errors_ns = [], [], []
    for t_up, t_expected in gaps:
        first = next((t for t in ok if t >= t_up), None)
        if first is not None:
            delays.append(first - t_up)
            expected.append(t_expected - t_up)
            errors_ns.append(abs(first - t_expected))
    return {
        "period_ms": period / 1e6,
        "expected_ms": float(np.median(expected)) / 1e6 if expected else float("nan"),
        "median_ms": float(np.median(delays)) / 1e6 if delays else float("nan"),
        "err_max_ms": max(errors_ns) / 1e6 if errors_ns else float("nan"),
        "within_budget": len(gaps),
        "recovered": len(delays),
        "retry_exc": sum(
            1 for e in events if e.kind == Kind.RDMA_WC_ERROR and e.value == "IBV_WC_RETRY_EXC_ERR"
        ),
        "reconnects": sum(1 for e in events if e.kind == Kind.RDMA_RECONNECT),
    }


async def rate(
    endpoints: list[TrafficEndpoint], kind: str, interval_us: int, seconds: float
) -> dict[str, float]:
    probe: RcTrafficProbe | UdpTrafficProbe
    if kind == "rc":
        probe = RcTrafficProbe(endpoints, interval_us=interval_us)
    else:
        probe = UdpTrafficProbe(endpoints, interval_us=interval_us, timeout_us=max(2 * interval_us, 2000))
    a, b = endpoints
    events: list[Event] = []
    async with probe:
        task = asyncio.create_task(_collect(probe, events))
        probe.set_circuits({a.source: b.source, b.source: a.source})
        await asyncio.sleep(0.2)
        before = probe.completions if isinstance(probe, RcTrafficProbe) else probe.pongs
        t0 = now_ns()
        await asyncio.sleep(seconds)
        elapsed = (now_ns() - t0) / 1e9
        after = probe.completions if isinstance(probe, RcTrafficProbe) else probe.pongs
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    rtts = [int(e.value) for e in events if e.kind == Kind.TRAFFIC_OK and isinstance(e.value, int)]
    return {
        "per_s": (after - before) / elapsed,
        "rtt_us": float(np.median(rtts)) / 1e3 if rtts else float("nan"),
    }


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "inv.yaml"
        path.write_text(INVENTORY)
        inv = load_inventory(path)
    layout = FabricLayout.of(inv, PREFIX)
    fabric = KernelFabric(layout, inv.profile("fast"), random.Random(0), lambda e: None)
    await asyncio.to_thread(fabric.create)
    try:
        fabric.open()
        rt = fabric._control()
        p1, p2 = layout.ports
        rt.add_redirect(p1.index, p2.index, 1)
        rt.add_redirect(p2.index, p1.index, 1)
        for fp in layout.ports:
            rt.set_up(fp.index, True)
        endpoints = [
            TrafficEndpoint(fp.port.source, fp.ip, fp.port.ifname, fp.host_netns, fp.port.host)
            for fp in layout.ports
        ]
        print(
            f"1. link back -> first completed SEND ({CUTS} dark gaps of {DARK_MS[0]:.0f}-{DARK_MS[1]:.0f} ms; retry 7)"
        )
        print(
            "timeout  period     model median  measured median  |measured-model| max  in budget  RETRY_EXC  reconnects"
        )
        errors_ms: list[float] = []
        for exponent in (10, 12, 14, 16):
            r = await recovery(fabric, endpoints, exponent)
            if r["err_max_ms"] == r["err_max_ms"]:  # not NaN: some gap was compared
                errors_ms.append(r["err_max_ms"])
            print(
                f"{exponent:>7}  {r['period_ms']:7.2f} ms  {r['expected_ms']:9.2f} ms  {r['median_ms']:12.2f} ms  "
                f"{r['err_max_ms']:15.2f} ms  {r['within_budget']:>5}/{CUTS}  {r['retry_exc']:>9}  {r['reconnects']:>10}"
            )
            if exponent == 16:
                record(
                    "rdma",
                    "link back -> first SEND median, timeout 16",
                    r["median_ms"],
                    "ms",
                    peer="the model's expectation",
                    peer_value=r["expected_ms"],
                )
        record(
            "rdma",
            "link back -> first SEND, worst |measured - model|, timeouts 10-16",
            max(errors_ms, default=float("nan")),
            "ms",
        )
        print(
            "\n2. sustained ping-pong, both directions, 1.5 s per interval: RC over UDP vs plain UDP ping-pong"
        )
        print("interval   RC completions/s  RC RTT med   UDP pongs/s  UDP RTT med   RC/UDP")
        for interval_us in (1000, 200, 50, 20):
            rc = await rate(endpoints, "rc", interval_us, 1.5)
            udp = await rate(endpoints, "udp", interval_us, 1.5)
            print(
                f"{interval_us:>6} us  {rc['per_s']:>14.0f}  {rc['rtt_us']:8.1f} us  {udp['per_s']:>11.0f}  "
                f"{udp['rtt_us']:8.1f} us  {rc['per_s'] / max(udp['per_s'], 1):6.2f}"
            )
            if interval_us == 20:
                record(
                    "rdma",
                    "RC completions/s at 20 us, both directions",
                    rc["per_s"],
                    "completions/s",
                    peer="plain UDP ping-pong",
                    peer_value=udp["per_s"],
                )
            if interval_us == 1000:
                record(
                    "rdma",
                    "RC RTT median at 1000 us",
                    rc["rtt_us"],
                    "us",
                    peer="plain UDP ping-pong",
                    peer_value=udp["rtt_us"],
                )
        fabric.close()
    finally:
        await asyncio.to_thread(fabric.destroy)
        netns.cleanup(PREFIX)


async def probe_latency(device: str, gid_index: int, iterations: int) -> list[int]:
    """The verbs-rc probe's round trips: QPs A → B on one device port, A pinging back to back."""
    spec = RdmaPortSpec(device=device, port=1, gid_index=gid_index)
    a = TrafficEndpoint("bench/a", "127.0.0.1", "lo", None, "bench")
    b = TrafficEndpoint("bench/b", "127.0.0.1", "lo", None, "bench")
    settings = RdmaSettings()
    attrs = QpAttrs(timeout=settings.timeout, retry_cnt=settings.retry_cnt)
    probe = VerbsRcProbe(
        [a, b],
        qps=VerbsQpFactory({a.source: spec, b.source: spec}, attrs),
        exchange=LocalExchange([a.source, b.source]),
        interval_us=0,  # the next PING as soon as the last was answered, as perftest does
        timeout_us=1_000_000,
        settings=settings,
        poll_idle_us=0,  # busy poll (still yielding the GIL each round)
        keep_round_trips=iterations,
    )
    events: list[Event] = []
    async with probe:
        task = asyncio.create_task(_collect(probe, events))
        probe.set_circuits({a.source: b.source})
        for _ in range(1200):  # at most 60 s
            if probe.completions >= iterations + 100:  # the first 100 warm up
                break
            await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return list(probe.round_trips)


async def verbs_part(device: str | None, gid_index: int, iterations: int) -> None:
    print("\n3. the verbs-rc probe beside perftest on an RDMA device (one-way latency, perftest's method):")
    try:
        names = compat.devices(compat.load())
    except (compat.PyverbsMissing, compat.RdmaUnavailable) as e:
        print(f"   skipped: {e}")
        return
    device = device or names[0]
    print(f"   device {device} (here: {', '.join(names)}), gid index {gid_index}, {iterations} round trips")
    print("   what                         median (t_typical)   p99")
    report = latency_report(await probe_latency(device, gid_index, iterations))
    print(f"   verbs-rc probe (SEND/RECV)   {report.t_typical / 1e3:12.2f} us  {report.p99 / 1e3:8.2f} us")
    send_lat: dict[str, float] | None = None
    for tool in ("ib_send_lat", "ib_write_lat"):
        result = run_latency_tool(tool, device, gid_index, iterations)
        if isinstance(result, str):
            print(f"   {tool:<28} skipped: {result}")
        else:
            print(f"   {tool:<28} {result['median_us']:12.2f} us  {result['p99_us']:8.2f} us")
            if tool == "ib_send_lat":
                send_lat = result
    record(
        "rdma",
        f"verbs-rc probe one-way latency t_typical, {device}",
        report.t_typical / 1e3,
        "us",
        peer="perftest ib_send_lat" if send_lat else None,
        peer_value=send_lat["median_us"] if send_lat else None,
    )


async def run(args: argparse.Namespace) -> None:
    if not args.verbs_only:
        await main()
    await verbs_part(args.device, args.gid_index, args.iterations)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--verbs-only", action="store_true", help="part 3 only (no root, no kernel fabric)")
    parser.add_argument("--device", help="RDMA device for part 3 (default: the first one)")
    parser.add_argument(
        "--gid-index", type=int, default=3, help="GID index for part 3 (RoCE v2 IPv4: often 3)"
    )
    parser.add_argument("--iterations", type=int, default=10_000, help="round trips in part 3")
    arguments = parser.parse_args()
    if os.geteuid() != 0 and not arguments.verbs_only:
        sys.exit("bench/rdma.py needs root (or --verbs-only)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    asyncio.run(run(arguments))
