"""The simulated lab (the default): in-process switch and NIC models on real asyncio time.

Each switch is a `SwitchModel` behind its driver (the sim driver, or a driver with `emulate: true` against
its protocol emulator over real TCP); a `SimFabric` of NIC port models follows the switches' light; the
probes read the NIC model (link, traffic) and model-driven transceivers (Rx power, through the real
poller and DOM decoder). No root, no hardware.
"""

from __future__ import annotations

from labctl.inventory.schema import Inventory
from labctl.labs.base import Lab, LabContext, LabKind, require_transport
from labctl.labs.world import (
    add_power_meters,
    build_probes,
    check_power_meters,
    check_switches_over_models,
    drive_models,
    no_broker,
    switch_models,
)

PROBES = ("model-link", "rx-power", "model-traffic")
TRAFFIC_PROBE = {"udp": "model-traffic", "rdma": "model-rc-traffic"}
"""The probe that carries the ping-pong marking t5, by the experiment's `probes.transport`."""


def check(inventory: Inventory) -> None:
    no_broker(inventory, "simulated")
    check_switches_over_models(inventory, "simulated")
    check_power_meters(inventory, "simulated", over_models=True)


def build(ctx: LabContext) -> Lab:
    # Imported here: checking an inventory (`labctl inventory check`) loads no model or probe (numpy).
    from labctl.models.fabric import SimFabric
    from labctl.models.link_control import ModelLinkControl
    from labctl.probes.base import ProbeContext
    from labctl.probes.model import model_sites

    require_transport(ctx.probes, "simulated", tuple(TRAFFIC_PROBE))
    models = switch_models(ctx)
    fabric = SimFabric(ctx.inventory, models, ctx.profile, ctx.rng)
    control = ModelLinkControl.of_fabric(fabric, ctx.inventory)
    lab = Lab(close_hooks=[fabric.cancel_pending], link_control=control)
    drive_models(ctx, models, lab)
    sites = model_sites(fabric, ctx.inventory.ports)
    probes = tuple(
        TRAFFIC_PROBE[ctx.probes.transport] if name == "model-traffic" else name for name in PROBES
    )
    lab.probes = build_probes(probes, ProbeContext(ctx.probes, ports=sites, world=fabric), extra=True)
    add_power_meters(lab, ctx, models)
    return lab


KIND = LabKind(
    "simulated",
    "in-process switch and NIC models on real asyncio time (no root, no hardware)",
    check,
    build,
    no_link_control=None,
)
