"""A behavioural model of the NIC side of a lab: what each NIC port sees as the OCS moves light.

Each port reacts to whether light reaches its receiver through the current patches:
- light lost → firmware link down, carrier down after loss-of-signal detection, traffic stops;
- light back on both directions of a link → Rx power restored (after the optics settle), NIC firmware
  link-up after the profile's delay (one draw per link: training is a two-sided negotiation), carrier
  70-80 µs later on each end, traffic once both ends have carrier plus the transport delay.
Transitions carry exact model times (integer ns) and are delivered at that time through the event loop.
A newer change of the link invalidates transitions still pending for the old one.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from labctl.core.clock import now_ns
from labctl.core.events import Kind
from labctl.inventory.profiles import Profile
from labctl.inventory.schema import Inventory, NicPort
from labctl.linux.looplag import slice_deadline
from labctl.models.switch import INSERTION_LOSS_DB, SwitchModel
from labctl.models.timeline import Scheduled, Timeline

if TYPE_CHECKING:
    from labctl.probes.sampling import ModelSchedule

__all__ = [  # the public surface (docs/architecture.md, "Public surface"); the rest is internal
    "SCALAR_SLOTS",
    "TRANSPORT",
    "SimFabric",
]

TRANSPORT = "transport"
"""A transition of the model only (no event kind): the link carries traffic end to end."""

# port, kind (Kind.LINK_FIRMWARE | Kind.CARRIER | TRANSPORT), value 0/1, model time
TransitionListener = Callable[[NicPort, str, int, int], None]

DARK_RAMP_DB = 30.0  # Rx power rises from ~30 dB below its level while the optics settle


class PortArrays:
    """The per-port state the vectorized readers need, one numpy array per field (index: the port's slot).

    Probes of hundreds of ports sample every port every millisecond; reading a Python object per port per
    sample saturates a core at 512 ports, so the optical state lives here and a whole lab is read with a
    few array operations (`SimFabric.rx_power_mw`, `SimFabric.traffic_ok`)."""

    def __init__(self, n: int) -> None:
        self.lit_from = np.full(n, -1, np.int64)  # slot of the port whose light reaches this one; -1 dark
        self.level_dbm = np.zeros(n)
        self.light_t_ns = np.zeros(n, np.int64)
        self.settle_ns = np.zeros(n, np.int64)
        self.transport = np.zeros(n, bool)
        self.transport_t_ns = np.zeros(n, np.int64)  # model time the transport last came up
        self.before_mw = np.zeros(n)  # power before the last light change: what a stale module still shows
        self.update_ns = np.zeros(n, np.int64)  # the module's DOM refresh interval (0: current on every read)
        self.update_phase_ns = np.zeros(n, np.int64)
        self.noise_db = np.zeros(n)  # the noise on the module's current reading
        self.noise_t_ns = np.full(n, -1, np.int64)  # ...and the refresh it belongs to


class PortState:
    """One NIC port of the model. The optical fields are views of the fabric's `PortArrays`."""

    __slots__ = ("_fabric", "carrier", "firmware", "generation", "link_peer", "port", "slot")

    def __init__(self, fabric: SimFabric, port: NicPort, slot: int) -> None:
        self._fabric = fabric
        self.port = port
        self.slot = slot
        self.firmware = 0
        self.carrier = 0
        self.generation = 0
        self.link_peer: NicPort | None = None
        """The other end of the port's latest link (lit both ways); kept when it drops until the next."""

    @property
    def light_from(self) -> NicPort | None:
        i = int(self._fabric.arrays.lit_from[self.slot])
        return self._fabric.port_at[i] if i >= 0 else None

    @light_from.setter
    def light_from(self, source: NicPort | None) -> None:
        a = self._fabric.arrays
        was_lit = a.lit_from[self.slot] >= 0
        a.before_mw[self.slot] = 10.0 ** (a.level_dbm[self.slot] / 10.0) if was_lit else 0.0
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


class _LinkBatch:
    """A light batch's link reactions, in model-time order: (t_ns, port, old peer, new source, both lit)."""

    __slots__ = ("next", "rows")

    def __init__(self, rows: list[tuple[int, NicPort, NicPort | None, NicPort | None, bool]]) -> None:
        self.rows = rows
        self.next = 0


@dataclass
class _Pending:
    """A transition scheduled at model time `t_ns`, valid while the port's link generation is unchanged."""

    t_ns: int
    generation: int
    kind: str
    value: int
    handle: Scheduled | None = None


SCALAR_SLOTS = 16
"""Up to this many ports a read computes each in Python (`_rx_power_mw_each`); above, with arrays."""


class SimFabric:
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
        self._pending: dict[NicPort, list[_Pending]] = {}
        self.timeline = Timeline()
        self.schedule: ModelSchedule | None = None
        """Where readers advance the model (an agent's mirror): the schedule its samplers share."""
        self._port_slots: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for port in inventory.ports:
            # Per-port spread of received power, as fibers and connectors differ.
            level = profile.rx_power_dbm + rng.uniform(-0.8, 0.8)
            st = self.ports[port] = PortState(self, port, self.slot[port])
            st.rx_level_dbm = level
            self._by_rx[(port.switch, port.rx)] = port
            self._by_tx[(port.switch, port.tx)] = port
            switches[port.switch].transmitting[port.tx] = level + INSERTION_LOSS_DB
        self._switch_timelines = [model.timeline for model in switches.values()]
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
            model.add_batch_listener(functools.partial(self._on_lights, rx_slot, tx_slot))
        low, high = profile.dom_update_ms
        if high > 0:
            a = self.arrays
            a.update_ns[:] = np.rint(self.noise.uniform(low, high, len(self.port_at)) * 1e6)
            a.update_phase_ns[:] = np.rint(self.noise.uniform(0, 1, len(self.port_at)) * a.update_ns)

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
            np.array([egress], np.int64),
            np.array([-1 if ingress is None else ingress], np.int64),
            np.array([t_ns], np.int64),
        )

    def _on_lights(
        self,
        rx_slot: np.ndarray,
        tx_slot: np.ndarray,
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
        if np.unique(egress).size != egress.size:  # one egress twice in a batch: apply in order
            for i in range(egress.size):
                self._on_lights(rx_slot, tx_slot, egress[i : i + 1], ingress[i : i + 1], times[i : i + 1])
            return
        slots = rx_slot[egress]
        sources = np.where(ingress >= 0, tx_slot[np.maximum(ingress, 0)], -1)
        a = self.arrays
        moved = (slots >= 0) & (a.lit_from[np.maximum(slots, 0)] != sources)
        if not moved.any():
            return
        slots, sources, times = slots[moved], sources[moved], times[moved]
        old = a.lit_from[slots]
        a.before_mw[slots] = np.where(old >= 0, 10.0 ** (a.level_dbm[slots] / 10.0), 0.0)
        a.lit_from[slots] = sources
        a.light_t_ns[slots] = times
        lit = sources >= 0
        settle = np.zeros(slots.size, np.int64)
        settle[lit] = self.profile.draw_many_ns(self.rng, "optical_settle_ms", int(lit.sum()))
        a.settle_ns[slots] = settle
        # A link lights up when both directions carry light; where both ends changed in this batch, the
        # later one (in model-time order) completes it, as if the changes had come one at a time.
        position = np.full(a.lit_from.size, -1, np.int64)
        position[slots] = np.arange(slots.size)
        partner = np.maximum(sources, 0)
        both = lit & (a.lit_from[partner] == slots) & (position[partner] < np.arange(slots.size))
        port_at = self.port_at

        def peer(slot: int) -> NicPort | None:
            return port_at[slot] if slot >= 0 else None

        rows = [
            (t_ns, port_at[slot], peer(was), peer(source), b)
            for slot, was, source, t_ns, b in zip(
                slots.tolist(), old.tolist(), sources.tolist(), times.tolist(), both.tolist(), strict=True
            )
            if was >= 0 or b
        ]
        if rows:  # one timeline entry for the batch, not one per port (times already in model-time order)
            batch = _LinkBatch(rows)
            self.timeline.at(rows[0][0], self._link_batch, batch)

    def _link_batch(self, batch: _LinkBatch) -> None:
        """Run the batch's link reactions in model-time order, interleaved exactly with everything else on
        the timeline: each one only while no other entry is due before it; then the batch waits at its
        next reaction's time. A slice of the loop at most (labctl.linux.looplag.SLICE_NS) when the timeline is
        running on its own timer; a reader catching the model up runs every one due."""
        rows, i, n = batch.rows, batch.next, len(batch.rows)
        timeline, horizon = self.timeline, self.timeline.horizon_ns
        deadline = slice_deadline()
        first = True
        while i < n:
            t_ns = rows[i][0]
            if not first:
                other = timeline.next_due_ns()
                if t_ns > horizon or (other is not None and other < t_ns) or now_ns() >= deadline:
                    break
            first = False
            _, port, was, source, both = rows[i]
            self._link(port, was, source, t_ns, both)
            i += 1
        batch.next = i
        if i < n:
            timeline.at(rows[i][0], self._link_batch, batch)

    def _link(
        self, port: NicPort, old: NicPort | None, source: NicPort | None, t_ns: int, both: bool
    ) -> None:
        if old is not None:
            self._link_down(port, old, t_ns)
        if both and source is not None:
            self._link_lit(port, source, t_ns)

    def _link_down(self, a: NicPort, b: NicPort, t_ns: int) -> None:
        """Light from b no longer reaches a: the a-b link drops at both ends; b's end only if its latest
        link is still the one with a (one change that lights b with c and a later one that takes b's light
        from a are reactions to the same re-patch: the later one must not cancel b-c coming up)."""
        other = self.ports[b].link_peer
        for port in (a, b) if other is None or other == a else (a,):
            st = self.ports[port]
            st.generation += 1
            if st.transport:
                self._transition(port, TRANSPORT, 0, t_ns)
            if st.firmware:
                self._transition(port, Kind.LINK_FIRMWARE, 0, t_ns)
            if st.carrier:
                self._schedule(
                    port,
                    st.generation,
                    Kind.CARRIER,
                    0,
                    t_ns + self.profile.draw_ns(self.rng, "carrier_down_after_loss_ms"),
                )

    def _link_lit(self, a: NicPort, b: NicPort, t_ns: int) -> None:
        """Both directions of the a-b link carry light from t_ns: schedule the link-up sequence."""
        t_fw = t_ns + self.profile.draw_ns(self.rng, "firmware_up_ms")
        carrier_t = {}
        self.ports[a].link_peer, self.ports[b].link_peer = b, a
        for port in (a, b):
            st = self.ports[port]
            st.generation += 1
            self._schedule(port, st.generation, Kind.LINK_FIRMWARE, 1, t_fw)
            carrier_t[port] = t_fw + self.profile.draw_ns(self.rng, "carrier_after_firmware_us")
            self._schedule(port, st.generation, Kind.CARRIER, 1, carrier_t[port])
        t_transport = max(carrier_t.values()) + self.profile.draw_ns(self.rng, "transport_after_carrier_ms")
        for port in (a, b):
            self._schedule(port, self.ports[port].generation, TRANSPORT, 1, t_transport)

    def _schedule(self, port: NicPort, generation: int, kind: str, value: int, t_ns: int) -> None:
        pending = _Pending(t_ns, generation, kind, value)
        pending.handle = self.timeline.at(t_ns, self._fire, port, pending)
        self._pending.setdefault(port, []).append(pending)

    def _fire(self, port: NicPort, pending: _Pending) -> None:
        self._pending[port].remove(pending)
        if self.ports[port].generation == pending.generation:
            self._transition(port, pending.kind, pending.value, pending.t_ns)

    def _transition(self, port: NicPort, kind: str, value: int, t_ns: int) -> None:
        st = self.ports[port]
        attr = "firmware" if kind == Kind.LINK_FIRMWARE else kind
        if getattr(st, attr) == value:
            return
        setattr(st, attr, value)
        if kind == TRANSPORT and value:
            self.arrays.transport_t_ns[st.slot] = t_ns
        for listener in self.listeners:
            listener(port, kind, value, t_ns)

    def cancel_pending(self) -> None:
        self.timeline.cancel_all()
        self._pending.clear()

    # -- what probes read ------------------------------------------------------------------------------------
    def rx_power_mw(self, slots: np.ndarray, t_ns: int) -> np.ndarray:
        """What each port's module reports at t_ns, in mW (0: no light), for ports by slot.

        A module refreshes its DOM registers every `update_ns` (the profile's `dom_update_ms`; 0: on every
        read), so a read returns the power at the module's last refresh, which may predate the latest
        light change (then it still shows the power from before it). Values are quantized to the
        register's 0.1 µW and saturate at 6.5535 mW, as an SFF-8636 Rx power word does."""
        self.sync_optics(t_ns)
        if slots.size <= SCALAR_SLOTS:
            return np.array(self._rx_power_mw_each(slots.tolist(), t_ns))
        a = self.arrays
        t = np.full(slots.size, t_ns, np.int64)
        update = a.update_ns[slots]
        stale = update > 0
        if stale.any():
            period = update[stale]
            t[stale] -= (t[stale] - a.update_phase_ns[slots][stale]) % period
        since = t - a.light_t_ns[slots]
        settle = a.settle_ns[slots]
        # A module's noise changes when its reading does: once per refresh (every read if it has none).
        fresh = a.noise_t_ns[slots] != t
        if fresh.any():
            renewed = slots[fresh]
            a.noise_db[renewed] = (self.noise.random(renewed.size) - 0.5) * self.profile.rx_noise_db
            a.noise_t_ns[renewed] = t[fresh]
        dbm = a.level_dbm[slots] + a.noise_db[slots]
        ramping = (since >= 0) & (since < settle)
        if ramping.any():
            dbm[ramping] -= DARK_RAMP_DB * (1 - since[ramping] / settle[ramping])
        mw = np.where(a.lit_from[slots] >= 0, 10.0 ** (dbm / 10.0), 0.0)
        mw = np.where(stale & (since < 0), a.before_mw[slots], mw)  # refreshed before the change
        return np.minimum(np.rint(mw * 1e4), 0xFFFF) / 1e4

    def _rx_power_mw_each(self, slots: list[int], t_ns: int) -> list[float]:
        """`rx_power_mw` one slot at a time, for a few ports (an agent's host): the same model, without a
        numpy call per step for arrays of four (tests/unit/test_rxpower_lanes.py holds the two equal)."""
        a = self.arrays
        times = []
        fresh = []
        for slot in slots:
            t = t_ns
            update = a.update_ns.item(slot)
            if update > 0:
                t -= (t - a.update_phase_ns.item(slot)) % update
            times.append(t)
            if a.noise_t_ns.item(slot) != t:
                fresh.append(slot)
        if fresh:  # as the array code: one draw for the slots whose module refreshed, in slot order
            draws = ((self.noise.random(len(fresh)) - 0.5) * self.profile.rx_noise_db).tolist()
            for slot, t, draw in zip(fresh, (times[slots.index(f)] for f in fresh), draws, strict=True):
                a.noise_db[slot] = draw
                a.noise_t_ns[slot] = t
        out = []
        for slot, t in zip(slots, times, strict=True):
            since = t - a.light_t_ns.item(slot)
            if since < 0 and a.update_ns.item(slot) > 0:  # refreshed before the change: the power before it
                mw = a.before_mw.item(slot)
            elif a.lit_from.item(slot) >= 0:
                dbm = a.level_dbm.item(slot) + a.noise_db.item(slot)
                settle = a.settle_ns.item(slot)
                if 0 <= since < settle:
                    dbm -= DARK_RAMP_DB * (1 - since / settle)
                mw = 10.0 ** (dbm / 10.0)
            else:
                mw = 0.0
            out.append(min(round(mw * 1e4), 0xFFFF) / 1e4)
        return out

    def rx_power_dbm(self, port: NicPort, t_ns: int) -> float | None:
        """Received power of one port at time t_ns; None when no light reaches it (never a made-up floor)."""
        mw = float(self.rx_power_mw(np.array([self.slot[port]]), t_ns)[0])
        return 10.0 * math.log10(mw) if mw > 0 else None

    def sync_optics(self, t_ns: int) -> None:
        """Apply every light change the switches have due by t_ns before reading the optics: a switch's
        timeline delivers a burst of them a chunk per loop turn, and a reading stamped t_ns must see them
        all."""
        for timeline in self._switch_timelines:
            timeline.run_due(t_ns)

    def sync_links(self, t_ns: int) -> None:
        """`sync_optics`, then the link reactions due by t_ns (a link's transport coming up or going down):
        a ping at t_ns must see the link as the model has it then, not as the loop got round to it (a busy
        host ran the fabric's timeline tens of ms late, and pings failed on a link that was up)."""
        self.sync_optics(t_ns)
        self.timeline.run_due(t_ns)

    def traffic_ok(self, slots: np.ndarray, peer_slots: np.ndarray, t_ns: int | None = None) -> np.ndarray:
        """Whether a ping-pong from each port to its peer (by slot) gets through at t_ns (default: now).

        Both ends must have transport up on the link between them (decision 0044). The optics and the link
        reactions are caught up to t_ns here (`sync_links`); a link batch still yields between slices, so
        a transport flag is only trusted while neither end's light has changed since that transport came
        up (any change of a lit port's light drops its link, `_link_down`), and each end is lit by the
        other."""
        t = now_ns() if t_ns is None else t_ns
        self.sync_links(t)
        a = self.arrays
        ok: np.ndarray = (
            a.transport[slots]
            & a.transport[peer_slots]
            & (a.lit_from[slots] == peer_slots)
            & (a.lit_from[peer_slots] == slots)
            & (a.light_t_ns[slots] <= a.transport_t_ns[slots])
            & (a.light_t_ns[peer_slots] <= a.transport_t_ns[peer_slots])
        )
        return ok

    def passes(self, slot: int, peer_slot: int, t_ns: int) -> bool:
        """`traffic_ok` for one packet from one port to another: plain scalar reads (per packet, not per
        tick, so no array round trip)."""
        self.sync_links(t_ns)
        a = self.arrays
        return bool(
            a.transport[slot]
            and a.transport[peer_slot]
            and a.lit_from[slot] == peer_slot
            and a.lit_from[peer_slot] == slot
            and a.light_t_ns[slot] <= a.transport_t_ns[slot]
            and a.light_t_ns[peer_slot] <= a.transport_t_ns[peer_slot]
        )

    def passes_each(self, pairs: list[tuple[int, int]], t_ns: int) -> list[bool]:
        """`passes` for a few (slot, peer slot) pairs at one instant: the model caught up once."""
        self.sync_links(t_ns)
        a = self.arrays
        transport, lit_from, light_t, up_t = a.transport, a.lit_from, a.light_t_ns, a.transport_t_ns
        return [
            bool(
                transport.item(s)
                and transport.item(d)
                and lit_from.item(s) == d
                and lit_from.item(d) == s
                and light_t.item(s) <= up_t.item(s)
                and light_t.item(d) <= up_t.item(d)
            )
            for s, d in pairs
        ]

    def rtt_ns_many(self, n: int) -> list[int]:
        """`rtt_ns` for n ping-pongs at once (one draw of the noise stream)."""
        low, high = self.profile.rtt_us
        rtts: list[int] = np.rint(self.noise.uniform(low, high, n) * 1_000).astype(np.int64).tolist()
        return rtts

    def rtt_ns(self) -> int:
        """The round trip of one ping-pong on a working circuit. Drawn from the noise stream: how often the
        probes ping must not change the link delays a seed draws."""
        low, high = self.profile.rtt_us
        return round(float(self.noise.uniform(low, high)) * 1_000)
