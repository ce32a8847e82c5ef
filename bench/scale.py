"""How the controller's cost grows with ports: 16 → 64 → 256 → 512 NIC ports on one controller.

    python bench/scale.py [--ports 16,64,256,512] [--rounds 3] [--kernel 16,32]

Part 1, full runs: the simulated lab (fast profile) of `ports / 4` hosts × 2 rails × 2 ports on one
ports×ports switch, one DP → PP → DP swap with every port moving, each run in a fresh process. Per size,
medians over rounds: achieved Rx-power samples/s per port (configured 1,000; also the worst round, and
the ticks the sampler skipped after stalls of the loop), pings/s per port, the event
loop's lag p99, controller CPU-seconds per port-second, flagged rows (impossible or unresolved phases).
With `--kernel` (root), the same on the kernel-real netns fabric for the given sizes.
Part 2, the peer: Rx-power sampling alone on the same model at each size, our poller (one ticker, one
vectorized read of the model's modules per tick) against one asyncio task per port reading its module
every period (the design that starved at 512 ports): samples/s per port, loop lag p99, and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _table import record


def write_lab(directory: Path, ports: int, kind: str = "simulated") -> tuple[Path, Path]:
    """An inventory of ports/4 hosts (2 rails × 2 ports each) on one switch, and a DP/PP experiment."""
    hosts = ports // 4
    if hosts < 4 or hosts % 4:
        raise SystemExit(f"--ports {ports}: needs a multiple of 16 (hosts in groups of four)")
    lines = [
        f"lab: scale-{ports}",
        f"kind: {kind}",
        "switches:",
        f"  ocs1: {{driver: sim, size: {ports}x{ports}}}",
    ]
    lines += ["profile: fast", "hosts:"]
    n = 0
    for h in range(1, hosts + 1):
        lines += [f"  h{h}:", "    nics:"]
        for rail in (0, 1):
            for k in (0, 1):
                n += 1
                address = f", address: 10.{rail}.{n // 250}.{n % 250 + 1}/16" if kind == "kernel" else ""
                lines.append(
                    f"      - {{ifname: r{rail}p{k}, rail: {rail}, switch: ocs1, tx: {n}, rx: {ports + n}{address}}}"
                )
    inventory = directory / f"inventory-{ports}.yaml"
    inventory.write_text("\n".join(lines) + "\n")
    dp = [[f"h{i}", f"h{i + 1}"] for i in range(1, hosts + 1, 2)]
    pp = [[f"h{i}", f"h{i + 2}"] for i in range(1, hosts + 1, 4)]
    pp += [[f"h{i + 1}", f"h{i + 3}"] for i in range(1, hosts + 1, 4)]
    pairs = lambda ps: "[" + ", ".join(f"[{a}, {b}]" for a, b in ps) + "]"  # noqa: E731
    experiment = directory / f"experiment-{ports}.yaml"
    experiment.write_text(
        f"name: scale-{ports}\nrails: [0, 1]\nphases:\n  dp: {{pairs: {pairs(dp)}}}\n  pp: {{pairs: {pairs(pp)}}}\n"
        "baseline: dp\ncycle: [pp, dp]\nrepeat: 1\nrecovery_timeout_s: 10\nhold_s: 0.5\n"
        "probes: {rx_power_hz: 1000, traffic_interval_us: 1000}\n"
    )
    return inventory, experiment


def one_run(ports: int, kind: str) -> dict[str, Any]:
    from labctl.run.lifecycle import run_experiment

    with tempfile.TemporaryDirectory() as tmp:
        inventory, experiment = write_lab(Path(tmp), ports, kind)
        before = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.monotonic()
        outcome = asyncio.run(
            run_experiment(experiment, inventory, out_dir=Path(tmp) / "runs", plots=False, seed=1)
        )
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_SELF)
        run = json.loads((outcome.run_dir / "run.json").read_text())
        summary = outcome.summary
    rx = run["probes"].get("rx-power", {})
    traffic = next((run["probes"][n] for n in ("model-traffic", "traffic") if n in run["probes"]), {})
    running = rx.get("running_s") or wall
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "status": outcome.status,
        "samples_per_s_per_port": rx.get("samples_per_s_per_port"),
        "ticks_skipped": rx.get("ticks_skipped"),
        "pings_per_s_per_port": round((traffic.get("pings_per_s") or 0) / ports, 1),
        "loop_lag_p99_ms": run["loop_lag_ns"].get("p99", 0) / 1e6,
        "cpu_s_per_port_s": cpu / (ports * running),
        "cpu_utilization": cpu / wall,
        "flagged_rows": summary.get("flagged_rows"),
        "optical_median_ms": (summary["phases"]["optical"]["median"] or 0) / 1e6,
        "t2_resolution_median_ms": summary.get("resolution", {}).get("t2", {}).get("median", 0) / 1e6,
    }


def sampler_only(ports: int, design: str, seconds: float = 1.5) -> dict[str, Any]:
    """Rx-power sampling of `ports` modeled modules on a quiet model, ours or one task per port."""
    import random

    from labctl.core.clock import now_ns
    from labctl.inventory.profiles import resolve_profile
    from labctl.inventory.schema import load_inventory
    from labctl.linux.looplag import LoopLagMonitor
    from labctl.models.fabric import SimFabric
    from labctl.models.switch import SwitchModel
    from labctl.probes.model import model_sites
    from labctl.probes.rxpower import ModulePort, RxPowerProbe
    from labctl.probes.transceiver import module_info

    async def main() -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            inventory = load_inventory(write_lab(Path(tmp), ports)[0])
        profile, rng = resolve_profile("fast"), random.Random(1)
        model = SwitchModel("ocs1", inventory.switches["ocs1"].space, profile, rng)
        fabric = SimFabric(inventory, {"ocs1": model}, profile, rng)
        sites = model_sites(fabric, inventory.ports)
        async with LoopLagMonitor() as lag:
            if design == "ours":
                probe = RxPowerProbe(
                    [
                        ModulePort(s.port.source, s.port.host, s.open_eeprom, s.rx_lanes, s.rx_batch)
                        for s in sites
                    ]
                )  # type: ignore[arg-type]
                async with probe:
                    drain = asyncio.create_task(_drain(probe))
                    await asyncio.sleep(seconds)
                samples = probe.samples
                drain.cancel()
            else:
                counts = [0] * ports

                async def per_port(i: int) -> None:
                    mem = sites[i].open_eeprom()  # type: ignore[misc]
                    info = module_info(mem)
                    reads = [(r.i2c_address, r.page, r.bank, r.offset, r.length) for r in info.rx_power_reads]
                    period, next_t = 1_000_000, now_ns()
                    while True:
                        next_t += period
                        await asyncio.sleep(max(next_t - now_ns(), 0) / 1e9)
                        info.decode_rx_power_mw([mem.read(*r) for r in reads])
                        counts[i] += 1

                tasks = [asyncio.create_task(per_port(i)) for i in range(ports)]
                await asyncio.sleep(seconds)
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                samples = sum(counts)
        fabric.cancel_pending()
        model.cancel_pending()
        return {
            "samples_per_s_per_port": samples / seconds / ports,
            "loop_lag_p99_ms": lag.stats().get("p99", 0) / 1e6,
        }

    return asyncio.run(main())


async def _drain(probe: Any) -> None:
    async for _ in probe.events():
        pass


def child(args: list[str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"child {args} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median_of(rows: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--ports", default="16,64,256,512", help="comma-separated port counts (multiples of 16)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kernel", default="", help="also run the kernel netns fabric at these sizes (root)")
    parser.add_argument("--one", nargs=2, metavar=("KIND", "PORTS"), help=argparse.SUPPRESS)
    parser.add_argument("--sampler", nargs=2, metavar=("DESIGN", "PORTS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(int(args.one[1]), args.one[0])))
        return
    if args.sampler:
        print(json.dumps(sampler_only(int(args.sampler[1]), args.sampler[0])))
        return
    sizes = [int(p) for p in args.ports.split(",") if p]
    plan = [("simulated", n) for n in sizes] + [("kernel", int(n)) for n in args.kernel.split(",") if n]
    if any(kind == "kernel" for kind, _ in plan) and os.geteuid() != 0:
        raise SystemExit("--kernel needs root (network namespaces)")
    print(f"full runs, {args.rounds} rounds each (medians); fast profile, DP -> PP -> DP, every port moves")
    header = f"{'lab':<10} {'ports':>5} {'samples/s/port':>14} {'(min)':>7} {'skipped':>7} {'pings/s/port':>12} {'lag p99':>8} "
    header += f"{'CPU/wall':>8} {'CPU s/port-s':>12} {'flagged':>7} {'optical':>8} {'t2 res':>7}"
    print(header)
    base_cpu: float | None = None
    base_n = plan[0][1] if plan else 0
    for kind, n in plan:
        rows = [child(["--one", kind, str(n)]) for _ in range(args.rounds)]
        cpu = median_of(rows, "cpu_s_per_port_s")
        base_cpu = base_cpu or cpu
        print(
            f"{kind:<10} {n:>5} {median_of(rows, 'samples_per_s_per_port'):>14.1f} "
            f"{min(r['samples_per_s_per_port'] or 0 for r in rows):>7.1f} {median_of(rows, 'ticks_skipped'):>7.0f} "
            f"{median_of(rows, 'pings_per_s_per_port'):>12.0f} {median_of(rows, 'loop_lag_p99_ms'):>6.2f}ms "
            f"{median_of(rows, 'cpu_utilization'):>8.2f} {cpu * 1e3:>9.3f} ms {median_of(rows, 'flagged_rows'):>7.0f} "
            f"{median_of(rows, 'optical_median_ms'):>6.1f}ms {median_of(rows, 't2_resolution_median_ms'):>5.1f}ms"
            f"  (CPU per port-second x{cpu / base_cpu:.2f} of the smallest)"
        )
        if n == max(m for k, m in plan if k == kind):  # the largest size of each lab kind
            record(
                "scale",
                f"{kind} full run, {n} ports: Rx-power samples/s per port",
                median_of(rows, "samples_per_s_per_port"),
                "samples/s/port",
                goal="1,000 (configured)",
            )
            record(
                "scale",
                f"{kind} full run, {n} ports: controller CPU per port-second",
                cpu * 1e3,
                "ms",
                peer=f"the same at {base_n} ports",
                peer_value=base_cpu * 1e3,
            )
    print(
        "\nRx-power sampling alone, 1.5 s per size (medians over rounds): ours vs one asyncio task per port"
    )
    print(
        f"{'ports':>5} {'ours samples/s/port':>20} {'lag p99':>8} {'task/port samples/s/port':>25} {'lag p99':>8} {'ours/peer':>9}"
    )
    for n in sizes:
        ours = [child(["--sampler", "ours", str(n)]) for _ in range(args.rounds)]
        peer = [child(["--sampler", "per-port", str(n)]) for _ in range(args.rounds)]
        o, p = median_of(ours, "samples_per_s_per_port"), median_of(peer, "samples_per_s_per_port")
        print(
            f"{n:>5} {o:>20.0f} {median_of(ours, 'loop_lag_p99_ms'):>6.2f}ms {p:>25.0f} "
            f"{median_of(peer, 'loop_lag_p99_ms'):>6.2f}ms {o / p:>8.2f}x"
        )
        if n == max(sizes):
            record(
                "scale",
                f"Rx-power sampling alone, {n} ports: our poller",
                o,
                "samples/s/port",
                peer="one asyncio task per port",
                peer_value=p,
            )


if __name__ == "__main__":
    main()
