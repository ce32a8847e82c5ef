"""The behaviour-model side that every lab but a real one shares: one `SwitchModel` per inventory switch,
each driven by its driver over that model (the model itself for `sim`, the driver against its protocol
emulator for `emulate: true`), and model-driven transceivers for the Rx-power poller."""

from __future__ import annotations

from collections.abc import Sequence

from labctl.inventory import Inventory
from labctl.labs.base import Lab, LabContext
from labctl.models.switch import SwitchModel
from labctl.probes import ProbeContext, probe_kinds
from labctl.sampling import Probe
from labctl.switches import emulate_switch, switch_drivers


def check_switches_over_models(inventory: Inventory, kind: str) -> None:
    """Every switch must be one this lab can run as a model: a driver with an emulator, set to use it."""
    for name, spec in inventory.switches.items():
        entry = switch_drivers.get(spec.driver)
        if entry.emulate is None:
            raise inventory.fail(
                ("switches", name, "driver"),
                f"a {kind} lab runs its switches as models, and the {spec.driver} driver has no emulator",
            )
        if not spec.over_model:
            raise inventory.fail(
                ("switches", name),
                f"a {spec.driver} switch at an address cannot light the modeled NIC ports of a {kind} lab; "
                "set `emulate: true` to drive its emulator instead",
            )


def no_broker(inventory: Inventory, kind: str) -> None:
    if inventory.model.broker is not None:
        from labctl.labs import kinds_with_agents

        raise inventory.fail(
            ("broker",),
            f"a {kind} lab runs in one process; a broker is for a lab whose hosts run agents: set `kind:` to "
            f"one of {', '.join(kinds_with_agents())}",
        )


def switch_models(ctx: LabContext) -> dict[str, SwitchModel]:
    spaces = {name: spec.space for name, spec in ctx.inventory.switches.items()}
    return SwitchModel.many(spaces, ctx.profile, ctx.rng)


def drive_models(ctx: LabContext, models: dict[str, SwitchModel], lab: Lab) -> None:
    """Each switch's driver over its model (its emulator, if any, serves while the switch is connected)."""
    for name, model in models.items():
        lab.switches[name] = emulate_switch(name, ctx.inventory.switches[name], model, ctx.emit)
    lab.close_hooks.extend(model.cancel_pending for model in models.values())


def build_probes(names: Sequence[str], ctx: ProbeContext) -> list[Probe]:
    return [probe_kinds.get(name).build(ctx) for name in names]
