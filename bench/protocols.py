"""Every switch protocol side by side: one connect and a 16-pair remap per driver, against its emulator
over loopback (or a pty), in one run.

    python bench/protocols.py [--rounds 5] [--remaps 40] [--switching-ms 0] [--drivers a,b]

For each registered driver with an emulator (TL1, NETCONF, SCPI, serial, ...): a fresh emulator of a
32x32 switch per round, the driver's `connect()` timed (login, hello, *IDN?...: whatever the protocol
needs before the first command), then `apply()` of a 16-pair remap (read, remove 16, add 16, read back:
the shared convergence code) alternating between two mappings, each timed. The emulator runs in the
driver's own event loop, as `emulate: true` does in a run; switching time 0 by default, so the figures
are the protocol and driver cost alone. Peer: the NETCONF driver beside a plain ncclient script doing the
same edit-config against the same emulator (part 2). Prints medians and p99 (nearest rank); asserts
nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from labctl.core.events import Event
from labctl.inventory.mapping import PortSpace
from labctl.inventory.profiles import Profile, resolve_profile
from labctl.models.switch import SwitchModel
from labctl.ocs.switches import switch_drivers

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _table import record

NAME = "ocs1"
SIZE = "32x32"
SPACE = PortSpace(32, 32)
STRAIGHT = frozenset((i, 32 + i) for i in range(1, 17))
ROTATED = frozenset((i, 32 + i % 16 + 1) for i in range(1, 17))


def pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, -(-round(q * 100) * len(ordered) // 100) - 1)] / 1e6


def profile(switching_ms: float) -> Profile:
    fast = resolve_profile("fast")
    return Profile(**{**fast.model_dump(), "switching_ms": (switching_ms, switching_ms)})


def emulated_drivers() -> list[str]:
    return [
        name
        for name in switch_drivers.names()
        if switch_drivers.get(name).emulate is not None
        and "emulate" in switch_drivers.get(name).config.model_fields
    ]


async def one_round(driver: str, remaps: int, switching_ms: float, seed: int) -> tuple[int, list[int]]:
    """(connect ns, [apply ns per remap]) for one fresh emulator and driver."""
    from labctl.core.clock import now_ns

    entry = switch_drivers.get(driver)
    config = entry.config.model_validate({"driver": driver, "size": SIZE, "emulate": True, "timeout_s": 30})
    model = SwitchModel.many({NAME: config.space}, profile(switching_ms), random.Random(seed))[NAME]
    events: list[Event] = []
    emulated = entry.emulate(NAME, config, model, events.append)
    if emulated.start is not None:
        await emulated.start()
    try:
        t = now_ns()
        await emulated.switch.connect()
        connect_ns = now_ns() - t
        applies = []
        try:
            await emulated.switch.apply(STRAIGHT, scope=range(1, 65))
            for k in range(remaps):
                mapping = ROTATED if k % 2 == 0 else STRAIGHT
                t = now_ns()
                await emulated.switch.apply(mapping, scope=range(1, 65))
                applies.append(now_ns() - t)
        finally:
            await emulated.switch.close()
    finally:
        if emulated.close is not None:
            await emulated.close()
        model.cancel_pending()
    return connect_ns, applies


async def run_driver(driver: str, rounds: int, remaps: int, switching_ms: float) -> dict[str, Any]:
    connects, applies = [], []
    for r in range(rounds):
        connect_ns, apply_ns = await one_round(driver, remaps, switching_ms, seed=r)
        connects.append(connect_ns)
        applies.extend(apply_ns)
    return {"connects": connects, "applies": applies}


def ncclient_peer(rounds: int, remaps: int, switching_ms: float) -> dict[str, Any]:
    """The NETCONF emulator driven by a plain ncclient (manager API) script, the way a lab script would:
    per round a connect, then per remap get (cross-connects), one edit-config (the driver's own merge +
    delete body), get again to verify."""
    from labctl.core.extras import quiet_import
    from labctl.emulators.netconf import NetconfEmulator
    from labctl.inventory.mapping import MappingDiff
    from labctl.ocs.drivers.polatis_netconf import codec

    manager = quiet_import("ncclient.manager")  # its paramiko's cryptography deprecations are not ours

    def config(diff: MappingDiff) -> str:  # the driver's <config>, as ncclient's edit_config takes it
        body = codec.edit_config(diff)
        cfg = body[body.index("<config ") : body.index("</config>") + len("</config>")]
        return cfg.replace("<config ", f'<config xmlns="{codec.NS_BASE}" ', 1)

    async def run() -> dict[str, Any]:
        model = SwitchModel(NAME, SPACE, profile(switching_ms), random.Random(0))
        emulator = NetconfEmulator(model, users={"admin": "bench"})
        await emulator.start()
        host, port = emulator.address
        connects: list[int] = []
        applies: list[int] = []

        def plain() -> None:
            t = time.perf_counter_ns()
            m = manager.connect(
                host=host,
                port=port,
                username="admin",
                password="bench",
                hostkey_verify=False,  # the emulator's key is fresh per start; a lab script would pin it
                allow_agent=False,
                look_for_keys=False,
                timeout=30,
            )
            connects.append(time.perf_counter_ns() - t)
            try:
                m.edit_config(target="running", config=config(MappingDiff(remove=frozenset(), add=STRAIGHT)))
                current = STRAIGHT
                for k in range(remaps):
                    want = ROTATED if k % 2 == 0 else STRAIGHT
                    t = time.perf_counter_ns()
                    m.get(filter=("subtree", codec.cross_connects_filter()))
                    m.edit_config(target="running", config=config(MappingDiff(remove=current, add=want)))
                    m.get(filter=("subtree", codec.cross_connects_filter()))
                    applies.append(time.perf_counter_ns() - t)
                    current = want
            finally:
                m.close_session()

        try:
            for _ in range(rounds):
                await asyncio.to_thread(plain)
        finally:
            await emulator.close()
            model.cancel_pending()
        return {"connects": connects, "applies": applies}

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help="fresh emulator + connect per round")
    parser.add_argument("--remaps", type=int, default=40, help="16-pair remaps per round")
    parser.add_argument("--switching-ms", type=float, default=0.0, help="modeled switching time")
    parser.add_argument(
        "--drivers", default="", help="comma-separated subset (default: all with an emulator)"
    )
    args = parser.parse_args()
    drivers = [d for d in args.drivers.split(",") if d] or emulated_drivers()
    print(
        f"one connect and a 16-pair remap per protocol, 32x32 switch, switching {args.switching_ms:g} ms; "
        f"{args.rounds} connects and {args.rounds * args.remaps} remaps each"
    )
    print(f"{'driver':<18} {'connect p50':>12} {'p99':>9} {'remap p50':>10} {'p99':>9} {'remaps/s':>9}")
    results: dict[str, dict[str, Any]] = {}
    for driver in drivers:
        results[driver] = r = asyncio.run(run_driver(driver, args.rounds, args.remaps, args.switching_ms))
        c, a = r["connects"], r["applies"]
        print(
            f"{driver:<18} {statistics.median(c) / 1e6:>10.2f}ms {pct(c, 0.99):>7.2f}ms "
            f"{statistics.median(a) / 1e6:>8.2f}ms {pct(a, 0.99):>7.2f}ms {1e9 / statistics.median(a):>9.0f}"
        )
        if driver != "polatis-netconf":  # recorded beside its peer below
            record("protocols", f"16-pair remap p50, {driver}", statistics.median(a) / 1e6, "ms")
    if "polatis-tl1" in results:
        ref = statistics.median(results["polatis-tl1"]["applies"])
        print(
            "remap p50 relative to polatis-tl1: "
            + ", ".join(f"{d} x{statistics.median(r['applies']) / ref:.2f}" for d, r in results.items())
        )
    if "polatis-netconf" in results:
        peer = ncclient_peer(args.rounds, min(args.remaps, 10), args.switching_ms)
        ours = statistics.median(results["polatis-netconf"]["applies"])
        theirs = statistics.median(peer["applies"])
        print(
            f"\nNETCONF peer, plain ncclient script (get, edit-config merge+delete, get; the same emulator): "
            f"connect p50 {statistics.median(peer['connects']) / 1e6:.2f} ms, remap p50 {theirs / 1e6:.2f} ms, "
            f"p99 {pct(peer['applies'], 0.99):.2f} ms; plain ncclient / polatis-netconf remap p50: "
            f"x{theirs / ours:.0f} (ncclient's synchronous RPCs wait on its writer thread's 100 ms poll)"
        )
        record(
            "protocols",
            "16-pair remap p50, polatis-netconf",
            ours / 1e6,
            "ms",
            peer="plain ncclient script",
            peer_value=theirs / 1e6,
        )


if __name__ == "__main__":
    main()
