"""A lab: the switches and probes the controller drives, built from an inventory.

Which implementation backs each capability is decided here, once, from the inventory; the controller
only sees `OpticalSwitch` and `Probe` objects. The simulated lab (the default) wires `SwitchModel`s
to a `SimFabric` of NIC port models and reads them with simulated probes.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from labctl.errors import InputError
from labctl.experiment import ProbeSettings
from labctl.inventory import Inventory, Secret, SecretRef, SwitchSpec
from labctl.models.switch import SwitchModel
from labctl.ocs import EventSink, OpticalSwitch, TimeoutPolicy
from labctl.profiles import Profile
from labctl.sampling import CircuitProbe, Probe


@runtime_checkable
class ReconfigWindow(Protocol):
    """A probe that samples or reports harder while a reconfiguration is in flight (the carrier poll, dense
    Rx-power reports until the light is seen back)."""

    def open_window(self, sources: Collection[str] | None = None) -> None: ...

    def close_window(self) -> None: ...


@dataclass
class Lab:
    switches: dict[str, OpticalSwitch]
    probes: list[Probe]
    circuit_probes: list[CircuitProbe]
    close_hooks: list[Callable[[], None]] = field(default_factory=list)
    start_hooks: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    """Run before any switch connects: servers the lab hosts in-process (e.g. protocol emulators)."""
    async_close_hooks: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    """Run in reverse order by `aclose()`, after the switches have closed."""
    window_probes: list[ReconfigWindow] = field(default_factory=list)
    """Told by the controller when each reconfiguration starts and ends (affected port sources)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Merged into run.json at the end of the run (e.g. agents' `clock_offsets`)."""

    def close(self) -> None:
        for hook in self.close_hooks:
            hook()

    async def start(self) -> None:
        for hook in self.start_hooks:
            await hook()

    async def aclose(self) -> None:
        for hook in reversed(self.async_close_hooks):
            await hook()


@dataclass(frozen=True)
class LabContext:
    inventory: Inventory
    profile: Profile
    rng: random.Random
    emit: EventSink
    probes: ProbeSettings


def build_simulated_lab(ctx: LabContext) -> Lab:
    from labctl.drivers.sim import SimSwitch
    from labctl.models.fabric import SimFabric
    from labctl.models.probes import SimLinkProbe, SimRxPowerProbe, SimTrafficProbe

    inv = ctx.inventory
    models = {
        name: SwitchModel(name, spec.space, ctx.profile, ctx.rng) for name, spec in inv.switches.items()
    }
    fabric = SimFabric(inv, models, ctx.profile, ctx.rng)
    switches: dict[str, OpticalSwitch] = {
        name: SimSwitch(model, ctx.emit, switch_timeouts(inv.switches[name]))
        for name, model in models.items()
    }
    report_ns = round(ctx.probes.report_interval_ms * 1e6)
    traffic = SimTrafficProbe(
        fabric,
        inv.ports,
        interval_us=ctx.probes.traffic_interval_us,
        timeout_us=ctx.probes.traffic_timeout_us,
        report_interval_ns=report_ns,
    )
    rx_power = SimRxPowerProbe(
        fabric,
        inv.ports,
        hz=ctx.probes.rx_power_hz,
        deadband_db=ctx.probes.rx_power_deadband_db,
        report_interval_ns=report_ns,
    )
    probes: list[Probe] = [SimLinkProbe(fabric, inv.ports), rx_power, traffic]
    hooks: list[Callable[[], None]] = [fabric.cancel_pending, *(m.cancel_pending for m in models.values())]
    return Lab(
        switches=switches,
        probes=probes,
        circuit_probes=[traffic],
        close_hooks=hooks,
        window_probes=[rx_power],
    )


def switch_timeouts(spec: SwitchSpec) -> TimeoutPolicy:
    return TimeoutPolicy(connect_s=spec.timeout_s, operation_s=spec.timeout_s)


def tl1_emulated_switch(
    name: str, spec: SwitchSpec, model: SwitchModel, ctx: LabContext, lab: Lab
) -> OpticalSwitch:
    """The real TL1 driver over TCP to an in-process TL1 emulator (127.0.0.1, ephemeral port) of `model`.

    The emulator starts with the lab (a start hook) and closes with it. Without `user`/`password` in the
    inventory a one-time password is generated for the run, so the login path is always exercised.
    """
    from labctl.drivers.polatis_tl1 import PolatisTl1Switch, Tl1Endpoint
    from labctl.emulators.tl1 import Tl1Emulator

    user = spec.user or "admin"
    password: SecretRef | Secret = spec.password or Secret(
        "LABCTL_EMULATOR_ONE_TIME_PASSWORD", secrets.token_urlsafe(18)
    )
    emulator = Tl1Emulator(model, users={})
    driver = PolatisTl1Switch(
        name,
        spec.space,
        endpoint=Tl1Endpoint("127.0.0.1", 0),
        user=user,
        password=password,
        emit=ctx.emit,
        timeouts=switch_timeouts(spec),
    )

    async def start() -> None:
        secret = password.resolve(f"switch {name}") if isinstance(password, SecretRef) else password
        emulator.add_user(user, secret.reveal())
        await emulator.start()
        driver.endpoint = Tl1Endpoint(*emulator.address)

    lab.start_hooks.append(start)
    lab.async_close_hooks.append(emulator.close)
    switch: OpticalSwitch = driver
    return switch


def build_tl1_emulated_lab(ctx: LabContext) -> Lab:
    """The simulated lab, with each `polatis-tl1` + `emulate: true` switch behind an in-process TL1
    emulator around the same SwitchModel that lights the NIC models; the controller drives it with the
    real TL1 driver over TCP."""
    from labctl.drivers.sim import SimSwitch

    inv = ctx.inventory
    for name, spec in inv.switches.items():
        if spec.driver == "polatis-tl1" and not spec.emulate:
            raise InputError(
                f"{inv.path}: switch {name}: a real polatis-tl1 switch cannot light simulated NIC ports; "
                "set `emulate: true` to drive an in-process TL1 emulator instead"
            )
    lab = build_simulated_lab(ctx)
    for name, spec in inv.switches.items():
        if spec.driver == "polatis-tl1":
            sim = lab.switches[name]
            assert isinstance(sim, SimSwitch)
            lab.switches[name] = tl1_emulated_switch(name, spec, sim.model, ctx, lab)
    return lab


# Which lab backs an inventory: every switch driver must belong to the same kind of lab.
LAB_KINDS: dict[str, tuple[frozenset[str], Callable[[LabContext], Lab]]] = {
    "simulated": (frozenset({"sim"}), build_simulated_lab),
    "simulated+tl1-emulator": (frozenset({"sim", "polatis-tl1"}), build_tl1_emulated_lab),
}


def build_lab(ctx: LabContext) -> Lab:
    if ctx.inventory.model.broker is not None:  # probes on `labctl agent`s over MQTT (labctl.agents)
        from labctl.agents import build_agent_lab

        return build_agent_lab(ctx)
    if ctx.inventory.model.fabric == "emulated":  # chosen explicitly by the inventory, never guessed
        from labctl.labs.kernel import build_emulated_lab

        return build_emulated_lab(ctx)
    drivers = {spec.driver for spec in ctx.inventory.switches.values()}
    for _kind, (accepted, factory) in LAB_KINDS.items():
        if drivers <= accepted:
            return factory(ctx)
    raise InputError(
        f"{ctx.inventory.path}: switch drivers {sorted(drivers)} need a lab kind this version cannot build "
        f"(available: {', '.join(f'{k} ({sorted(a)})' for k, (a, _) in LAB_KINDS.items())})"
    )
