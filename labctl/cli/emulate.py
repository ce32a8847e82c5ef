"""`labctl emulate …`: serve emulated lab hardware: a switch's protocol emulator (`ocs DRIVER`), a power
meter tapping a kernel fabric's receive fibers (`power-meter`, root), the kernel-real fabric
(`fabric up|down`, root)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import typer

from labctl.cli.common import DEFAULT_INVENTORY, InventoryOpt, JsonOpt, ProfileOpt
from labctl.core.errors import InputError

emulate_app = typer.Typer(
    help="Serve emulated lab hardware: a switch's protocol emulator over TCP (127.0.0.1 by default), or the "
    "kernel-real fabric of an inventory.",
    no_args_is_help=True,
)
fabric_app = typer.Typer(
    help="The kernel-real fabric (root, Linux): namespaces, veth NICs, tc cross-connects.",
    no_args_is_help=True,
)
emulate_app.add_typer(fabric_app, name="fabric")


@emulate_app.callback()
def _emulate_group() -> None:
    """Serve emulated lab hardware."""


@emulate_app.command("ocs")
def emulate_ocs(
    driver: Annotated[
        str,
        typer.Argument(
            metavar="DRIVER",
            help="The switch driver whose emulator to serve (see `labctl emulate ocs --list`).",
        ),
    ] = "",
    list_drivers: Annotated[
        bool, typer.Option("--list", help="List the drivers that have an emulator, and exit.")
    ] = False,
    protocol: Annotated[
        str | None,
        typer.Option(
            help="Pick the emulator by protocol instead of DRIVER: tl1, netconf, scpi, serial (the last part "
            "of a driver's name)."
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[
        int | None, typer.Option(help="TCP port (0 = pick a free one and print it; default: the protocol's).")
    ] = None,
    size: Annotated[str, typer.Option(help="Switch size NxM: ingress 1..N, egress N+1..N+M.")] = "32x32",
    switching_ms: Annotated[
        float | None,
        typer.Option(
            help="Modeled switching time per command (default: 25 ms; with --fabric, the profile's)."
        ),
    ] = None,
    faults: Annotated[
        Path | None,
        typer.Option(help="YAML fault plan (drops, delays, refusal probability, garbage, state loss)."),
    ] = None,
    user: Annotated[str, typer.Option(help="User the emulator accepts.")] = "admin",
    password_env: Annotated[
        str | None,
        typer.Option(help="Environment variable holding the password it accepts (default: the driver's)."),
    ] = None,
    input_dbm: Annotated[
        float | None,
        typer.Option(help="Light on every ingress port (dBm), as if transceivers were attached."),
    ] = -1.0,
    session_timeout_s: Annotated[
        float | None, typer.Option(help="Hang up a session idle this long (default: never).")
    ] = None,
    fabric: Annotated[
        bool,
        typer.Option(
            "--fabric",
            help="Move light through the inventory's kernel fabric (`labctl emulate fabric up`, root): its "
            "cross-connects follow this emulator's patches, with the profile's firmware delays. Size and "
            "ports then come from the inventory's switch.",
        ),
    ] = False,
    inventory: InventoryOpt = DEFAULT_INVENTORY,
    switch: Annotated[
        str | None,
        typer.Option("--switch", "-s", help="With --fabric: the inventory switch (default: the only one)."),
    ] = None,
    profile: ProfileOpt = None,
) -> None:
    """Serve a switch's protocol emulator until Ctrl-C, around the same switch model the simulated lab uses;
    drive it with `labctl ocs` (an inventory switch with this address) or any client of the protocol. With
    --fabric it is the switch of a kernel fabric: to a controller it is just a switch at HOST:PORT."""
    import asyncio
    import random
    import signal

    from labctl.emulators.core import load_faults
    from labctl.inventory.mapping import PortSpace
    from labctl.inventory.profiles import Profile, resolve_profile
    from labctl.models.switch import SwitchModel
    from labctl.ocs.switches import EmulatorOptions, switch_drivers

    serving = {name: e.emulator for name, e in switch_drivers.all().items() if e.emulator is not None}
    if protocol is not None:
        speaking = [name for name in serving if name.rsplit("-", 1)[-1] == protocol.lower()]
        known = sorted({name.rsplit("-", 1)[-1] for name in serving})
        if len(speaking) != 1:
            which = f"served by {', '.join(speaking)}: name one" if speaking else "no emulator speaks it"
            raise InputError(f"--protocol {protocol}: {which} (protocols: {', '.join(known)})")
        if driver and driver != speaking[0]:
            raise InputError(f"--protocol {protocol} is driver {speaking[0]}, not {driver}: give one of them")
        driver = speaking[0]
    if list_drivers or not driver:
        if not list_drivers:
            raise InputError(f"name the driver to emulate: {', '.join(serving)}")
        for name, listed in serving.items():
            print(f"{name}: {listed.protocol}, port {listed.default_port}")
        return
    if driver not in switch_drivers:
        raise switch_drivers.unknown(driver)
    front = serving.get(driver)
    if front is None:
        raise InputError(f"driver {driver} has no protocol emulator (drivers with one: {', '.join(serving)})")
    port = front.default_port if port is None else port
    password_env = password_env or front.password_env
    if not 0 <= port <= 65535:
        raise InputError(f"--port {port}: must be 0..65535")
    if switching_ms is not None and not 0 <= switching_ms < 1e6:
        raise InputError(f"--switching-ms {switching_ms}: must be 0 or more (ms)")
    password = os.environ.get(password_env, "") if password_env else ""  # "": a protocol without login
    if password_env and not password:
        raise InputError(f"set {password_env} to the password the emulator should accept (--password-env)")
    plan = load_faults(faults) if faults is not None else None
    switch_name, space, timing = "emulated", PortSpace.parse(size), resolve_profile("fast")
    kernel = None
    if fabric:
        import functools

        from labctl.emulators.fabric import FabricLayout, KernelFabric, managed_prefix
        from labctl.inventory.schema import load_inventory

        inv = load_inventory(inventory)
        switch_name = switch or _only_switch(inv.switches, inventory)
        if switch_name not in inv.switches:
            raise InputError(
                f"{inventory}: unknown switch {switch_name!r} (known: {', '.join(inv.switches)})"
            )
        space, timing = inv.switches[switch_name].space, inv.profile(profile)
        layout = FabricLayout.of(inv, managed_prefix(inv))
        kernel = functools.partial(KernelFabric, layout)
    if switching_ms is None and kernel is None:
        switching_ms = 25.0
    if switching_ms is not None:
        loss = min(switching_ms, 0.5)
        timing = Profile(
            **{
                **timing.model_dump(),
                "switching_ms": (switching_ms, switching_ms),
                "light_loss_ms": (loss / 5, loss),
            }
        )
    model_profile = timing

    async def serve() -> None:
        model = SwitchModel(switch_name, space, model_profile, random.Random(0))
        if input_dbm is not None:
            model.transmitting.update({p: input_dbm for p in space.ingress})
        light = None
        if kernel is not None:  # the fabric follows the model: cross-connects, then fiber ends after firmware
            light = kernel(model_profile, random.Random(0), lambda event: None)
            if not light.exists():
                raise InputError(
                    f"{inventory}: its fabric is not up; run `labctl emulate fabric up -i {inventory}`"
                )
            await asyncio.to_thread(light.reset)
            light.open()
            light.follow(switch_name, model)
        options = EmulatorOptions(
            host=host, port=port, users={user: password}, faults=plan, session_timeout_s=session_timeout_s
        )
        emulator = front.serve(model, options)
        try:
            await emulator.start()
        except OSError as e:
            raise InputError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        print(
            f"{driver} emulator ({front.protocol}, {space}, switching {model_profile.switching_ms[1]:g} ms"
            + (f", moving {inventory}'s fabric" if kernel is not None else "")
            + f") listening on "
            f"{host}:{emulator.port}; "
            + (f"user {user}, password from ${password_env}; " if password_env else "")
            + "Ctrl-C stops",
            flush=True,
        )
        for endpoint in getattr(emulator, "endpoints", ()):  # front ends with more than one way in
            print(f"  reachable at {endpoint}", flush=True)
        fingerprint = getattr(emulator, "host_key_sha256", None)
        if fingerprint:  # an SSH front end's key lives as long as the server: a client must pin this one
            print(
                f"  host key {fingerprint} (inventory: host_key: pinned, host_key_sha256: {fingerprint})",
                flush=True,
            )
        try:
            await stop.wait()
        finally:
            await emulator.close()
            model.cancel_pending()
            if light is not None:
                light.close()
                await asyncio.to_thread(light.reset)

    asyncio.run(serve())


@emulate_app.command("power-meter")
def emulate_power_meter(
    inventory: InventoryOpt = DEFAULT_INVENTORY,
    meter: Annotated[
        str | None,
        typer.Option("--meter", "-m", help="The inventory's power meter to be (default: the only one)."),
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="Address to bind (default: the meter's `address` in the inventory).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="TCP port (default: the meter's `port`; 0 = pick a free one).")
    ] = None,
    launch_dbm: Annotated[
        float, typer.Option(help="Launch power of every NIC transmitter (dBm), before the switch's loss.")
    ] = -1.0,
) -> None:
    """Serve a Keysight N77xx power meter (SCPI over TCP) whose channels tap the receive fibers of the
    inventory's kernel fabric (`labctl emulate fabric up`, root), until Ctrl-C. Its light is the fabric's
    own: the cross-connects a switch emulator (`labctl emulate ocs --fabric`) programs, read from the
    kernel. Each channel of the meter in the inventory's `power_meters:` must tap a NIC port's receive
    fiber (`{host, nic}`, or the egress `{switch, port}` that feeds one): a controller polls it at its
    address like a meter on the bench."""
    import asyncio
    import signal
    import zlib

    from labctl.emulators.fabric import FabricLayout, managed_prefix
    from labctl.emulators.meter_light import FabricLight
    from labctl.emulators.power_meter import N77xxEmulator
    from labctl.inventory.schema import load_inventory
    from labctl.linux import netns

    inv = load_inventory(inventory)
    meters = inv.model.power_meters
    if not meters:
        raise InputError(f"{inventory}: no `power_meters:` to emulate")
    if meter is None:
        if len(meters) != 1:
            raise InputError(
                f"{inventory}: several power meters ({', '.join(meters)}); pick one with --meter"
            )
        meter = next(iter(meters))
    if meter not in meters:
        raise InputError(f"{inventory}: unknown power meter {meter!r} (known: {', '.join(meters)})")
    spec = meters[meter]
    bind = host if host is not None else (spec.address or "127.0.0.1")
    bind_port = spec.port if port is None else port
    if not 0 <= bind_port <= 65535:
        raise InputError(f"--port {bind_port}: must be 0..65535")
    channels = inv.meter_channels(meter)
    for ch in channels:
        if ch.nic is None:
            raise inv.fail(
                ("power_meters", meter, "channels", str(ch.channel)),
                f"{ch.label} feeds no NIC port: the kernel fabric carries light only into NIC receive fibers",
            )
    layout = FabricLayout.of(inv, managed_prefix(inv))
    if not netns.exists(layout.ocs_netns):
        raise InputError(f"{inventory}: its fabric is not up; run `labctl emulate fabric up -i {inventory}`")

    async def serve() -> None:
        light = FabricLight(layout, [ch.nic for ch in channels if ch.nic is not None], launch_dbm)
        light.open()
        light.attach(asyncio.get_running_loop())
        taps = {ch.channel: light.tap(ch.nic) for ch in channels if ch.nic is not None}
        emulator = N77xxEmulator(taps, host=bind, port=bind_port, seed=zlib.crc32(meter.encode()))
        try:
            try:
                await emulator.start()
            except OSError as e:
                raise InputError(f"cannot listen on {bind}:{bind_port}: {e.strerror or e}") from None
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            print(
                f"{spec.driver} emulator {meter} ({emulator.model}, tapping {inventory}'s fabric: "
                + ", ".join(f"ch {ch.channel} {ch.label}" for ch in channels)
                + f") listening on {bind}:{emulator.port}; Ctrl-C stops",
                flush=True,
            )
            await stop.wait()
        finally:
            await emulator.close()
            light.close()

    asyncio.run(serve())


def _only_switch(switches: Mapping[str, object], inventory: Path) -> str:
    if len(switches) != 1:
        raise InputError(f"{inventory}: several switches ({', '.join(switches)}); pick one with --switch")
    return next(iter(switches))


FabricInventoryOpt = Annotated[
    Path | None,
    typer.Option(
        "--inventory",
        "-i",
        show_default=False,
        help="Lab inventory whose fabric this is (every NIC port needs an IPv4 address/prefix). Default: the "
        "built-in kernel lab, experiments/inventories/emulated.yaml (the Opus testbed as network namespaces "
        "and veths, as `labctl run ... -i experiments/inventories/emulated.yaml` uses it).",
    ),
]


def _fabric_inventory(inventory: Path | None) -> Path:
    """The inventory given, else the built-in kernel lab: the simulated default lab has no addresses."""
    if inventory is not None:
        return inventory
    from labctl.core.shipped import builtin_inventories

    return builtin_inventories()["emulated"]


@fabric_app.command("up")
def fabric_up(
    inventory: FabricInventoryOpt = None,
    profile: Annotated[
        str | None, typer.Option(help="Delay profile the runs will use (checked here; applied by each run).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Build the inventory's fabric (prefix lc-<layout hash>-); runs on this inventory then reuse it.

    Each host namespace also gets a management link to this (root) namespace, as a real lab's hosts have a
    management network beside the OCS data plane: `mgmt0` with 10.254.B.(4K+2)/30, reaching the controller
    side at 10.254.B.(4K+1), for the K-th host (an agent in the namespace reaches a broker listening there).
    B comes from the layout hash, so two labs' fabrics can be up at once; a subnet already in use in this
    namespace is refused. A fabric already up is reset to dark and shown as it is: management links only
    where it has them."""
    import json
    import random

    from labctl.emulators.fabric import FabricLayout, KernelFabric, managed_prefix
    from labctl.inventory.schema import load_inventory

    inv = load_inventory(_fabric_inventory(inventory))
    prof = inv.profile(profile)
    layout = FabricLayout.of(inv, managed_prefix(inv))
    fabric = KernelFabric(layout, prof, random.Random(0), lambda e: None)
    if fabric.exists():
        fabric.reset()
        state = "already up; reset to dark"
    else:
        fabric.create(management=True)
        state = "up"
    # What the kernel has, not what the layout would give: a fabric built without management links (by an
    # older labctl, or by KernelFabric.create() without them) must not advertise addresses nobody answers on.
    management = fabric.management_present()
    if as_json:
        hosts = {
            host: {
                "netns": ns,
                "management": {
                    "host_ip": str(management[host].host_ip.ip),
                    "controller_ip": str(management[host].root_ip.ip),
                    "controller_if": management[host].root_if,
                }
                if host in management
                else None,
            }
            for host, ns in layout.host_netns.items()
        }
        ports = [
            {"port": fp.port.label, "address": fp.port.address, "netns": fp.host_netns} for fp in layout.ports
        ]
        print(json.dumps({"prefix": layout.prefix, "state": state, "hosts": hosts, "ports": ports}, indent=2))
        return
    print(f"fabric {layout.prefix} {state}: namespaces {', '.join(layout.netns_names())}")
    for host, ns in layout.host_netns.items():
        link = management.get(host)
        if link is None:
            print(f"  {host:<8} no management link (netns {ns}; `fabric down` and `up` again to add one)")
        else:
            print(f"  {host:<8} management {link.host_ip.ip} (netns {ns}), controller side {link.root_ip.ip}")
    for fp in layout.ports:
        print(
            f"  {fp.port.label:<22} {fp.port.address:<16} netns {fp.host_netns}  "
            f"fiber {layout.ocs_netns}/{fp.fiber}"
        )


@fabric_app.command("down")
def fabric_down(
    inventory: FabricInventoryOpt = None,
    profile: Annotated[str | None, typer.Option(help="Accepted for symmetry with `up`.")] = None,
) -> None:
    """Remove the inventory's fabric and any fabric left by a run that was killed."""
    from labctl.emulators.fabric import managed_prefix
    from labctl.inventory.schema import load_inventory
    from labctl.linux import netns

    inv = load_inventory(_fabric_inventory(inventory))
    inv.profile(profile)
    removed = netns.cleanup(managed_prefix(inv))
    for stale in netns.stale_run_prefixes():
        removed += netns.cleanup(stale)
    print(f"removed {len(removed)} namespace(s)" + (f": {', '.join(removed)}" if removed else ""))


def register(app: typer.Typer) -> None:
    app.add_typer(emulate_app, name="emulate")
