"""A lab: the switches and probes the controller drives, built from an inventory.

Which implementation backs each capability is decided here, once, from the inventory; the controller
only sees `OpticalSwitch` and `Probe` objects. The simulated lab (the default) wires `SwitchModel`s
to a `SimFabric` of NIC port models and reads them with simulated probes.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from labctl.errors import InputError
from labctl.experiment import ProbeSettings
from labctl.inventory import Inventory, SwitchSpec
from labctl.ocs import EventSink, OpticalSwitch, TimeoutPolicy
from labctl.profiles import Profile
from labctl.sampling import CircuitProbe, Probe


@dataclass
class Lab:
    switches: dict[str, OpticalSwitch]
    probes: list[Probe]
    circuit_probes: list[CircuitProbe]
    close_hooks: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for hook in self.close_hooks:
            hook()


@dataclass(frozen=True)
class LabContext:
    inventory: Inventory
    profile: Profile
    rng: random.Random
    emit: EventSink
    probes: ProbeSettings


def build_simulated_lab(ctx: LabContext) -> Lab:
    from labctl.drivers.sim import SimSwitch
    from labctl.sim.fabric import SimFabric
    from labctl.sim.probes import SimLinkProbe, SimRxPowerProbe, SimTrafficProbe
    from labctl.sim.switch_model import SwitchModel

    inv = ctx.inventory
    models = {
        name: SwitchModel(name, spec.space, ctx.profile, ctx.rng) for name, spec in inv.switches.items()
    }
    fabric = SimFabric(inv, models, ctx.profile, ctx.rng)
    switches: dict[str, OpticalSwitch] = {
        name: SimSwitch(model, ctx.emit, _timeouts(inv.switches[name])) for name, model in models.items()
    }
    report_ns = round(ctx.probes.report_interval_ms * 1e6)
    traffic = SimTrafficProbe(
        fabric,
        inv.ports,
        interval_us=ctx.probes.traffic_interval_us,
        timeout_us=ctx.probes.traffic_timeout_us,
        report_interval_ns=report_ns,
    )
    probes: list[Probe] = [
        SimLinkProbe(fabric, inv.ports),
        SimRxPowerProbe(
            fabric,
            inv.ports,
            hz=ctx.probes.rx_power_hz,
            deadband_db=ctx.probes.rx_power_deadband_db,
            report_interval_ns=report_ns,
        ),
        traffic,
    ]
    hooks: list[Callable[[], None]] = [fabric.cancel_pending, *(m.cancel_pending for m in models.values())]
    return Lab(switches=switches, probes=probes, circuit_probes=[traffic], close_hooks=hooks)


def _timeouts(spec: SwitchSpec) -> TimeoutPolicy:
    return TimeoutPolicy(connect_s=spec.timeout_s, operation_s=spec.timeout_s)


# Which lab backs an inventory: every switch driver must belong to the same kind of lab.
LAB_KINDS: dict[str, tuple[frozenset[str], Callable[[LabContext], Lab]]] = {
    "simulated": (frozenset({"sim"}), build_simulated_lab),
}


def build_lab(ctx: LabContext) -> Lab:
    drivers = {spec.driver for spec in ctx.inventory.switches.values()}
    for _kind, (accepted, factory) in LAB_KINDS.items():
        if drivers <= accepted:
            return factory(ctx)
    raise InputError(
        f"{ctx.inventory.path}: switch drivers {sorted(drivers)} need a lab kind this version cannot build "
        f"(available: {', '.join(f'{k} ({sorted(a)})' for k, (a, _) in LAB_KINDS.items())})"
    )
