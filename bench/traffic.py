"""Highest sustained UDP ping-pong rate on one emulated circuit, and the resume-detection resolution it gives.

One circuit (two NIC ports patched through the tc OCS), pinging both ways with UdpTrafficProbe at shrinking
intervals for 2 s each. "Sustained" = ≥ 95 % of the intended pings were sent and ≥ 99.9 % of those were
answered (of the pings resolved in the window: in-flight ones at either edge are not counted). At that
rate, the cut-and-restore check measures resume detection: the fiber ends go down, come back up, and we
take fiber-up → first traffic.ok. Goal: resolution ≤ 0.2 ms. Run as root: python bench/traffic.py
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
from labctl.core.events import Event
from labctl.emulators.fabric import FabricLayout, KernelFabric
from labctl.inventory.schema import load_inventory
from labctl.linux import netns
from labctl.probes.traffic import TrafficEndpoint, UdpTrafficProbe

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _table import record

PREFIX = f"lb{os.getpid()}-t-"
INVENTORY = textwrap.dedent(
    """
    lab: bench-traffic
    kind: kernel
    switches: {ocs1: {driver: sim, size: 4x4}}
    hosts:
      h1: {nics: [{ifname: eth0, rail: 0, switch: ocs1, tx: 1, rx: 5, address: 10.9.0.1/24}]}
      h2: {nics: [{ifname: eth0, rail: 0, switch: ocs1, tx: 2, rx: 6, address: 10.9.0.2/24}]}
    """
)


async def run_at(
    fabric: KernelFabric, endpoints: list[TrafficEndpoint], interval_us: int, seconds: float
) -> dict[str, float]:
    probe = UdpTrafficProbe(endpoints, interval_us=interval_us, timeout_us=max(2 * interval_us, 2000))
    a, b = endpoints
    oks: list[Event] = []
    async with probe:

        async def pump() -> None:
            async for e in probe.events():
                if e.kind == "traffic.ok":
                    oks.append(e)

        task = asyncio.create_task(pump())
        probe.set_circuits({a.source: b.source, b.source: a.source})
        await asyncio.sleep(0.2)
        p0, q0, l0 = probe.pings, probe.pongs, probe.lost
        t0 = now_ns()
        await asyncio.sleep(seconds)
        elapsed = (now_ns() - t0) / 1e9
        pings, pongs, lost = probe.pings - p0, probe.pongs - q0, probe.lost - l0
        # Resume detection at this rate: fiber ends down, then up; fiber-up → first traffic.ok per port.
        resumes = []
        ports = fabric.layout.ports
        rt = fabric._control()
        for _ in range(20):
            for fp in ports:
                rt.set_up(fp.index, False)
            await asyncio.sleep(0.01)
            n = len(oks)
            t_up = now_ns()
            for fp in ports:
                rt.set_up(fp.index, True)
            await asyncio.sleep(0.03)
            first = next((e.t_ns for e in oks[n:] if e.t_ns >= t_up), None)
            if first is not None:
                resumes.append(first - t_up)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    rtts = [int(e.value or 0) for e in oks]
    return {
        "target_hz": 2 * 1e6 / interval_us,
        "sent_hz": pings / elapsed,
        # Of the pings resolved in the window (answered or declared lost): in-flight ones at either edge
        # are not counted, so this can never exceed 100 %.
        "answered": pongs / max(pongs + lost, 1),
        "rtt_med_us": float(np.median(rtts)) / 1e3 if rtts else float("nan"),
        "resume_med_ms": float(np.median(resumes)) / 1e6 if resumes else float("nan"),
        "resume_p99_ms": float(np.percentile(resumes, 99)) / 1e6 if resumes else float("nan"),
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
            "interval  target(2 dirs)  sent       answered   RTT med   resume med/p99 (fiber up -> first traffic.ok)"
        )
        best = None
        for interval_us in (1000, 500, 200, 100, 50, 20):
            r = await run_at(fabric, endpoints, interval_us, 2.0)
            sustained = r["sent_hz"] >= 0.95 * r["target_hz"] and r["answered"] >= 0.999
            print(
                f"{interval_us:>6} us  {r['target_hz']:>9.0f}/s   {r['sent_hz']:>8.0f}/s  {100 * r['answered']:7.3f} %  "
                f"{r['rtt_med_us']:6.1f} us  {r['resume_med_ms']:.3f}/{r['resume_p99_ms']:.3f} ms"
                + ("" if sustained else "  (not sustained)")
            )
            if sustained:
                best = (interval_us, r)
        if best:
            interval_us, r = best
            print(
                f"highest sustained: {r['sent_hz'] / 2:.0f} pings/s per direction per circuit (interval {interval_us} us); "
                f"resume-detection resolution {interval_us / 1e3:.3f} ms (measured resume median {r['resume_med_ms']:.3f} ms)"
            )
            record(
                "traffic",
                f"highest sustained UDP ping-pong, per direction (interval {interval_us} us)",
                r["sent_hz"] / 2,
                "pings/s",
            )
            record("traffic", "resume-detection resolution", interval_us / 1e3, "ms", goal="<= 0.2 ms")
            record("traffic", "resume, fiber up -> first traffic.ok, median", r["resume_med_ms"], "ms")
        fabric.close()
    finally:
        await asyncio.to_thread(fabric.destroy)
        netns.cleanup(PREFIX)


if __name__ == "__main__":
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/traffic.py needs root")
    # A timeout's SIGTERM unwinds like Ctrl-C, so the finally blocks remove the namespaces.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    asyncio.run(main())
