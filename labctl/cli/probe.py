"""`labctl probe …`: run one probe on its own and print its events as JSON lines (debugging, scripts)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from labctl.cli.common import DEFAULT_INVENTORY, InventoryOpt, bounded
from labctl.core.errors import InputError

probe_app = typer.Typer(
    help="Run one probe on its own and print its events as JSON lines.", no_args_is_help=True
)


def _print_events(probe: object, duration: float | None) -> None:
    import asyncio
    import contextlib

    from labctl.core.events import encode_event
    from labctl.probes.sampling import QueueProbe

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
        typer.Option(callback=bounded(0, 86_400), help="Seconds to run, 0..86400 (default: until Ctrl-C)."),
    ] = None,
    poll_hz: Annotated[
        float, typer.Option(callback=bounded(1000, 100_000), help="Carrier poll rate (Hz), 1000..100000.")
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
        typer.Option(callback=bounded(0, 86_400), help="Seconds to run, 0..86400 (default: until Ctrl-C)."),
    ] = None,
    report_ms: Annotated[
        float,
        typer.Option(callback=bounded(1, 86_400_000), help="Heartbeat interval while steady (ms), >= 1."),
    ] = 100.0,
) -> None:
    """UDP ping-pong both ways between two NIC ports of a running emulated fabric; events as JSON lines."""
    from labctl.emulators.fabric import FabricLayout, managed_prefix
    from labctl.inventory.schema import load_inventory
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


def register(app: typer.Typer) -> None:
    app.add_typer(probe_app, name="probe")
