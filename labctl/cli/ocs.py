"""`labctl ocs …`: drive a switch of the inventory directly (show, connect, disconnect, apply a file)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.markup import escape

from labctl.cli.common import DEFAULT_INVENTORY, InventoryOpt, JsonOpt, out
from labctl.core.errors import InputError

if TYPE_CHECKING:  # the switch stack is imported by the commands that drive a switch, not by `labctl --help`
    from labctl.core.events import Event
    from labctl.inventory.mapping import Mapping, Patch
    from labctl.ocs.protocol import ApplyResult, OpticalSwitch, Timed

T = TypeVar("T")

ocs_app = typer.Typer(
    help="Drive an optical circuit switch of the inventory directly: show its patches, connect, disconnect, "
    "apply a mapping file. Every change is validated, diffed against the switch's read-back and verified.",
    no_args_is_help=True,
)

SwitchOpt = Annotated[
    str | None, typer.Option("--switch", "-s", help="Switch name in the inventory (default: the only one).")
]


def _open_switch(inventory: Path, name: str | None, emit: Callable[[Event], object]) -> OpticalSwitch:
    """The driver of an inventory switch at an address (any registered driver that has one)."""
    from labctl.inventory.schema import load_inventory
    from labctl.ocs.switches import open_switch

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
    try:
        return open_switch(name, spec, emit)
    except InputError as e:
        raise InputError(f"{inventory}: {e}") from None


def _with_switch(
    inventory: Path, name: str | None, action: Callable[[OpticalSwitch], Awaitable[T]]
) -> tuple[OpticalSwitch, T]:
    import asyncio

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
    switch: SwitchOpt = None, inventory: InventoryOpt = DEFAULT_INVENTORY, as_json: JsonOpt = False
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
    inventory: InventoryOpt = DEFAULT_INVENTORY,
    as_json: JsonOpt = False,
) -> None:
    """Patch IN → OUT (whatever either port was patched to before is disconnected)."""
    from labctl.ocs.protocol import send_mapping

    sw, result = _with_switch(inventory, switch, lambda s: send_mapping(s, [(ingress, egress)]))
    _print_result(sw, "connect", result, as_json)


@ocs_app.command("disconnect")
def disconnect(
    ports: Annotated[list[int], typer.Argument(metavar="PORT…", help="Ports to leave unpatched.")],
    switch: SwitchOpt = None,
    inventory: InventoryOpt = DEFAULT_INVENTORY,
    as_json: JsonOpt = False,
) -> None:
    """Remove every patch that uses one of the ports."""
    from labctl.ocs.protocol import send_mapping

    sw, result = _with_switch(inventory, switch, lambda s: send_mapping(s, (), scope=ports))
    _print_result(sw, "disconnect", result, as_json)


def load_mapping_file(path: Path) -> tuple[list[Patch], list[int] | None]:
    """A mapping file: `patches: [[in, out], …]` and optionally `scope: [port, …]` (ports to leave unpatched
    unless listed); a bare list of pairs also works."""
    from labctl.core.yamlio import load_yaml

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
        Path,
        typer.Argument(
            help=escape("Mapping file: `patches: [[in, out], ...]`, optional `scope: [port, ...]`.")
        ),
    ],
    switch: SwitchOpt = None,
    inventory: InventoryOpt = DEFAULT_INVENTORY,
    as_json: JsonOpt = False,
) -> None:
    """Make the switch match a mapping file: only ports whose pairing changes are touched; verified."""
    from labctl.ocs.protocol import send_mapping

    patches, scope = load_mapping_file(file)
    sw, result = _with_switch(inventory, switch, lambda s: send_mapping(s, patches, scope=scope))
    _print_result(sw, "apply", result, as_json)


def register(app: typer.Typer) -> None:
    app.add_typer(ocs_app, name="ocs")
