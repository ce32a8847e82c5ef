"""The agents lab: the simulated lab with its probes on `labctl agent`s over MQTT (labctl.agents).

The switch and NIC behaviour model (the world) stays in the controller with the switch drivers; each
host's agent samples its own ports from a mirror of it, fed over the broker (`labctl/<lab>/_world`), and
streams its events back. The same run on `kind: simulated` gives the same breakdown up to sampling and
transport effects (tests/unit/test_agents.py compares them).
"""

from __future__ import annotations

import functools

from labctl.agents.broker import BrokerSettings
from labctl.agents.hub import run_probes_on_agents
from labctl.agents.wire import WorldItem
from labctl.clock import now_ns
from labctl.events import Kind
from labctl.inventory import Inventory, NicPort
from labctl.labs.base import Lab, LabContext, LabKind, require_transport
from labctl.labs.world import (
    add_power_meters,
    check_power_meters,
    check_switches_over_models,
    drive_models,
    switch_models,
)
from labctl.models.fabric import TRANSPORT, SimFabric
from labctl.models.probes import model_sites
from labctl.probes import ProbeContext
from labctl.sampling import ProbeSettings

PROBES = ("model-link", "rx-power", "model-traffic")
"""What each agent runs, on its mirror of the world."""


def agent_context(
    inventory: Inventory, host: str, settings: ProbeSettings, mirror: SimFabric | None
) -> ProbeContext:
    """An agent's probes read its mirror of the controller's model: this host's NIC ports, a transceiver
    per port that the mirror's light drives; the traffic probe knows every port as a possible peer."""
    assert mirror is not None, "modeled probes: the agent mirrors the controller's world"
    sites = model_sites(mirror, inventory.ports)
    mine = [site for site in sites if site.port.host == host]
    return ProbeContext(settings, ports=mine, peers=sites, world=mirror)


def check(inventory: Inventory) -> None:
    if inventory.model.broker is None:
        raise inventory.fail(("broker",), "an agents lab needs a `broker:` section (url: mqtt://HOST:PORT)")
    check_switches_over_models(inventory, "agents")
    check_power_meters(inventory, "agents", over_models=True)
    BrokerSettings.check_names(inventory)


def build(ctx: LabContext) -> Lab:
    require_transport(ctx.probes, "agents")
    inv = ctx.inventory
    # Light changes are announced when scheduled, so the agents' mirrors apply them at their model time
    # instead of a broker hop after it (labctl.agents.agent.FabricMirror).
    models = switch_models(ctx)
    fabric = SimFabric(inv, models, ctx.profile, ctx.rng)
    lab = Lab(close_hooks=[fabric.cancel_pending])
    drive_models(ctx, models, lab)
    hub = run_probes_on_agents(lab, ctx, PROBES)
    add_power_meters(lab, ctx, models)  # polled from the controller, like the switches
    by_rx = {(p.switch, p.rx): p for p in inv.ports}
    by_tx = {(p.switch, p.tx): p for p in inv.ports}
    # A change announced before it happens has no settle time yet (the fabric draws it when the light
    # arrives): the mirror ramps over the profile's mid value until the change comes with the drawn one.
    settle_mid_ns = ctx.profile.mid_ns("optical_settle_ms")

    def light_item(port: NicPort) -> WorldItem:
        st = fabric.state(port)
        peer = st.light_from.source if st.light_from is not None else None
        return WorldItem("light", port.source, st.light_t_ns, 0, peer, st.settle_ns, st.rx_level_dbm)

    def on_light(switch: str, egress: int, ingress: int | None, t_ns: int) -> None:
        port = by_rx.get((switch, egress))
        if port is not None:
            hub.world(light_item(port))

    def on_schedule(switch: str, egress: int, ingress: int | None, t_ns: int) -> None:
        port = by_rx.get((switch, egress))
        if port is None:
            return
        peer = by_tx.get((switch, ingress)) if ingress is not None else None
        level = fabric.state(port).rx_level_dbm
        settle = settle_mid_ns if peer is not None else 0
        hub.world(WorldItem("light", port.source, t_ns, 0, peer.source if peer else None, settle, level))

    def on_transition(port: NicPort, kind: str, value: int, t_ns: int) -> None:
        hub.world(WorldItem(kind, port.source, t_ns, value))

    def snapshot() -> list[WorldItem]:
        t = now_ns()
        items = []
        for port in inv.ports:
            st = fabric.state(port)
            items.append(light_item(port))
            for kind, value in (
                (Kind.LINK_FIRMWARE, st.firmware),
                (Kind.CARRIER, st.carrier),
                (TRANSPORT, st.transport),
            ):
                items.append(WorldItem(kind, port.source, t, value))
        return items

    for name, model in models.items():  # after the fabric's listener: its port state is already updated
        model.add_listener(functools.partial(on_light, name))
        model.add_schedule_listener(functools.partial(on_schedule, name))
    fabric.add_listener(on_transition)
    hub.world_snapshot = snapshot
    return lab


KIND = LabKind(
    "agents",
    "the simulated lab's models in the controller, each host's probes on its `labctl agent` over MQTT",
    check,
    build,
    agent_probes=PROBES,
    agent_context=agent_context,
)
