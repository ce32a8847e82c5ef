"""The behaviour-model side that every lab but a real one shares: one `SwitchModel` per inventory switch,
each driven by its driver over that model (the model itself for `sim`, the driver against its protocol
emulator for `emulate: true`), and model-driven transceivers for the Rx-power poller."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from labctl.core.errors import InputError
from labctl.inventory.schema import Inventory
from labctl.labs.base import Lab, LabContext
from labctl.ocs.switches import emulate_switch, switch_drivers

if TYPE_CHECKING:  # the models and probes are imported by what builds a lab: a lab kind's check needs none
    from labctl.models.switch import SwitchModel
    from labctl.probes.base import ProbeContext
    from labctl.probes.sampling import Probe, ProbeSettings

__all__ = [  # the public surface (docs/architecture.md, "Public surface"); the rest is internal
    "add_power_meters",
    "build_probes",
    "check_power_meters",
    "check_switches_over_models",
    "drive_models",
    "no_broker",
    "no_extra_probes",
    "switch_models",
]


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
    from labctl.models.switch import SwitchModel

    spaces = {name: spec.space for name, spec in ctx.inventory.switches.items()}
    return SwitchModel.many(spaces, ctx.profile, ctx.rng)


def drive_models(ctx: LabContext, models: dict[str, SwitchModel], lab: Lab) -> None:
    """Each switch's driver over its model (its emulator, if any, serves while the switch is connected)."""
    for name, model in models.items():
        lab.switches[name] = emulate_switch(name, ctx.inventory.switches[name], model, ctx.emit)
    lab.close_hooks.extend(model.cancel_pending for model in models.values())


def build_probes(names: Sequence[str], ctx: ProbeContext, *, extra: bool = False) -> list[Probe]:
    """The probes of these names on `ctx`; with `extra`, also the ones the experiment names
    (`probes.extra`), each once."""
    from labctl.probes.base import probe_kinds

    wanted = list(dict.fromkeys([*names, *(ctx.settings.extra if extra else ())]))
    return [probe_kinds.get(name).build(ctx) for name in wanted]


def no_extra_probes(settings: ProbeSettings, kind: str) -> None:
    """One line if the experiment names extra probes where this lab kind cannot run them (its agents run
    an allow-list of probes, the lab kind's own)."""
    if settings.extra:
        raise InputError(
            f"probes.extra: {', '.join(settings.extra)}: lab kind {kind} runs its agents' own probes only "
            "(extra probes run on the in-process lab kinds: simulated, kernel)"
        )


def check_power_meters(inventory: Inventory, kind: str, *, over_models: bool) -> None:
    """Power meters this lab can poll: emulated ones reading its switch models (`over_models`), or meters
    at their addresses (a real lab)."""
    for name, spec in inventory.model.power_meters.items():
        if over_models and not spec.emulate:
            raise inventory.fail(
                ("power_meters", name),
                f"the light of a {kind} lab exists only in its switch models: set `emulate: true` to poll an "
                "N77xx emulator that reads them",
            )
        if not over_models and spec.emulate:
            raise inventory.fail(
                ("power_meters", name),
                f"a {kind} lab polls power meters at their addresses: drop `emulate: true`, give `address`",
            )


def add_power_meters(lab: Lab, ctx: LabContext, models: dict[str, SwitchModel] | None) -> None:
    """The power-meter probe on the inventory's meters (none: nothing): an emulated meter is an N77xx
    emulator of the switch models at the mapped ports, served from the lab's start to its close; the probe
    reaches every meter over TCP either way."""
    meters = ctx.inventory.model.power_meters
    if not meters:
        return
    from labctl.probes.base import MeterSite, ProbeContext

    sites = []
    for name, spec in meters.items():
        channels = ctx.inventory.meter_channels(name)
        if spec.emulate:
            from labctl.emulators.power_meter import meter_emulator

            assert models is not None, "checked: emulated meters only where the lab has switch models"
            emulator = meter_emulator(name, channels, models)
            lab.start_hooks.append(emulator.start)
            lab.async_close_hooks.append(emulator.close)
            # Its port exists once it has started: asked for when the probe starts.
            sites.append(MeterSite(name, spec, channels, functools.partial(getattr, emulator, "address")))
        else:
            assert spec.address is not None
            sites.append(MeterSite(name, spec, channels, _fixed((spec.address, spec.port))))
    lab.probes.extend(build_probes(("power-meter",), ProbeContext(ctx.probes, meters=sites)))


def _fixed(address: tuple[str, int]) -> Callable[[], tuple[str, int]]:
    return lambda: address
