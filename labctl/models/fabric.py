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
import math
import random
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from labctl.core.clock import now_ns
from labctl.core.events import Kind
from labctl.inventory.profiles import Profile
from labctl.inventory.schema import Inventory, NicPort
from labctl.models.switch import INSERTION_LOSS_DB, SwitchModel, _draws_ns
from labctl.models.timeline import Timeline

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

NEVER = np.iinfo(np.int64).max
"""A transport that is not coming up (its link dropped, or never lit)."""

NO_LINK_NS = 3_600 * 1_000_000_000
"""Firmware link-up of ends whose link settings disagree (the profile's `link` model): an hour, i.e. not
within any recovery timeout."""


class _Field:
    """A `PortArrays` array (a field, or a block). While few-port readers hold the optics as lists
    (`PortArrays.lists`), getting or setting the attribute first writes back what they changed and lets
    the lists go (`PortArrays.sync`): every reader and writer of the arrays finds them current, and the
    next few-port read takes the lists again. (A reference to an array kept across such a read would miss
    it: take the attribute each time, as the model does.)"""

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = f"_{name}"

    def __get__(self, arrays: PortArrays, owner: type | None = None) -> np.ndarray:
        if arrays.lists is not None:
            arrays.sync()
        array: np.ndarray = arrays.__dict__[self.key]
        return array

    def __set__(self, arrays: PortArrays, array: np.ndarray) -> None:
        if arrays.lists is not None:
            arrays.sync()
        arrays.__dict__[self.key] = array


class _Optics:
    """`PortArrays.ints` and `.floats` as lists of rows, each a list by slot (`PortArrays.take_lists`)."""

    __slots__ = ("floats", "ints", "noise_changed")

    def __init__(self, ints: np.ndarray, floats: np.ndarray) -> None:
        self.ints: list[list[int]] = ints.tolist()
        self.floats: list[list[float]] = floats.tolist()
        self.noise_changed = False
        """A read drew noise into the lists (noise_db, noise_t_ns): `sync` writes those rows back."""


class PortArrays:
    """The per-port state the vectorized readers need, one numpy array per field (index: the port's slot).

    Probes of hundreds of ports sample every port every millisecond; reading a Python object per port per
    sample saturates a core at 512 ports, so the optical state lives here and a whole lab is read with a
    few array operations (`SimFabric.rx_power_mw`, `SimFabric.traffic_ok`).

    The integer fields are rows of one 2-D array (`ints`, in `INT_ROWS` order) and the float fields rows
    of another (`floats`, `FLOAT_ROWS`): each field is a view of its row, written as any array. A reader of
    a few ports of a large lab takes every field of them in one gather and one `tolist()`; in a small lab
    (up to LIST_PORTS) few-port readers share the blocks as lists (`take_lists`), kept from read to read
    until an array is got or set: a 1 kHz read of a small lab is then no numpy call at all but its noise
    draw (`SimFabric._rx_power_mw_each`, `passes_each`)."""

    INT_ROWS = (
        "link_t_ns", "transport_up_ns",  # a ping reads rows 0-3,
        "lit_from", "light_t_ns",
        "settle_ns", "update_ns", "update_phase_ns", "noise_t_ns",  # an Rx power read rows 2-7
    )  # fmt: skip
    FLOAT_ROWS = ("level_dbm", "atten_db", "before_mw", "noise_db")

    ints = _Field()
    floats = _Field()
    lit_from = _Field()  # slot of the port whose light reaches this one; -1 dark
    light_t_ns = _Field()
    # The port's latest link: the model time it lit (both directions carried light), and the model time
    # its transport comes up (NEVER: none). Written with the light change that lit it, before any reaction
    # runs; trusted while the port's light has not changed since (light_t_ns <= link_t_ns).
    link_t_ns = _Field()
    transport_up_ns = _Field()
    settle_ns = _Field()
    update_ns = _Field()  # the module's DOM refresh interval (0: current on every read)
    update_phase_ns = _Field()
    noise_t_ns = _Field()  # the refresh the noise on the module's current reading belongs to
    level_dbm = _Field()
    atten_db = _Field()  # what the switch's attenuator on the port's receive fiber takes off
    before_mw = _Field()  # power before the last light change: what a stale module still shows
    noise_db = _Field()  # the noise on the module's current reading

    def __init__(self, n: int) -> None:
        self.lists: _Optics | None = None
        """The blocks as lists, the current copy while few-port readers run one after another."""
        self._bind(np.zeros((len(self.INT_ROWS), n), np.int64), np.zeros((len(self.FLOAT_ROWS), n)))
        self.transport = np.zeros(n, bool)  # the transport transition has run (what listeners were told)
        self.lit_from[:] = -1
        self.transport_up_ns[:] = NEVER
        self.noise_t_ns[:] = -1

    def _bind(self, ints: np.ndarray, floats: np.ndarray) -> None:
        """The blocks, and each field as a view of its row."""
        fields = self.__dict__
        fields["_ints"], fields["_floats"] = ints, floats
        for row, name in enumerate(self.INT_ROWS):
            fields[f"_{name}"] = ints[row]
        for row, name in enumerate(self.FLOAT_ROWS):
            fields[f"_{name}"] = floats[row]

    def take_lists(self) -> _Optics:
        """The blocks as lists, current from now on until an array is got or set (`sync`)."""
        if self.lists is None:
            self.lists = _Optics(self.__dict__["_ints"], self.__dict__["_floats"])
        return self.lists

    def sync(self) -> None:
        """The arrays current again: the noise the lists drew written back, and the lists let go."""
        lists, self.lists = self.lists, None
        if lists is not None and lists.noise_changed:
            noise_t = self.INT_ROWS.index("noise_t_ns")
            self.__dict__["_ints"][noise_t] = lists.ints[noise_t]
            self.__dict__["_noise_db"][:] = lists.floats[self.FLOAT_ROWS.index("noise_db")]

    # A copy (copy.deepcopy, pickle) copies the two blocks and binds the fields to the copies' rows: copied
    # one by one, a field would be an array of its own, no longer the row the block reads.
    def __getstate__(self) -> dict[str, np.ndarray]:
        return {"ints": self.ints, "floats": self.floats, "transport": self.transport}

    def __setstate__(self, state: dict[str, np.ndarray]) -> None:
        self.lists = None
        self._bind(state["ints"], state["floats"])
        self.transport = state["transport"]


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


SCALAR_SLOTS = 16
"""Up to this many ports a read computes each in Python (`_rx_power_mw_each`); above, with arrays."""

LIST_PORTS = 64
"""A lab of up to this many ports keeps its optics as lists for few-port readers (`PortArrays.take_lists`);
a larger one is gathered from per read (building the lists again after each light change would cost more)."""


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
        self._whole_of: tuple[np.ndarray, bool] | None = None
        self._states: list[PortState] = []
        """Each port's state by slot (the link reactions work on slots: no port hashed per reaction)."""
        self.timeline = Timeline()
        self.schedule: ModelSchedule | None = None
        """Where readers advance the model (an agent's mirror): the schedule its samplers share."""
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

    # -- what probes read ------------------------------------------------------------------------------------
    def rx_power_mw(self, slots: np.ndarray, t_ns: int) -> np.ndarray:
        """What each port's module reports at t_ns, in mW (0: no light), for ports by slot.

        A module refreshes its DOM registers every `update_ns` (the profile's `dom_update_ms`; 0: on every
        read), so a read returns the power at the module's last refresh, which may predate the latest
        light change (then it still shows the power from before it). Values are quantized to the
        register's 0.1 µW and saturate at 6.5535 mW, as an SFF-8636 Rx power word does."""
        self.sync_optics(t_ns)
        if slots.size <= SCALAR_SLOTS:
            return np.array(self._rx_power_mw_each(slots, t_ns))
        a = self.arrays
        whole = self._whole(slots)  # every port in slot order (a poller of the whole lab): no gathers

        def take(x: np.ndarray) -> np.ndarray:
            return x if whole else x[slots]

        update = take(a.update_ns)
        stale = update > 0
        any_stale = bool(stale.any())
        t: np.ndarray | int = t_ns
        if any_stale:
            t = np.full(slots.size, t_ns, np.int64)
            period = update[stale]
            t[stale] -= (t[stale] - take(a.update_phase_ns)[stale]) % period
        since = t - take(a.light_t_ns)
        settle = take(a.settle_ns)
        # A module's noise changes when its reading does: once per refresh (every read if it has none).
        fresh = take(a.noise_t_ns) != t
        if fresh.all():
            a.noise_db[slots] = (self.noise.random(slots.size) - 0.5) * self.profile.rx_noise_db
            a.noise_t_ns[slots] = t
        elif fresh.any():
            renewed = slots[fresh]
            a.noise_db[renewed] = (self.noise.random(renewed.size) - 0.5) * self.profile.rx_noise_db
            a.noise_t_ns[renewed] = t[fresh] if isinstance(t, np.ndarray) else t
        dbm = take(a.level_dbm) - take(a.atten_db) + take(a.noise_db)
        ramping = (since >= 0) & (since < settle)
        if ramping.any():
            dbm[ramping] -= DARK_RAMP_DB * (1 - since[ramping] / settle[ramping])
        mw = np.where(take(a.lit_from) >= 0, 10.0 ** (dbm / 10.0), 0.0)
        if any_stale:
            mw = np.where(stale & (since < 0), take(a.before_mw), mw)  # refreshed before the change
        out: np.ndarray = np.minimum(np.rint(mw * 1e4), 0xFFFF) / 1e4
        return out

    def _whole(self, slots: np.ndarray) -> bool:
        """Whether `slots` is every port in slot order (remembered: a poller passes one array each tick)."""
        seen = self._whole_of
        if seen is not None and seen[0] is slots:
            return seen[1]
        whole = slots.size == len(self.port_at) and bool(np.array_equal(slots, np.arange(slots.size)))
        self._whole_of = (slots, whole)
        return whole

    def _rx_power_mw_each(self, slots: np.ndarray, t_ns: int) -> list[float]:
        """`rx_power_mw` one slot at a time, for a few ports (an agent's host): the same model, without a
        numpy call per step for arrays of four (tests/unit/test_rxpower_lanes.py holds the two equal).
        Every field of the ports is taken in one gather and `tolist()` per block, not an `.item()` per
        field per port (~5x the cost at 16 ports)."""
        a = self.arrays
        whole = self._whole(slots)  # a poller of the whole lab: every port in slot order
        optics = a.take_lists() if len(self.port_at) <= LIST_PORTS else None
        at: list[int] = [] if whole else slots.tolist()
        if optics is not None:  # a small lab: its optics as lists, kept from read to read
            ints, floats = optics.ints[2:], optics.floats
            if not whole:
                ints = [[row[s] for s in at] for row in ints]
                floats = [[row[s] for s in at] for row in floats]
        else:  # a few ports of a large lab: theirs only, one gather a block
            ints = (a.ints[2:] if whole else a.ints[2:].take(slots, axis=1)).tolist()
            floats = (a.floats if whole else a.floats.take(slots, axis=1)).tolist()
        lit_from, light_t, settle, update, phase, noise_t = ints  # PortArrays.INT_ROWS[2:]
        level, atten, before, noise = floats
        if any(update):
            times = [t_ns - (t_ns - p) % u if u > 0 else t_ns for u, p in zip(update, phase, strict=True)]
            fresh = [k for k, (t, seen) in enumerate(zip(times, noise_t, strict=True)) if seen != t]
        else:  # every module current on every read (the usual profile): no refresh to go back to
            times = [t_ns] * len(update)
            every = t_ns not in noise_t
            fresh = [*range(len(update))] if every else [k for k, seen in enumerate(noise_t) if seen != t_ns]
        if fresh:  # as the array code: one draw for the slots whose module refreshed, in slot order
            # (x - 0.5) * rx_noise_db per draw in Python: the same two IEEE operations numpy does per element
            spread = self.profile.rx_noise_db
            draws = [(x - 0.5) * spread for x in self.noise.random(len(fresh)).tolist()]
            if optics is not None:
                noise_row, noise_t_row = optics.floats[3], optics.ints[7]
                if whole and len(fresh) == len(times):  # every port refreshed (the usual profile)
                    noise_row[:] = draws
                    noise_t_row[:] = times
                else:
                    for k, draw in zip(fresh, draws, strict=True):  # in order: a slot twice keeps the later
                        slot = k if whole else at[k]
                        noise_row[slot] = draw
                        noise_t_row[slot] = times[k]
                optics.noise_changed = True
                noise = noise_row if whole else [noise_row[s] for s in at]
            else:
                unique = whole or len(set(at)) == len(at)
                index: slice | np.ndarray = (
                    (slice(None) if whole else slots) if len(fresh) == len(times) else slots[fresh]
                )
                a.noise_t_ns[index] = times if len(fresh) == len(times) else [times[k] for k in fresh]
                a.noise_db[index] = draws
                if unique:
                    for k, draw in zip(fresh, draws, strict=True):
                        noise[k] = draw
                else:  # a slot twice: each reads the draw its slot kept (the later one), as arrays do
                    noise = a.noise_db[slots].tolist()
        out = []
        columns = zip(times, light_t, update, before, lit_from, level, atten, noise, settle, strict=True)
        for t, light, u, was_mw, source, lvl, att, nz, s in columns:
            since = t - light
            if since < 0 and u > 0:  # refreshed before the change: the power before it
                mw = was_mw
            elif source >= 0:
                dbm = lvl - att + nz
                if 0 <= since < s:
                    dbm -= DARK_RAMP_DB * (1 - since / s)
                mw = 10.0 ** (dbm / 10.0)
            else:
                mw = 0.0
            word = round(mw * 1e4)  # the register's 0.1 µW, saturating
            out.append((word if word < 0xFFFF else 0xFFFF) / 1e4)
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
        """What a ping at t_ns must see of the model: its optics at t_ns (`sync_optics`), which carry each
        link's transport time from the light change that lit it. None of the link reactions: a busy host
        runs the fabric's timeline late (pings once failed on a link that was up, and catching the
        reactions up inside a sampler's tick stalled it for 10 ms at 512 ports; decision 0052)."""
        self.sync_optics(t_ns)

    def traffic_ok(self, slots: np.ndarray, peer_slots: np.ndarray, t_ns: int | None = None) -> np.ndarray:
        """Whether a ping-pong from each port to its peer (by slot) gets through at t_ns (default: now).

        Both ends must have transport up on the link between them at t_ns (decision 0044): each end lit by
        the other, neither end's light changed since their link lit, and its transport up by t_ns."""
        t = now_ns() if t_ns is None else t_ns
        self.sync_links(t)
        a = self.arrays
        up = (a.transport_up_ns <= t) & (a.light_t_ns <= a.link_t_ns)  # every port's end of its link
        lit_from = a.lit_from
        ok: np.ndarray = (
            up[slots] & up[peer_slots] & (lit_from[slots] == peer_slots) & (lit_from[peer_slots] == slots)
        )
        return ok

    def passes(self, slot: int, peer_slot: int, t_ns: int) -> bool:
        """`traffic_ok` for one packet from one port to another: plain scalar reads (per packet, not per
        tick, so no array round trip)."""
        return self.passes_each([(slot, peer_slot)], t_ns)[0]

    def passes_each(self, pairs: list[tuple[int, int]], t_ns: int) -> list[bool]:
        """`passes` for a few (slot, peer slot) pairs at one instant: the model caught up once, and the
        four fields a ping reads taken for every end in one gather and `tolist()` (not six `.item()` calls
        a pair)."""
        self.sync_links(t_ns)
        if not pairs:
            return []
        at: Iterable[tuple[int, int]]
        if len(self.port_at) <= LIST_PORTS:  # a small lab: its optics as lists, kept from read to read
            link_t, up, lit_from, light_t = self.arrays.take_lists().ints[:4]  # PortArrays.INT_ROWS
            at = pairs
        else:  # a few ports of a large lab: theirs only, by position
            ends = [slot for pair in pairs for slot in pair]
            link_t, up, lit_from, light_t = self.arrays.ints[:4].take(ends, axis=1).tolist()
            at = zip(range(0, len(ends), 2), range(1, len(ends), 2), strict=True)
        return [
            bool(
                lit_from[i] == d
                and lit_from[j] == s
                and up[i] <= t_ns
                and up[j] <= t_ns
                and light_t[i] <= link_t[i]
                and light_t[j] <= link_t[j]
            )
            for (s, d), (i, j) in zip(pairs, at, strict=True)
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
