"""A behavioural model of the NIC side of a lab: what each NIC port sees as the OCS moves light.

Each port reacts to whether light reaches its receiver through the current patches:
- light lost → firmware link down, carrier down after loss-of-signal detection, traffic stops;
- light back on both directions of a link → Rx power restored (after the optics settle), NIC firmware
  link-up after the profile's delay (one draw per link: training is a two-sided negotiation), carrier
  70-80 µs later on each end, traffic once both ends have carrier plus the transport delay.
Transitions carry exact model times (integer ns) and are delivered at that time through the event loop.
A newer change of the link invalidates transitions still pending for the old one.

Whether a ping gets through is read from the optics alone, not from the link reactions having run: when a
light change completes a link (both directions lit), the link's timing is drawn at once and the model time
its transport comes up is written beside the light (`PortArrays.transport_up_ns`); a later light change of
either end voids it at once. So a reader of traffic catches up only the optics (`sync_optics`, a few array
operations per command), and the reactions (firmware, carrier, transport transitions and their events) are
worked through on the fabric's own timeline, a time slice per loop turn, never inside a sampler's tick
(decision 0052).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable

import numpy as np

from labctl.core.clock import now_ns
from labctl.core.events import Kind
from labctl.inventory.profiles import Profile
from labctl.inventory.schema import Inventory, NicPort
from labctl.models.fabric_reads import SCALAR_SLOTS, FabricReadings
from labctl.models.port_arrays import NEVER, PortArrays
from labctl.models.switch import INSERTION_LOSS_DB, SwitchModel, _draws_ns
from labctl.models.timeline import Timeline

__all__ = [  # the public surface (docs/architecture.md, "Public surface"); the rest is internal
    "SCALAR_SLOTS",
    "TRANSPORT",
    "SimFabric",
]

TRANSPORT = "transport"
"""A transition of the model only (no event kind): the link carries traffic end to end."""

# port, kind (Kind.LINK_FIRMWARE | Kind.CARRIER | TRANSPORT), value 0/1, model time
TransitionListener = Callable[[NicPort, str, int, int], None]

NO_LINK_NS = 3_600 * 1_000_000_000
"""Firmware link-up of ends whose link settings disagree (the profile's `link` model): an hour, i.e. not
within any recovery timeout."""


class PortState:
    """One NIC port of the model. The optical fields are views of the fabric's `PortArrays`."""

    __slots__ = ("_fabric", "carrier", "firmware", "generation", "peer_slot", "port", "slot")

    def __init__(self, fabric: SimFabric, port: NicPort, slot: int) -> None:
        self._fabric = fabric
        self.port = port
        self.slot = slot
        self.firmware = 0
        self.carrier = 0
        self.generation = 0
        self.peer_slot = -1
        """The slot of the other end of the port's latest link (lit both ways; -1: none); kept when it
        drops until the next."""

    @property
    def link_peer(self) -> NicPort | None:
        """The other end of the port's latest link (lit both ways); kept when it drops until the next."""
        return self._fabric.port_at[self.peer_slot] if self.peer_slot >= 0 else None

    @property
    def light_from(self) -> NicPort | None:
        i = int(self._fabric.arrays.lit_from[self.slot])
        return self._fabric.port_at[i] if i >= 0 else None

    @light_from.setter
    def light_from(self, source: NicPort | None) -> None:
        a = self._fabric.arrays
        was_lit = a.lit_from[self.slot] >= 0
        level = a.level_dbm[self.slot] - a.atten_db[self.slot]
        a.before_mw[self.slot] = 10.0 ** (level / 10.0) if was_lit else 0.0
        a.lit_from[self.slot] = self._fabric.slot[source] if source is not None else -1

    @property
    def rx_level_dbm(self) -> float:
        return float(self._fabric.arrays.level_dbm[self.slot])

    @rx_level_dbm.setter
    def rx_level_dbm(self, dbm: float) -> None:
        self._fabric.arrays.level_dbm[self.slot] = dbm

    @property
    def light_t_ns(self) -> int:
        return int(self._fabric.arrays.light_t_ns[self.slot])

    @light_t_ns.setter
    def light_t_ns(self, t_ns: int) -> None:
        self._fabric.arrays.light_t_ns[self.slot] = t_ns

    @property
    def settle_ns(self) -> int:
        return int(self._fabric.arrays.settle_ns[self.slot])

    @settle_ns.setter
    def settle_ns(self, ns: int) -> None:
        self._fabric.arrays.settle_ns[self.slot] = ns

    @property
    def transport(self) -> int:
        return int(self._fabric.arrays.transport[self.slot])

    @transport.setter
    def transport(self, value: int) -> None:
        self._fabric.arrays.transport[self.slot] = bool(value)


LinkUp = tuple[int, int, int, int]
"""A link's timing as drawn when it lit: firmware up (both ends), carrier up at each end, transport up."""


Row = tuple[int, int, int, int, LinkUp | None]


class _LinkBatch:
    """A light batch's link reactions, in model-time order, by slot: (t_ns, port, old peer, new source,
    the link's timing where the change lit one, else None), -1 for none. Made from the batch's arrays
    when first run (on the timeline, in its slice), not by the reader that applied the light."""

    __slots__ = ("_columns", "_rows", "next")

    def __init__(self, rows: list[Row] | None = None, columns: tuple[np.ndarray, ...] | None = None) -> None:
        self._rows = rows
        self._columns = columns
        """times, slots, old peers, sources, the rows that lit a link, their timing (4 arrays)."""
        self.next = 0

    @property
    def rows(self) -> list[Row]:
        if self._rows is None:
            assert self._columns is not None
            times, slots, old, sources, links, *drawn = self._columns
            ups: list[LinkUp | None] = [None] * times.size
            for k, up in zip(links.tolist(), zip(*(c.tolist() for c in drawn), strict=True), strict=True):
                ups[k] = up
            columns = (times.tolist(), slots.tolist(), old.tolist(), sources.tolist(), ups)
            self._rows = list(zip(*columns, strict=True))
            self._columns = None
        return self._rows


class SimFabric(FabricReadings):
    """NIC ports of every host, wired to the switch models through their fibers."""

    def __init__(
        self, inventory: Inventory, switches: dict[str, SwitchModel], profile: Profile, rng: random.Random
    ) -> None:
        self.profile = profile
        self.rng = rng
        self.listeners: list[TransitionListener] = []
        self.ports: dict[NicPort, PortState] = {}
        self.port_at: list[NicPort] = list(inventory.ports)
        self.slot: dict[NicPort, int] = {port: i for i, port in enumerate(self.port_at)}
        self.arrays = PortArrays(len(self.port_at))
        # Sample noise and module refresh phases draw from their own stream: how often the probes read
        # must not change the link delays a seed draws.
        self.noise = np.random.default_rng(rng.getrandbits(64))
        self._by_rx: dict[tuple[str, int], NicPort] = {}
        self._by_tx: dict[tuple[str, int], NicPort] = {}
        self._whole_of: tuple[np.ndarray, bool] | None = None
        self._states: list[PortState] = []
        """Each port's state by slot (the link reactions work on slots: no port hashed per reaction)."""
        self.timeline = Timeline()
        self._port_slots: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        n = len(self.port_at)
        self._tuned = False  # every port as the profile's `link` model starts: a share of 1 each
        self._share = np.ones(n)
        """Each port's firmware link-up as a share of the profile's draw (its link settings)."""
        self._autoneg = np.full(n, profile.link.autoneg, bool)
        self._fec: list[str] = [profile.link.fec] * n
        for port in inventory.ports:
            # Per-port spread of received power, as fibers and connectors differ.
            level = profile.rx_power_dbm + rng.uniform(-0.8, 0.8)
            st = self.ports[port] = PortState(self, port, self.slot[port])
            self._states.append(st)
            st.rx_level_dbm = level
            self._by_rx[(port.switch, port.rx)] = port
            self._by_tx[(port.switch, port.tx)] = port
            switches[port.switch].transmitting[port.tx] = level + INSERTION_LOSS_DB
        self._switch_timelines = [model.timeline for model in switches.values()]
        self._models = dict(switches)
        for name, model in switches.items():
            # Switch port number → slot of the NIC port on its egress (rx) / ingress (tx); -1: none.
            size = model.space.all_ports.stop
            size = max([size] + [number + 1 for (sw, number) in (*self._by_rx, *self._by_tx) if sw == name])
            rx_slot = np.full(size, -1, np.int64)
            tx_slot = np.full(size, -1, np.int64)
            for (switch, number), port in self._by_rx.items():
                if switch == name:
                    rx_slot[number] = self.slot[port]
            for (switch, number), port in self._by_tx.items():
                if switch == name:
                    tx_slot[number] = self.slot[port]
            self._port_slots[name] = (rx_slot, tx_slot)
            model.add_batch_listener(functools.partial(self._on_lights, rx_slot, tx_slot, model))
            model.add_voa_listener(functools.partial(self._on_voa, rx_slot, model))
        low, high = profile.dom_update_ms
        if high > 0:
            a = self.arrays
            a.update_ns[:] = np.rint(self.noise.uniform(low, high, len(self.port_at)) * 1e6)
            a.update_phase_ns[:] = np.rint(self.noise.uniform(0, 1, len(self.port_at)) * a.update_ns)

    def set_link_timing(self, port: NicPort, share: float, autoneg: bool, fec: str) -> None:
        """A port's link settings changed (labctl.models.link_control): its next link-up takes `share` of
        the profile's firmware draw (a link, the share of its slower end); ends that disagree on
        auto-negotiation, or on a FEC mode neither leaves to `auto`, do not come up. A link that is up
        stays up: the settings show at its next link-up."""
        slot = self.slot[port]
        self._share[slot] = share
        self._autoneg[slot] = autoneg
        self._fec[slot] = fec
        self._tuned = True

    def _firmware_ns(self, ends: np.ndarray, peers: np.ndarray, draws: np.ndarray) -> np.ndarray:
        """Firmware link-up of links whose ends have link settings of their own (`set_link_timing`)."""
        low, high = self.profile.firmware_up_ms
        share = np.maximum(self._share[ends], self._share[peers])
        ns: np.ndarray = np.rint((low + (high - low) * draws) * 1_000_000 * share).astype(np.int64)
        fec = self._fec
        for k, (a, b) in enumerate(zip(ends.tolist(), peers.tolist(), strict=True)):
            agree = fec[a] == fec[b] or "auto" in (fec[a], fec[b])
            if self._autoneg[a] != self._autoneg[b] or not agree:
                ns[k] = NO_LINK_NS
        return ns

    def add_listener(self, listener: TransitionListener) -> None:
        self.listeners.append(listener)

    def state(self, port: NicPort) -> PortState:
        return self.ports[port]

    # -- light in, transitions out -------------------------------------------------------------------------
    def _on_light(self, switch: str, egress: int, ingress: int | None, t_ns: int) -> None:
        """One light change at an egress port of a switch (what `_on_lights` does for a batch)."""
        rx_slot, tx_slot = self._port_slots[switch]
        self._on_lights(
            rx_slot,
            tx_slot,
            self._models[switch],
            np.array([egress], np.int64),
            np.array([-1 if ingress is None else ingress], np.int64),
            np.array([t_ns], np.int64),
        )

    def _on_voa(self, rx_slot: np.ndarray, model: SwitchModel, egress: int, t_ns: int) -> None:
        """An egress port's attenuator changed: the NIC port on that receive fiber sees its light lowered
        (or raised) by the new attenuation from the next read on, without a settling ramp or a link change
        (a VOA moves the level, it does not interrupt the light; decision 0064)."""
        slot = int(rx_slot[egress]) if 0 <= egress < rx_slot.size else -1
        if slot >= 0:
            self.arrays.atten_db[slot] = model.attenuation_db(egress)

    def _on_lights(
        self,
        rx_slot: np.ndarray,
        tx_slot: np.ndarray,
        model: SwitchModel,
        egress: np.ndarray,
        ingress: np.ndarray,
        times: np.ndarray,
    ) -> None:
        """Light changed at egress ports (a command's worth, in model-time order): the ports' optics follow
        at once, in a few array operations (what Rx power and traffic read); each link's reaction
        (firmware, carrier, transport) is an entry on the fabric's timeline at the change's model time, so
        it runs in model-time order with every transition already scheduled, a time slice per loop turn:
        a switch moving 512 ports does not stall every sampler for 10 ms, and no transition runs before a
        light change that came earlier."""
        # One egress twice in a batch: apply in order. (Not np.unique: its first call imports numpy.ma,
        # ~12 ms of loop time in the first reconfiguration of a run.)
        if egress.size > 1 and (np.diff(np.sort(egress)) == 0).any():
            for i in range(egress.size):
                self._on_lights(
                    rx_slot, tx_slot, model, egress[i : i + 1], ingress[i : i + 1], times[i : i + 1]
                )
            return
        slots = rx_slot[egress]
        sources = np.where(ingress >= 0, tx_slot[np.maximum(ingress, 0)], -1)
        a = self.arrays
        moved = (slots >= 0) & (a.lit_from[np.maximum(slots, 0)] != sources)
        if not moved.any():
            return
        slots, sources, times = slots[moved], sources[moved], times[moved]
        old = a.lit_from[slots]
        was_dbm = a.level_dbm[slots] - a.atten_db[slots]
        a.before_mw[slots] = np.where(old >= 0, 10.0 ** (was_dbm / 10.0), 0.0)
        if model.voa:  # the egress ports' attenuators, for the light that reaches them now
            pairs = zip(egress[moved].tolist(), ingress[moved].tolist(), strict=True)
            a.atten_db[slots] = [model.attenuation_db(e, i) if i >= 0 else 0.0 for e, i in pairs]
        else:
            a.atten_db[slots] = 0.0
        a.lit_from[slots] = sources
        a.light_t_ns[slots] = times
        lit = sources >= 0
        settle = np.zeros(slots.size, np.int64)
        settle[lit] = _draws_ns(self.profile, self.rng, "optical_settle_ms", int(lit.sum()))
        a.settle_ns[slots] = settle
        # A link lights up when both directions carry light; where both ends changed in this batch, the
        # later one (in model-time order) completes it, as if the changes had come one at a time.
        position = np.full(a.lit_from.size, -1, np.int64)
        position[slots] = np.arange(slots.size)
        partner = np.maximum(sources, 0)
        both = lit & (a.lit_from[partner] == slots) & (position[partner] < np.arange(slots.size))
        react = (old >= 0) | both  # a link dropped, or one lit
        if not react.any():
            return
        slots, old, sources, times, both = slots[react], old[react], sources[react], times[react], both[react]
        links = np.flatnonzero(both)
        # A link lights at the later of its two lights. Applied in model-time order, that is this change's;
        # a busy loop can apply them the other way round (a switch's light reaches the timeline when its
        # alarm is handled, and a reader may catch the model up in between): then the other end's is later.
        lit_t = np.maximum(times[links], a.light_t_ns[sources[links]])
        drawn = self._draw_links(slots[links], sources[links], lit_t) if links.size else (links,) * 4
        # One timeline entry for the batch, not one per port (times already in model-time order).
        batch = _LinkBatch(columns=(times, slots, old, sources, links, *drawn))
        self.timeline.at(int(times[0]), self._link_batch, batch)

    def _draw_links(self, ends: np.ndarray, peers: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, ...]:
        """Links lit at these model times (one end, the other): draw each one's timing now, in order (per
        link: firmware up, carrier up at each end, transport up), and write when each end's transport comes
        up, which is what a ping reads. The link reactions schedule the transitions at these times."""
        profile, random = self.profile, self.rng.random
        draws = np.array([random() for _ in range(4 * ends.size)]).reshape(-1, 4)

        def span(name: str, column: int) -> np.ndarray:
            """As Profile.draw_ns: round(uniform(low, high) * unit), from the column's draws."""
            low, high = getattr(profile, name)
            unit = 1_000 if name.endswith("_us") else 1_000_000
            ns: np.ndarray = np.rint((low + (high - low) * draws[:, column]) * unit).astype(np.int64)
            return ns

        t_fw = times + (
            self._firmware_ns(ends, peers, draws[:, 0]) if self._tuned else span("firmware_up_ms", 0)
        )
        carrier_a = t_fw + span("carrier_after_firmware_us", 1)
        carrier_b = t_fw + span("carrier_after_firmware_us", 2)
        t_transport = np.maximum(carrier_a, carrier_b) + span("transport_after_carrier_ms", 3)
        a = self.arrays
        for end in (ends, peers):
            a.link_t_ns[end] = times
            a.transport_up_ns[end] = t_transport
        return t_fw, carrier_a, carrier_b, t_transport

    def _link_batch(self, batch: _LinkBatch) -> None:
        """Run the batch's link reactions in model-time order, interleaved exactly with everything else on
        the timeline: each one only while no other entry is due before it; then the batch waits at its
        next reaction's time. A slice of the loop at most (labctl.linux.looplag.SLICE_NS) when the timeline is
        running on its own timer; a reader catching the model up runs every one due."""
        rows, i, n = batch.rows, batch.next, len(batch.rows)
        timeline, horizon = self.timeline, self.timeline.horizon_ns
        deadline = timeline.slice_end_ns  # None: a reader catching the model up to the horizon
        first = True
        while i < n:
            t_ns = rows[i][0]
            if not first:
                other = timeline.next_due_ns()
                if (
                    t_ns > horizon
                    or (other is not None and other < t_ns)
                    or (deadline is not None and now_ns() >= deadline)
                ):
                    break
            first = False
            _, port, was, source, up = rows[i]
            self._link(port, was, source, t_ns, up)
            i += 1
        batch.next = i
        if i < n:
            timeline.at(rows[i][0], self._link_batch, batch)

    def _link(self, port: int, old: int, source: int, t_ns: int, up: LinkUp | None) -> None:
        """One port's reaction to its light changing at t_ns (slots; -1: none): the link with `old` drops;
        with `up` (its timing), the link with `source` lights."""
        if old >= 0:
            self._link_down(port, old, t_ns)
        if up is not None and source >= 0:
            self._link_lit(port, source, up)

    def _link_down(self, a: int, b: int, t_ns: int) -> None:
        """Light from b no longer reaches a: the a-b link drops at both ends; b's end only if its latest
        link is still the one with a (one change that lights b with c and a later one that takes b's light
        from a are reactions to the same re-patch: the later one must not cancel b-c coming up)."""
        states = self._states
        other = states[b].peer_slot
        for slot in (a, b) if other < 0 or other == a else (a,):
            st = states[slot]
            st.generation += 1
            if self.arrays.transport.item(slot):
                self._transition_slot(slot, TRANSPORT, 0, t_ns)
            if st.firmware:
                self._transition_slot(slot, Kind.LINK_FIRMWARE, 0, t_ns)
            if st.carrier:
                self._schedule(
                    slot,
                    st.generation,
                    Kind.CARRIER,
                    0,
                    t_ns + self.profile.draw_ns(self.rng, "carrier_down_after_loss_ms"),
                )

    def _link_lit(self, a: int, b: int, up: LinkUp) -> None:
        """Both directions of the a-b link carry light: schedule its link-up sequence, timed as drawn when
        the light came (`_draw_links`)."""
        t_fw, carrier_a, carrier_b, t_transport = up
        states = self._states
        states[a].peer_slot, states[b].peer_slot = b, a
        for slot, carrier_t in ((a, carrier_a), (b, carrier_b)):
            st = states[slot]
            st.generation += 1
            self._schedule(slot, st.generation, Kind.LINK_FIRMWARE, 1, t_fw)
            self._schedule(slot, st.generation, Kind.CARRIER, 1, carrier_t)
        for slot in (a, b):
            self._schedule(slot, states[slot].generation, TRANSPORT, 1, t_transport)

    def _schedule(self, slot: int, generation: int, kind: str, value: int, t_ns: int) -> None:
        """A transition at model time t_ns, void if the port's link generation has moved on by then. (The
        entry holds plain values: nothing per transition for the cyclic garbage collector to find.)"""
        self.timeline.at(t_ns, self._fire, slot, generation, kind, value, t_ns)

    def _fire(self, slot: int, generation: int, kind: str, value: int, t_ns: int) -> None:
        if self._states[slot].generation == generation:
            self._transition_slot(slot, kind, value, t_ns)

    def _transition(self, port: NicPort, kind: str, value: int, t_ns: int) -> None:
        """The port's firmware link, carrier or transport changes to `value` at t_ns, as told: a mirror of
        the controller's model, which draws no link timing of its own, applies the model's transitions
        through this (a transport up from t_ns, with the light as it has been since; down: none)."""
        slot = self.slot[port]
        if kind == TRANSPORT:
            arrays = self.arrays
            if value:
                arrays.transport_up_ns[slot] = arrays.link_t_ns[slot] = t_ns
            else:
                arrays.transport_up_ns[slot] = NEVER
        self._transition_slot(slot, kind, value, t_ns)

    def _transition_slot(self, slot: int, kind: str, value: int, t_ns: int) -> None:
        st = self._states[slot]
        if kind == TRANSPORT:
            arrays = self.arrays
            if arrays.transport.item(slot) == bool(value):
                return
            arrays.transport[slot] = bool(value)
        else:
            attr = "firmware" if kind == Kind.LINK_FIRMWARE else kind
            if getattr(st, attr) == value:
                return
            setattr(st, attr, value)
        port = self.port_at[slot]
        for listener in self.listeners:
            listener(port, kind, value, t_ns)

    def cancel_pending(self) -> None:
        self.timeline.cancel_all()
