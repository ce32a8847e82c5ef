"""What probes read of the NIC-side model: each port's Rx power as its module reports it, whether a ping
gets through, a ping's round trip; a whole lab in a few array operations, a few ports in plain Python
(`SimFabric` is this and `labctl.models.fabric`'s light-in, transitions-out model)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from labctl.core.clock import now_ns
from labctl.inventory.profiles import Profile
from labctl.inventory.schema import NicPort
from labctl.models.port_arrays import PortArrays
from labctl.models.timeline import Timeline

DARK_RAMP_DB = 30.0  # Rx power rises from ~30 dB below its level while the optics settle


SCALAR_SLOTS = 16
"""Up to this many ports a read computes each in Python (`_rx_power_mw_each`); above, with arrays."""

LIST_PORTS = 64
"""A lab of up to this many ports keeps its optics as lists for few-port readers (`PortArrays.take_lists`);
a larger one is gathered from per read (building the lists again after each light change would cost more)."""


class FabricReadings:
    """The readers of `SimFabric`, over the state it keeps (declared here, set by `SimFabric.__init__`)."""

    profile: Profile
    noise: np.random.Generator
    port_at: list[NicPort]
    slot: dict[NicPort, int]
    arrays: PortArrays
    _whole_of: tuple[np.ndarray, bool] | None
    _switch_timelines: list[Timeline]

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
