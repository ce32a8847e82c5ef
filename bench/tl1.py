"""Polatis TL1 driver timing against the TL1 emulator, each figure against a named peer in the same run.

- round trip of one ENT-PATCH (driver call → COMPLD) with switching time 0: emulator in its own process
  (`labctl emulate ocs`, like a real switch) and, for reference, in the driver's own event loop;
- a 16-pair remap (apply: read, DLT-PATCH, 16 ENT-PATCH, read back), pipelined (16 commands in flight,
  distinct ctags) vs one command at a time, at switching time 0 and 25 ms;
- 8 switches (8 emulator processes) remapped in parallel vs one switch alone: the ratio of medians.
Goals (issue 3): round-trip p50 ≤ 1 ms; 8-vs-1 ratio ≤ 1.2. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from labctl.core.events import Event
from labctl.emulators.tl1 import Tl1Emulator
from labctl.inventory.config import Secret
from labctl.inventory.mapping import PortSpace
from labctl.inventory.profiles import Profile, resolve_profile
from labctl.models.switch import SwitchModel
from labctl.ocs.drivers.polatis_tl1.switch import PolatisTl1Switch, Tl1Endpoint
from labctl.ocs.protocol import TimeoutPolicy

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _table import record

SPACE = PortSpace(32, 32)
PASSWORD = "bench-" + os.urandom(4).hex()
STRAIGHT = {(i, 32 + i) for i in range(1, 17)}
ROTATED = {(i, 32 + i % 16 + 1) for i in range(1, 17)}


def pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] / 1e6


@contextmanager
def emulator_processes(count: int, switching_ms: float) -> Iterator[list[int]]:
    """`count` × `labctl emulate ocs --port 0`, each its own process; yields their ports."""
    env = {**os.environ, "POLATIS_PASSWORD": PASSWORD}
    cmd = [
        sys.executable,
        "-m",
        "labctl.cli",
        "emulate",
        "ocs",
        "polatis-tl1",
        "--port",
        "0",
        "--switching-ms",
        str(switching_ms),
    ]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) for _ in range(count)]
    try:
        ports = []
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
            if not m:
                raise SystemExit(f"emulator did not start: {line!r}")
            ports.append(int(m[1]))
        yield ports
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
            if p.stdout is not None:
                p.stdout.close()


def make_driver(port: int, depth: int) -> PolatisTl1Switch:
    def drop(_: Event) -> None:
        return None

    return PolatisTl1Switch(
        f"ocs-{port}",
        SPACE,
        endpoint=Tl1Endpoint("127.0.0.1", port),
        user="admin",
        password=Secret("POLATIS_PASSWORD", PASSWORD),
        emit=drop,
        timeouts=TimeoutPolicy(connect_s=10, operation_s=30),
        pipeline_depth=depth,
        keepalive_s=None,
    )


async def round_trips(port: int, n: int) -> list[int]:
    sw = make_driver(port, 16)
    await sw.connect()
    try:
        out = []
        for _ in range(n):
            out.append((await sw.enter_patch(1, 33)).elapsed_ns)
            await sw.delete_patches([1])
        return out
    finally:
        await sw.close()


async def remaps(sw: PolatisTl1Switch, n: int) -> list[int]:
    await sw.apply(STRAIGHT)
    out = []
    for i in range(n):
        out.append((await sw.apply(ROTATED if i % 2 == 0 else STRAIGHT)).elapsed_ns)
    return out


async def with_switches(
    ports: list[int], depth: int, body: Callable[[list[PolatisTl1Switch]], Awaitable[object]]
) -> None:
    switches = [make_driver(p, depth) for p in ports]
    for sw in switches:
        await sw.connect()
    try:
        await body(switches)
    finally:
        for sw in switches:
            await sw.close()


async def in_process_round_trips(n: int) -> list[int]:
    fast = resolve_profile("fast")
    profile = Profile(**{**fast.model_dump(), "switching_ms": (0.0, 0.0), "light_loss_ms": (0.0, 0.0)})
    model = SwitchModel("bench", SPACE, profile, random.Random(0))
    emu = Tl1Emulator(model, users={"admin": PASSWORD})
    await emu.start()
    try:
        return await round_trips(emu.port, n)
    finally:
        await emu.close()
        model.cancel_pending()


async def main(args: argparse.Namespace) -> None:
    print(
        f"Polatis TL1 driver vs TL1 emulator on 127.0.0.1 (python {sys.version.split()[0]}, {os.cpu_count()} CPUs)"
    )

    print("\n1. one ENT-PATCH round trip, switching time 0")
    with emulator_processes(1, 0) as (port,):
        rt = await round_trips(port, args.n)
    inproc = await in_process_round_trips(args.n)
    print(
        f"   emulator in its own process : p50 {pct(rt, 0.5):.3f} ms  p99 {pct(rt, 0.99):.3f} ms  (n={len(rt)}; goal p50 <= 1 ms)"
    )
    print(f"   emulator in the same loop   : p50 {pct(inproc, 0.5):.3f} ms  p99 {pct(inproc, 0.99):.3f} ms")
    record(
        "tl1",
        "ENT-PATCH round trip p50, emulator process",
        pct(rt, 0.5),
        "ms",
        peer="emulator in the same loop",
        peer_value=pct(inproc, 0.5),
        goal="p50 <= 1 ms",
    )

    print("\n2. 16-pair remap (apply: RTRV, DLT-PATCH x1, ENT-PATCH x16, RTRV), median of", args.remaps)
    for switching in (0.0, 25.0):
        with emulator_processes(1, switching) as ports:
            medians = {}
            for depth in (16, 1):
                times: list[int] = []

                async def body(s: list[PolatisTl1Switch], times: list[int] = times) -> None:
                    times.extend(await remaps(s[0], args.remaps))

                await with_switches(ports, depth, body)
                medians[depth] = statistics.median(times) / 1e6
        print(
            f"   switching {switching:>4g} ms: pipelined {medians[16]:7.2f} ms   one-at-a-time {medians[1]:7.2f} ms"
            f"   (pipelined is {medians[1] / medians[16]:.1f}x faster)"
        )
        record(
            "tl1",
            f"16-pair remap, pipelined, switching {switching:g} ms",
            medians[16],
            "ms",
            peer="one command at a time",
            peer_value=medians[1],
        )

    print(
        f"\n3. 8 switches remapped in parallel vs one alone (pipelined, switching {args.switching_ms:g} ms), median of",
        args.remaps,
    )
    with emulator_processes(8, args.switching_ms) as ports:
        one: list[int] = []
        eight: list[int] = []

        async def alone(s: list[PolatisTl1Switch]) -> None:
            one.extend(await remaps(s[0], args.remaps))

        async def together(s: list[PolatisTl1Switch]) -> None:
            for sw in s:
                await sw.apply(STRAIGHT)
            for i in range(args.remaps):
                target = ROTATED if i % 2 == 0 else STRAIGHT
                t0 = time.monotonic_ns()
                await asyncio.gather(*(sw.apply(target) for sw in s))
                eight.append(time.monotonic_ns() - t0)

        await with_switches(ports[:1], 16, alone)
        await with_switches(ports, 16, together)
    m1, m8 = statistics.median(one) / 1e6, statistics.median(eight) / 1e6
    print(f"   one switch {m1:.2f} ms   8 switches {m8:.2f} ms   ratio {m8 / m1:.2f}  (goal <= 1.2)")
    record(
        "tl1",
        f"8 switches remapped in parallel, switching {args.switching_ms:g} ms",
        m8,
        "ms",
        peer="one switch alone",
        peer_value=m1,
        goal="ratio <= 1.2",
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="round trips to time")
    parser.add_argument("--remaps", type=int, default=30, help="remaps to time per figure")
    parser.add_argument("--switching-ms", type=float, default=25.0, help="switching time for figure 3")
    asyncio.run(main(parser.parse_args()))
