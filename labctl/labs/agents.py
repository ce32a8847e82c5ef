"""The agents lab: the simulated lab with its probes on `labctl agent`s over MQTT (labctl.agents).

The switch and NIC behaviour model (the world) stays in the controller with the switch drivers; each
host's agent samples its own ports from a mirror of it, fed over the broker (`labctl/<lab>/_world`), and
streams its events back. The same run on `kind: simulated` gives the same breakdown up to sampling and
transport effects (tests/integration/test_agents.py compares them).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from labctl.agents.broker import BrokerSettings
from labctl.agents.hub import run_probes_on_agents
from labctl.agents.linkctl import AgentLinkControl
from labctl.agents.wire import ANNOUNCED, HAPPENS, WITHDRAWN, WorldItem
from labctl.core.clock import now_ns
from labctl.core.events import Kind
from labctl.inventory.mapping import Mapping, diff_mapping, ports_of
from labctl.inventory.schema import Inventory, NicPort
from labctl.labs.base import Lab, LabContext, LabKind, require_transport
from labctl.labs.world import (
    add_power_meters,
    check_power_meters,
    check_switches_over_models,
    drive_models,
    no_extra_probes,
    switch_models,
)
from labctl.models.fabric import TRANSPORT, SimFabric
from labctl.models.link_control import ModelLinkControl, fabric_timing, initial_settings
from labctl.models.switch import SwitchModel
from labctl.nic.settings import LinkControl, LinkSettings, PortRef
from labctl.ocs.protocol import ApplyResult, OpticalSwitch, Timed, command_not_before
from labctl.probes.base import ProbeContext
from labctl.probes.model import model_sites
from labctl.probes.sampling import ProbeSettings

PROBES = ("model-link", "rx-power", "model-traffic")
"""What each agent runs, on its mirror of the world."""


class AnnouncedSwitch:
    """A switch of the agents lab whose every change is announced to the agents' mirrors `lead_ns` before
    its command goes out (decision 0041): the model draws the change's delays from the moment the command
    will be sent (`SwitchModel.arm`), the world feed carries them at once, and the command follows when
    that moment comes. Each mirror then holds every light change before it happens and applies it at its
    model time, however long the broker took. t0 is still stamped when the command goes out; the wait
    happens before it, outside every measured phase. Everything else is the wrapped driver's."""

    def __init__(self, switch: OpticalSwitch, model: SwitchModel, lead_ns: int) -> None:
        self.switch = switch
        self.model = model
        self.lead_ns = lead_ns
        self.name = switch.name
        self.space = switch.space

    async def connect(self) -> None:
        await self.switch.connect()

    async def close(self) -> None:
        await self.switch.close()

    async def get_mapping(self) -> Timed[Mapping]:
        return await self.switch.get_mapping()

    async def port_power(self, ports: Iterable[int]) -> Timed[dict[int, float | None]]:
        return await self.switch.port_power(ports)

    def __getattr__(self, name: str) -> Any:  # the driver's own extras (counters, fault hooks)
        return getattr(self.switch, name)

    async def apply(
        self,
        mapping: Iterable[tuple[int, int]],
        *,
        scope: Iterable[int] | None = None,
        context: dict[str, Any] | None = None,
    ) -> Timed[ApplyResult]:
        mapping = list(mapping)
        scope = None if scope is None else list(scope)
        arming = self._announce(mapping, scope)
        # The driver's command goes out at the announced moment (labctl.ocs.protocol.converge waits for it
        # right
        # before stamping t0 and sending), so the model's switch moves when the mirrors were told it would.
        token = command_not_before.set(arming[1] if arming is not None else None)
        try:
            return await self.switch.apply(mapping, scope=scope, context=context)
        finally:
            command_not_before.reset(token)
            if arming is not None:
                self.model.disarm(arming[0])  # what its command did not carry (refused, failed) goes back

    async def disconnect(
        self, ports: Iterable[int], *, context: dict[str, Any] | None = None
    ) -> Timed[ApplyResult]:
        return await self.apply((), scope=ports, context=context)

    @property
    def confirm_wait_ns(self) -> int:
        """How long past its announced time a mirror holds returning light for its command's confirmation
        (CONFIRM_WAIT_NS). Past it, the mirror applies the light and counts it late: only a command later
        than that would then show light before the switch moved (the breakdown would flag that row)."""
        return CONFIRM_WAIT_NS

    def _announce(self, mapping: list[tuple[int, int]], scope: list[int] | None) -> tuple[int, int] | None:
        """Arm the model with the change this apply will ask for (as the driver will work it out: against
        what the switch holds, within the scope): (the arming, when the command may go); None: nothing to
        arm (no change, or a mapping the driver will refuse with its own error)."""
        try:
            desired = frozenset((int(a), int(b)) for a, b in mapping)
        except (TypeError, ValueError):
            return None
        diff = diff_mapping(self.model.patches, desired, ports_of(desired) | set(scope or ()))
        if diff.empty or self.lead_ns <= 0:
            return None
        go_ns = now_ns() + self.lead_ns
        return self.model.arm(diff, go_ns), go_ns


def agent_context(
    inventory: Inventory, host: str, settings: ProbeSettings, mirror: SimFabric | None
) -> ProbeContext:
    """An agent's probes read its mirror of the controller's model: this host's NIC ports, a transceiver
    per port that the mirror's light drives; the traffic probe knows every port as a possible peer."""
    assert mirror is not None, "modeled probes: the agent mirrors the controller's world"
    sites = model_sites(mirror, inventory.ports)
    mine = [site for site in sites if site.port.host == host]
    # The schedule an agent's samplers share is its mirror's (the agent's FabricMirror), not the model's:
    # the model (labctl.models) knows nothing of the probes that read it.
    schedule = getattr(mirror, "schedule", None)
    return ProbeContext(settings, ports=mine, peers=sites, world=mirror, schedule=schedule)


def check(inventory: Inventory) -> None:
    if inventory.model.broker is None:
        raise inventory.fail(("broker",), "an agents lab needs a `broker:` section (url: mqtt://HOST:PORT)")
    check_switches_over_models(inventory, "agents")
    check_power_meters(inventory, "agents", over_models=True)
    BrokerSettings.check_names(inventory)


CONFIRM_WAIT_NS = 20_000_000
"""How long a mirror may hold returning light for its command's confirmation: far longer than a command
leaves late (it goes out at its announced moment; tens of ms only on a starved machine), so that no mirror
shows light before the model's switch moved it; on a busy host this is what the optical mark waits for."""


def build(ctx: LabContext) -> Lab:
    require_transport(ctx.probes, "agents")
    no_extra_probes(ctx.probes, "agents")
    inv = ctx.inventory
    # Light changes are announced when scheduled, so the agents' mirrors apply them at their model time
    # instead of a broker hop after it (labctl.agents.mirror.FabricMirror).
    models = switch_models(ctx)
    fabric = SimFabric(inv, models, ctx.profile, ctx.rng)
    lab = Lab(close_hooks=[fabric.cancel_pending])
    drive_models(ctx, models, lab)
    hub = run_probes_on_agents(lab, ctx, PROBES)
    lead_ns = round(hub.broker.feed_lead_ms * 1e6)
    announced = {name: AnnouncedSwitch(lab.switches[name], model, lead_ns) for name, model in models.items()}
    lab.switches.update(announced)

    def feed_report() -> None:
        lab.meta["feed"] = {
            "lead_ns": lead_ns,
            **{name: dict(model.armed_stats) for name, model in models.items()},
        }

    lab.close_hooks.append(feed_report)
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

    def on_schedule(
        switch: str, egress: int, ingress: int | None, t_ns: int, mode: int = HAPPENS, wait_ns: int = 0
    ) -> None:
        port = by_rx.get((switch, egress))
        if port is None:
            return
        peer = by_tx.get((switch, ingress)) if ingress is not None else None
        level = fabric.state(port).rx_level_dbm
        settle = settle_mid_ns if peer is not None else 0
        source = peer.source if peer else None
        hub.world(WorldItem("light", port.source, t_ns, 0, source, settle, level, mode, wait_ns))

    def on_announce(switch: str, egress: int, ingress: int | None, t_ns: int, what: str) -> None:
        if what == "announce":
            wait = announced[switch].confirm_wait_ns if ingress is not None else 0
            on_schedule(switch, egress, ingress, t_ns, ANNOUNCED, wait)
        else:
            on_schedule(switch, egress, ingress, t_ns, WITHDRAWN)

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
        model.add_announce_listener(functools.partial(on_announce, name))
    fabric.add_listener(on_transition)
    hub.world_snapshot = snapshot
    timelines = [fabric.timeline, *(model.timeline for model in models.values())]

    def horizon() -> int:
        """The model time the model is complete through: before its earliest change still to come, and
        never past now (a change is handed to the feed when its time comes, not before)."""
        due = [t for t in (tl.earliest_ns() for tl in timelines) if t is not None]
        return min([now_ns(), *due]) - 1

    hub.world_horizon = horizon
    lab.link_control = AgentLinkControl(hub, link_observer(fabric, inv, ctx))
    return lab


def link_observer(
    fabric: SimFabric, inv: Inventory, ctx: LabContext
) -> Callable[[PortRef, LinkSettings], None]:
    """Where the agents lab decides a link's firmware link-up (the controller's fabric, which the agents'
    mirrors follow): told every port's settings as its agent read them back, so that link-up is drawn from
    what the agents hold, as the one-process lab draws it from its own model's. A port still as the model
    starts leaves the fabric's draws as they were."""
    timing = fabric_timing(fabric)
    by_ref = {PortRef(p.host, p.ifname): p for p in inv.ports}
    known: dict[PortRef, LinkSettings] = {}
    start = initial_settings(ctx.profile.link)

    def observe(port: PortRef, held: LinkSettings) -> None:
        nic = by_ref.get(port)
        if nic is None or held == known.get(port, start):
            return
        known[port] = held
        timing(nic, held)

    return observe


def agent_link_control(inventory: Inventory, host: str, broker_host: str) -> LinkControl:
    """An agent's model of its own ports' link settings (they start as the inventory's profile's `link`
    model says, and live as long as the agent: a controller that dies leaves them set). Their effect on
    link-up is the controller's model's (`link_observer`), not the agent's mirror's."""
    return ModelLinkControl([p for p in inventory.ports if p.host == host], inventory.profile().link)


KIND = LabKind(
    "agents",
    "the simulated lab's models in the controller, each host's probes on its `labctl agent` over MQTT",
    check,
    build,
    agent_probes=PROBES,
    agent_context=agent_context,
    agent_link_control=agent_link_control,
    no_link_control=None,
)
