"""`labctl emulate …`: serve emulated lab hardware: a switch's protocol emulator (`ocs DRIVER`), the
kernel-real fabric (`fabric up|down`, root)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
from pathlib import Path
from typing import Annotated

import typer

from labctl.cli.common import DEFAULT_INVENTORY, InventoryOpt
from labctl.errors import InputError

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
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[
        int | None, typer.Option(help="TCP port (0 = pick a free one and print it; default: the protocol's).")
    ] = None,
    size: Annotated[str, typer.Option(help="Switch size NxM: ingress 1..N, egress N+1..N+M.")] = "32x32",
    switching_ms: Annotated[float, typer.Option(help="Modeled switching time per command.")] = 25.0,
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
) -> None:
    """Serve a switch's protocol emulator until Ctrl-C, around the same switch model the simulated lab uses;
    drive it with `labctl ocs` (an inventory switch with this address) or any client of the protocol."""
    from labctl.emulators.core import load_faults
    from labctl.mapping import PortSpace
    from labctl.models.switch import SwitchModel
    from labctl.profiles import Profile, resolve_profile
    from labctl.switches import EmulatorOptions, switch_drivers

    serving = {name: e.emulator for name, e in switch_drivers.all().items() if e.emulator is not None}
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
    if switching_ms < 0:
        raise InputError(f"--switching-ms {switching_ms}: must be >= 0")
    password = os.environ.get(password_env)
    if not password:
        raise InputError(f"set {password_env} to the password the emulator should accept (--password-env)")
    space = PortSpace.parse(size)
    plan = load_faults(faults) if faults is not None else None
    loss = min(switching_ms, 0.5)
    profile = Profile(
        **{
            **resolve_profile("fast").model_dump(),
            "switching_ms": (switching_ms, switching_ms),
            "light_loss_ms": (loss / 5, loss),
        }
    )

    async def serve() -> None:
        model = SwitchModel("emulated", space, profile, random.Random(0))
        if input_dbm is not None:
            model.transmitting.update({p: input_dbm for p in space.ingress})
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
            f"{driver} emulator ({front.protocol}, {space}, switching {switching_ms:g} ms) listening on "
            f"{host}:{emulator.port}; user {user}, password from ${password_env}; Ctrl-C stops",
            flush=True,
        )
        try:
            await stop.wait()
        finally:
            await emulator.close()
            model.cancel_pending()

    asyncio.run(serve())


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


def register(app: typer.Typer) -> None:
    app.add_typer(emulate_app, name="emulate")
