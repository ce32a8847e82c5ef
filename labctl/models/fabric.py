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

import asyncio
import functools
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from labctl.clock import now_ns
from labctl.events import Kind
from labctl.inventory import Inventory, NicPort
from labctl.models.switch import INSERTION_LOSS_DB, SwitchModel
from labctl.models.timeline import Scheduled, Timeline
from labctl.profiles import Profile

TRANSPORT = "transport"
"""A transition of the model only (no event kind): the link carries traffic end to end."""

# port, kind (Kind.LINK_FIRMWARE | Kind.CARRIER | TRANSPORT), value 0/1, model time
TransitionListener = Callable[[NicPort, str, int, int], None]

LINK_CHUNK = 64  # link reactions worked out per loop turn (~10 µs each)
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
        self.before_mw = np.zeros(n)  # power before the last light change: what a stale module still shows
        self.update_ns = np.zeros(n, np.int64)  # the module's DOM refresh interval (0: current on every read)
        self.update_phase_ns = np.zeros(n, np.int64)
        self.noise_db = np.zeros(n)  # the noise on the module's current reading
        self.noise_t_ns = np.full(n, -1, np.int64)  # ...and the refresh it belongs to


class PortState:
    """One NIC port of the model. The optical fields are views of the fabric's `PortArrays`."""

    __slots__ = ("_fabric", "carrier", "firmware", "generation", "port", "slot")

    def __init__(self, fabric: SimFabric, port: NicPort, slot: int) -> None:
        self._fabric = fabric
        self.port = port
        self.slot = slot
        self.firmware = 0
        self.carrier = 0
        self.generation = 0

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


@dataclass
class _Pending:
    """A transition scheduled at model time `t_ns`, valid while the port's link generation is unchanged."""

    t_ns: int
    generation: int
    kind: str
    value: int
    handle: Scheduled | None = None


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
        self._links: deque[tuple[NicPort, NicPort | None, NicPort | None, int, bool]] = deque()
        """Light changes whose link reaction is still to be worked out, in model-time order."""
        self._drain_handle: asyncio.Handle | None = None
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
            model.add_listener(functools.partial(self._on_light, name))
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
        """Light changed at an egress port: the port's optics follow at once (what Rx power and traffic
        read); the link's reaction (firmware, carrier, transport) is worked out just after, a chunk at a
        time (`_links`), so that a switch moving 512 ports does not stall every sampler for 10 ms. Those
        transitions carry their model times, and any that falls due is preceded by the light changes
        before it (`_drain_until`), so the order in model time is kept."""
        port = self._by_rx.get((switch, egress))
        if port is None:
            return
        source = self._by_tx.get((switch, ingress)) if ingress is not None else None
        st = self.ports[port]
        if st.light_from == source:
            return
        old = st.light_from
        st.light_from = source
        st.light_t_ns = t_ns
        st.settle_ns = self.profile.draw_ns(self.rng, "optical_settle_ms") if source is not None else 0
        both_lit = source is not None and self.ports[source].light_from == port
        self._links.append((port, old, source, t_ns, both_lit))
        if self._drain_handle is None:
            self._drain_handle = asyncio.get_running_loop().call_soon(self._drain)

    def _link(
        self, port: NicPort, old: NicPort | None, source: NicPort | None, t_ns: int, both: bool
    ) -> None:
        # A late event loop may deliver this change before transitions that happened earlier in model time
        # (e.g. a carrier-down still queued when the new light arrives): apply those first, in time order.
        self._apply_due([p for p in (port, old, source) if p is not None], t_ns)
        if old is not None:
            self._link_down(port, old, t_ns)
        if both and source is not None:
            self._link_lit(port, source, t_ns)

    def _drain(self) -> None:
        self._drain_handle = None
        for _ in range(LINK_CHUNK):
            if not self._links:
                return
            self._link(*self._links.popleft())
        if self._links:  # the rest after whatever else is due (a sampler's tick)
            self._drain_handle = asyncio.get_running_loop().call_soon(self._drain)

    def _drain_until(self, t_ns: int) -> None:
        """Work out the links of every light change up to model time t_ns (before delivering anything at
        t_ns)."""
        while self._links and self._links[0][3] <= t_ns:
            self._link(*self._links.popleft())

    def _link_down(self, a: NicPort, b: NicPort, t_ns: int) -> None:
        """Light from b no longer reaches a: the a-b link drops at both ends."""
        for port in (a, b):
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
        self._drain_until(pending.t_ns)
        self._pending[port].remove(pending)
        if self.ports[port].generation == pending.generation:
            self._transition(port, pending.kind, pending.value, pending.t_ns)

    def _catch_up(self, ports: list[NicPort], t_ns: int) -> None:
        """Bring these ports up to model time t_ns: every light change and pending transition before it."""
        self._drain_until(t_ns)
        self._apply_due(ports, t_ns)

    def _apply_due(self, ports: list[NicPort], t_ns: int) -> None:
        due = [(port, x) for port in set(ports) for x in self._pending.get(port, ()) if x.t_ns <= t_ns]
        due.sort(key=lambda item: item[1].t_ns)
        for port, pending in due:
            if pending.handle is not None:
                pending.handle.cancel()
            self._fire(port, pending)

    def _transition(self, port: NicPort, kind: str, value: int, t_ns: int) -> None:
        st = self.ports[port]
        attr = "firmware" if kind == Kind.LINK_FIRMWARE else kind
        if getattr(st, attr) == value:
            return
        setattr(st, attr, value)
        for listener in self.listeners:
            listener(port, kind, value, t_ns)

    def cancel_pending(self) -> None:
        self.timeline.cancel_all()
        self._pending.clear()
        self._links.clear()
        if self._drain_handle is not None:
            self._drain_handle.cancel()
            self._drain_handle = None

    # -- what probes read ------------------------------------------------------------------------------------
    def rx_power_mw(self, slots: np.ndarray, t_ns: int) -> np.ndarray:
        """What each port's module reports at t_ns, in mW (0: no light), for ports by slot.

        A module refreshes its DOM registers every `update_ns` (the profile's `dom_update_ms`; 0: on every
        read), so a read returns the power at the module's last refresh, which may predate the latest
        light change (then it still shows the power from before it). Values are quantized to the
        register's 0.1 µW and saturate at 6.5535 mW, as an SFF-8636 Rx power word does."""
        self.sync_optics(t_ns)
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

    def traffic_ok(self, slots: np.ndarray, peer_slots: np.ndarray) -> np.ndarray:
        """Whether a ping-pong from each port to its peer (by slot) would get through now."""
        self.sync_optics(now_ns())
        a = self.arrays
        ok: np.ndarray = a.transport[slots] & (a.lit_from[slots] == peer_slots) & a.transport[peer_slots]
        return ok

    def passes(self, slot: int, peer_slot: int, t_ns: int) -> bool:
        """`traffic_ok` for one packet from one port to another: plain scalar reads (per packet, not per
        tick, so no array round trip)."""
        self.sync_optics(t_ns)
        a = self.arrays
        return bool(a.transport[slot] and a.lit_from[slot] == peer_slot and a.transport[peer_slot])

    def rtt_ns(self) -> int:
        """The round trip of one ping-pong on a working circuit. Drawn from the noise stream: how often the
        probes ping must not change the link delays a seed draws."""
        low, high = self.profile.rtt_us
        return round(float(self.noise.uniform(low, high)) * 1_000)
