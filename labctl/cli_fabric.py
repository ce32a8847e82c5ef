"""`labctl emulate fabric up|down` and `labctl probe carrier|traffic` (JSON lines, for debugging/scripts)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from labctl.errors import InputError

fabric_app = typer.Typer(
    help="The kernel-real emulated fabric (root, Linux): namespaces, veth NICs, tc cross-connects.",
    no_args_is_help=True,
)
probe_app = typer.Typer(
    help="Run one probe on its own and print its events as JSON lines.", no_args_is_help=True
)

InventoryOpt = Annotated[
    Path, typer.Option("--inventory", "-i", help="Inventory with `fabric: emulated` and NIC addresses.")
]
DEFAULT_INVENTORY = Path("experiments/inventories/emulated.yaml")


def _bounded(low: float, high: float) -> Callable[[float | None], float | None]:
    """A range check that names nan and inf for what they are (click's range check calls nan too large)."""

    def check(value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise typer.BadParameter(f"{value} is not a finite number")
        if value is not None and not low <= value <= high:
            raise typer.BadParameter(f"{value:g} is not in {low:g}..{high:g}")
        return value

    return check


@fabric_app.command("up")
def fabric_up(
    inventory: InventoryOpt = DEFAULT_INVENTORY,
    profile: Annotated[
        str | None, typer.Option(help="Delay profile the runs will use (checked here; applied by each run).")
    ] = None,
) -> None:
    """Build the inventory's fabric (prefix lc-<layout hash>-); runs on this inventory then reuse it."""
    import random

    from labctl.emulators.fabric import FabricLayout, KernelFabric, managed_prefix
    from labctl.inventory import load_inventory

    inv = load_inventory(inventory)
    prof = inv.profile(profile)
    layout = FabricLayout.of(inv, managed_prefix(inv))
    fabric = KernelFabric(layout, prof, random.Random(0), lambda e: None)
    if fabric.exists():
        fabric.reset()
        print(f"fabric {layout.prefix} already up; reset to dark")
    else:
        fabric.create()
        print(f"fabric {layout.prefix} up: namespaces {', '.join(layout.netns_names())}")
    for fp in layout.ports:
        print(
            f"  {fp.port.label:<22} {fp.port.address:<16} netns {fp.host_netns}  "
            f"fiber {layout.ocs_netns}/{fp.fiber}"
        )


@fabric_app.command("down")
def fabric_down(
    inventory: InventoryOpt = DEFAULT_INVENTORY,
    profile: Annotated[str | None, typer.Option(help="Accepted for symmetry with `up`.")] = None,
) -> None:
    """Remove the inventory's fabric and any fabric left by a run that was killed."""
    from labctl.emulators.fabric import managed_prefix
    from labctl.inventory import load_inventory
    from labctl.linux import netns

    inv = load_inventory(inventory)
    inv.profile(profile)
    removed = netns.cleanup(managed_prefix(inv))
    for stale in netns.stale_run_prefixes():
        removed += netns.cleanup(stale)
    print(f"removed {len(removed)} namespace(s)" + (f": {', '.join(removed)}" if removed else ""))


def _print_events(probe: object, duration: float | None) -> None:
    from labctl.events import encode_event
    from labctl.sampling import QueueProbe

    assert isinstance(probe, QueueProbe)

    async def main() -> None:
        async with probe:

            async def pump() -> None:
                async for event in probe.events():
                    sys.stdout.buffer.write(encode_event(event) + b"\n")
                    sys.stdout.flush()

            task = asyncio.create_task(pump())
            try:
                if duration is None:
                    await asyncio.Event().wait()
                else:
                    await asyncio.sleep(duration)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())


@probe_app.command("carrier")
def probe_carrier(
    iface: Annotated[list[str], typer.Option("--iface", help="Interface to watch (repeatable).")],
    netns_name: Annotated[
        str | None, typer.Option("--netns", help="Network namespace of the interfaces (default: this one).")
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option(callback=_bounded(0, 86_400), help="Seconds to run, 0..86400 (default: until Ctrl-C)."),
    ] = None,
    poll_hz: Annotated[
        float, typer.Option(callback=_bounded(1000, 100_000), help="Carrier poll rate (Hz), 1000..100000.")
    ] = 2000.0,
    no_poll: Annotated[
        bool, typer.Option("--no-poll", help="Events only: carrier-down may then lag up to 1 s (linkwatch).")
    ] = False,
) -> None:
    """Print carrier and operstate events of interfaces as JSON lines (netlink events + carrier poll)."""
    from labctl.probes.carrier import CarrierTarget, NetlinkCarrierProbe

    host = netns_name or ""
    targets = [CarrierTarget(netns_name, name, f"nic:{host or 'local'}/{name}", host) for name in iface]
    _print_events(NetlinkCarrierProbe(targets, poll_hz=poll_hz, always_poll=not no_poll), duration)


@probe_app.command("traffic")
def probe_traffic(
    port_a: Annotated[str, typer.Argument(metavar="A", help="A NIC port as host/ifname, e.g. h1/ens1f0np0.")],
    port_b: Annotated[str, typer.Argument(metavar="B", help="Its peer, e.g. h2/ens1f0np0.")],
    inventory: InventoryOpt = DEFAULT_INVENTORY,
    prefix: Annotated[
        str | None, typer.Option(help="Fabric namespace prefix (default: the inventory's `fabric up` one).")
    ] = None,
    interval_us: Annotated[int, typer.Option(min=10, help="Ping interval per direction.")] = 1000,
    duration: Annotated[
        float | None,
        typer.Option(callback=_bounded(0, 86_400), help="Seconds to run, 0..86400 (default: until Ctrl-C)."),
    ] = None,
    report_ms: Annotated[
        float,
        typer.Option(callback=_bounded(1, 86_400_000), help="Heartbeat interval while steady (ms), >= 1."),
    ] = 100.0,
) -> None:
    """UDP ping-pong both ways between two NIC ports of a running emulated fabric; events as JSON lines."""
    from labctl.emulators.fabric import FabricLayout, managed_prefix
    from labctl.inventory import load_inventory
    from labctl.probes.traffic import TrafficEndpoint, UdpTrafficProbe

    if port_a == port_b:
        raise InputError(f"{port_a}: a ping-pong needs two different ports")
    inv = load_inventory(inventory)
    layout = FabricLayout.of(inv, prefix or managed_prefix(inv))
    by_label = {fp.port.label: fp for fp in layout.ports}
    endpoints = []
    for label in (port_a, port_b):
        fp = by_label.get(label)
        if fp is None:
            raise InputError(f"{inventory}: no NIC port {label!r} (known: {', '.join(by_label)})")
        endpoints.append(TrafficEndpoint(fp.port.source, fp.ip, fp.port.ifname, fp.host_netns, fp.port.host))
    probe = UdpTrafficProbe(endpoints, interval_us=interval_us, report_interval_ns=round(report_ms * 1e6))
    a, b = endpoints
    probe.set_circuits({a.source: b.source, b.source: a.source})
    _print_events(probe, duration)
