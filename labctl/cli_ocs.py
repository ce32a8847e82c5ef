"""`labctl ocs …` (drive a switch from the inventory) and `labctl emulate …` (serve protocol emulators)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from labctl.errors import InputError
from labctl.events import Event
from labctl.mapping import Mapping, Patch
from labctl.ocs import ApplyResult, OpticalSwitch, Timed

T = TypeVar("T")

ocs_app = typer.Typer(
    help="Drive an optical circuit switch of the inventory directly: show its patches, connect, disconnect, "
    "apply a mapping file. Every change is validated, diffed against the switch's read-back and verified.",
    no_args_is_help=True,
)
emulate_app = typer.Typer(
    help="Serve protocol-faithful emulators of lab hardware (127.0.0.1 by default), e.g. a TL1 Polatis.",
    no_args_is_help=True,
)

out = Console(soft_wrap=True, emoji=False)

InventoryOpt = Annotated[
    Path,
    typer.Option("--inventory", "-i", help="Lab inventory naming the switch, its address and credentials."),
]
SwitchOpt = Annotated[
    str | None, typer.Option("--switch", "-s", help="Switch name in the inventory (default: the only one).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]


@emulate_app.callback()
def _emulate_group() -> None:
    """Serve protocol emulators."""


def _open_switch(inventory: Path, name: str | None, emit: Callable[[Event], object]) -> OpticalSwitch:
    from labctl.drivers.polatis_tl1 import PolatisTl1Switch
    from labctl.inventory import load_inventory

    inv = load_inventory(inventory)
    if name is None:
        if len(inv.switches) != 1:
            raise InputError(
                f"{inventory}: several switches ({', '.join(inv.switches)}); pick one with --switch"
            )
        name = next(iter(inv.switches))
    spec = inv.switches.get(name)
    if spec is None:
        raise InputError(f"{inventory}: unknown switch {name!r} (known: {', '.join(inv.switches)})")
    if spec.driver == "polatis-tl1":
        if spec.emulate:
            raise InputError(
                f"{inventory}: switch {name} is emulated inside each `labctl run` (emulate: true); to "
                "drive one from here, start `labctl emulate ocs --protocol tl1` and give the switch its "
                "address"
            )
        driver: OpticalSwitch = PolatisTl1Switch.from_spec(name, spec, emit)
        return driver
    raise InputError(
        f"{inventory}: switch {name} uses driver {spec.driver}; `labctl ocs` drives polatis-tl1 switches"
        + (" (a sim switch exists only inside a run)" if spec.driver == "sim" else "")
    )


def _with_switch(
    inventory: Path, name: str | None, action: Callable[[OpticalSwitch], Awaitable[T]]
) -> tuple[OpticalSwitch, T]:
    events: list[Event] = []

    async def main() -> tuple[OpticalSwitch, T]:
        switch = _open_switch(inventory, name, events.append)
        await switch.connect()
        try:
            return switch, await action(switch)
        finally:
            await switch.close()

    return asyncio.run(main())


def _pairs(mapping: Mapping) -> list[list[int]]:
    return [list(p) for p in sorted(mapping)]


def _print_result(switch: OpticalSwitch, verb: str, result: Timed[ApplyResult], as_json: bool) -> None:
    r = result.value
    if as_json:
        print(
            json.dumps(
                {
                    "switch": switch.name,
                    "action": verb,
                    "removed": _pairs(r.removed),
                    "added": _pairs(r.added),
                    "patches": _pairs(r.mapping),
                    "attempts": r.attempts,
                    "elapsed_ns": result.elapsed_ns,
                    "switch_ns": (r.complete_ns - r.command_ns) if r.command_ns and r.complete_ns else None,
                },
                indent=2,
            )
        )
        return
    if not r.removed and not r.added:
        out.print(f"{switch.name}: already as requested, nothing sent ({result.elapsed_ns / 1e6:.1f} ms)")
    else:
        for i, e in sorted(r.removed):
            out.print(f"  - {i:>3} → {e}")
        for i, e in sorted(r.added):
            out.print(f"  + {i:>3} → {e}")
        out.print(
            f"{switch.name}: {verb}: {len(r.removed)} removed, {len(r.added)} added, verified by read-back "
            f"({r.attempts} attempt(s), {result.elapsed_ns / 1e6:.1f} ms)"
        )


@ocs_app.command("show")
def show(
    switch: SwitchOpt = None, inventory: InventoryOpt = Path("inventory.yaml"), as_json: JsonOpt = False
) -> None:
    """Print the switch's patches (ingress → egress), as the switch reports them."""
    sw, result = _with_switch(inventory, switch, lambda s: s.get_mapping())
    if as_json:
        print(
            json.dumps(
                {
                    "switch": sw.name,
                    "size": str(sw.space),
                    "patches": _pairs(result.value),
                    "elapsed_ns": result.elapsed_ns,
                },
                indent=2,
            )
        )
        return
    out.print(f"{sw.name} ({sw.space}): {len(result.value)} patch(es)")
    for i, e in sorted(result.value):
        out.print(f"  {i:>3} → {e}")


@ocs_app.command("connect")
def connect(
    ingress: Annotated[int, typer.Argument(metavar="IN", help="Ingress port (1..N).")],
    egress: Annotated[int, typer.Argument(metavar="OUT", help="Egress port (N+1..N+M).")],
    switch: SwitchOpt = None,
    inventory: InventoryOpt = Path("inventory.yaml"),
    as_json: JsonOpt = False,
) -> None:
    """Patch IN → OUT (whatever either port was patched to before is disconnected)."""
    sw, result = _with_switch(inventory, switch, lambda s: s.apply([(ingress, egress)]))
    _print_result(sw, "connect", result, as_json)


@ocs_app.command("disconnect")
def disconnect(
    ports: Annotated[list[int], typer.Argument(metavar="PORT…", help="Ports to leave unpatched.")],
    switch: SwitchOpt = None,
    inventory: InventoryOpt = Path("inventory.yaml"),
    as_json: JsonOpt = False,
) -> None:
    """Remove every patch that uses one of the ports."""
    sw, result = _with_switch(inventory, switch, lambda s: s.disconnect(ports))
    _print_result(sw, "disconnect", result, as_json)


def load_mapping_file(path: Path) -> tuple[list[Patch], list[int] | None]:
    """A mapping file: `patches: [[in, out], …]` and optionally `scope: [port, …]` (ports to leave unpatched
    unless listed); a bare list of pairs also works."""
    from labctl.yamlio import load_yaml

    src = load_yaml(path, "mapping file")
    data: Any = src.data
    if isinstance(data, list):
        data = {"patches": data}
    if not isinstance(data, dict) or "patches" not in data:
        raise InputError(f"{path}: expected `patches: [[ingress, egress], ...]` (and optionally `scope:`)")
    unknown = set(data) - {"patches", "scope"}
    if unknown:
        raise InputError(f"{src.where((sorted(unknown)[0],))}: unknown field {sorted(unknown)[0]!r}")
    patches: list[Patch] = []
    for i, item in enumerate(data["patches"] or []):
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not all(isinstance(p, int) and not isinstance(p, bool) for p in item)
        ):
            raise InputError(f"{src.where(('patches', i))}: patches[{i}]: {item!r} is not [ingress, egress]")
        patches.append((item[0], item[1]))
    scope = data.get("scope")
    if scope is not None and (
        not isinstance(scope, list) or not all(isinstance(p, int) and not isinstance(p, bool) for p in scope)
    ):
        raise InputError(f"{src.where(('scope',))}: scope: expected a list of port numbers")
    return patches, scope


@ocs_app.command("apply")
def apply(
    file: Annotated[
        Path, typer.Argument(help="Mapping file: `patches: [[in, out], ...]`, optional `scope:`.")
    ],
    switch: SwitchOpt = None,
    inventory: InventoryOpt = Path("inventory.yaml"),
    as_json: JsonOpt = False,
) -> None:
    """Make the switch match a mapping file: only ports whose pairing changes are touched; verified."""
    patches, scope = load_mapping_file(file)
    sw, result = _with_switch(inventory, switch, lambda s: s.apply(patches, scope=scope))
    _print_result(sw, "apply", result, as_json)


@emulate_app.command("ocs")
def emulate_ocs(
    protocol: Annotated[str, typer.Option(help="Control protocol to serve (tl1).")] = "tl1",
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (0 = pick a free one and print it).")] = 3082,
    size: Annotated[str, typer.Option(help="Switch size NxM: ingress 1..N, egress N+1..N+M.")] = "32x32",
    switching_ms: Annotated[float, typer.Option(help="Modeled switching time per command.")] = 25.0,
    faults: Annotated[
        Path | None,
        typer.Option(help="YAML fault plan (drops, delays, DENY probability, garbage, state loss)."),
    ] = None,
    user: Annotated[str, typer.Option(help="User the emulator accepts in ACT-USER.")] = "admin",
    password_env: Annotated[
        str, typer.Option(help="Environment variable holding the password it accepts.")
    ] = "POLATIS_PASSWORD",
    input_dbm: Annotated[
        float | None,
        typer.Option(help="Light on every ingress port (dBm), as if transceivers were attached."),
    ] = -1.0,
    session_timeout_s: Annotated[
        float | None, typer.Option(help="Hang up a session idle this long (default: never).")
    ] = None,
) -> None:
    """Serve a protocol-faithful OCS emulator until Ctrl-C; drive it with `labctl ocs` or any TL1 client."""
    from labctl.emulators.tl1 import Tl1Emulator, load_faults
    from labctl.mapping import PortSpace
    from labctl.models.switch import SwitchModel
    from labctl.profiles import Profile, resolve_profile

    if protocol.lower() != "tl1":
        raise InputError(f"--protocol {protocol}: only tl1 is emulated so far")
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
        emulator = Tl1Emulator(
            model,
            users={user: password},
            host=host,
            port=port,
            faults=plan,
            session_timeout_s=session_timeout_s,
        )
        try:
            await emulator.start()
        except OSError as e:
            raise InputError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        print(
            f"TL1 emulator ({space}, switching {switching_ms:g} ms) listening on {host}:{emulator.port}; "
            f"user {user}, password from ${password_env}; Ctrl-C stops",
            flush=True,
        )
        try:
            await stop.wait()
        finally:
            await emulator.close()
            model.cancel_pending()

    asyncio.run(serve())
