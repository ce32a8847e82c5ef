"""An agent's mirror of the controller's behaviour model, replayed from the world feed (`FabricMirror`).

On a modeled lab, the simulated probes on an agent's host read this copy: the light and link changes of
the controller's one model, applied at their model times (decisions 0017, 0041, 0046).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np

from labctl.agents.wire import ANNOUNCED, HAPPENS, WITHDRAWN, WORLD_KINDS, Rejected, WorldItem
from labctl.core.clock import now_ns
from labctl.inventory.profiles import Profile
from labctl.inventory.schema import Inventory, NicPort
from labctl.models.fabric import SimFabric
from labctl.models.switch import SwitchModel
from labctl.models.timeline import Scheduled, Timeline
from labctl.probes.sampling import ModelSchedule

MIRROR_WAKE_NS = 4_000_000  # a lagging mirror's samplers wake this often (ModelSchedule.wake_ns)


class FabricMirror(SimFabric):
    """A `SimFabric` that does not compute link physics itself: the controller's model is the one truth
    (both ends of a link must agree on when it trains), and this copy replays its light and transitions at
    their model times, so the simulated probes on this host read the same lab as a one-process run.

    A switch change reaches a mirror up to three times (decision 0041): announced `feed_lead_ms` before its
    command goes out (mode ANNOUNCED), confirmed at its real model time when the switch model schedules it
    on the command's arrival (HAPPENS, ahead of the change on a quiet host), and again when it happens, with
    the settle time the model drew then. An announced loss is applied at its announced time (a local
    timer), not when a message arrives; a confirmation that gets here first moves it to the model's time,
    one that comes after it counts how early the mirror went dark (`early`: the command reached the model
    off its announced moment, usually by well under a sampling period). Returning light waits for its
    confirmation (applied at its model time, or on arrival if that is past), so a mirror does not show light
    before the model's switch could have moved it, for at most `wait_ns` (as late as the controller's
    recent commands came). Anything applied after its model time is counted
    (`late`, by how much). An item older than the light state already applied to a port is stale (a
    repeat, or overtaken) and ignored."""

    def __init__(
        self, inventory: Inventory, profile: Profile, rng: random.Random, *, lag_ns: int = 0
    ) -> None:
        dark = SwitchModel.many({name: s.space for name, s in inventory.switches.items()}, profile, rng)
        super().__init__(inventory, dark, profile, rng)
        self.by_source = {p.source: p for p in inventory.ports}
        self._light_t: dict[NicPort, int] = {}  # model time (local clock) of the light state applied per port
        self.lag_ns = lag_ns
        """How far this copy runs behind the model (decision 0046): an item of model time t is applied at
        t + lag on this host's clock, so a feed that took up to `lag_ns` to get here is still on time; the
        agent stamps what its probes saw `lag_ns` earlier, back on the model's time. With a lag, the copy
        is advanced only by its samplers, each at its tick's instant (`schedule`): a tick the host ran late
        still sees the copy as it was at that instant."""
        # Changes wait on a timeline that the readers catch up (`sync_optics`), so a sample taken at t sees
        # every change due by t even when the loop runs the timer late (or, lagging, has no timer at all).
        self._announced = Timeline(pull=lag_ns > 0)
        # Its samplers wake every few ms and read every instant due since (a wake-up per instant, per
        # agent, is what a host of many agents cannot afford); well within the lag.
        self.schedule = ModelSchedule(wake_ns=min(MIRROR_WAKE_NS, lag_ns // 4)) if lag_ns > 0 else None
        self._switch_timelines.append(self._announced)
        # Per direction ("back": light reaches a port, "lost"): changes applied at their model time
        # (announced ahead), and how late each of the others was applied.
        self.on_time = {"back": 0, "lost": 0}
        self.late_ns: dict[str, list[int]] = {"back": [], "lost": []}
        self.lead_ns: list[int] = []  # how far ahead of its model time each announced change arrived
        self.early_ns: dict[str, list[int]] = {"back": [], "lost": []}
        self.confirm_lead_ns: list[int] = []  # how far ahead of its model time each return was confirmed
        self._speculative: dict[NicPort, int] = {}  # a change applied at its announced time, per port
        self._held: dict[NicPort, str] = {}  # an announced return, until its command's confirmation
        self.stale = False
        """The world feed was cut (this agent lost the broker, whose clean session dropped what came
        meanwhile): until the controller's next snapshot, no ping gets through, rather than one through a
        link this copy no longer knows to be up (decision 0044's invariant)."""
        self._pending_light: dict[tuple[NicPort, str | None], Scheduled] = {}
        self.transitions = {"on_time": 0, "late": 0}  # link, carrier and transport changes
        self.transition_late_ns: list[int] = []
        self.notices = {"on_time": 0, "late": 0}  # the controller's circuit, window and switch notices
        self.notice_late_ns: list[int] = []
        self._pending_transitions: dict[tuple[NicPort, str], list[Scheduled]] = {}

    def _drop_pending(self, port: NicPort, kind: str) -> None:
        """Forget what was still to come for this port's signal (a snapshot supersedes it)."""
        if kind == "light":
            for key in [k for k in self._pending_light if k[0] == port]:
                self._pending_light.pop(key).cancel()
            self._held.pop(port, None)
        else:
            for entry in self._pending_transitions.pop((port, kind), []):
                entry.cancel()

    def apply(self, item: WorldItem, t_local_ns: int, *, snapshot: bool = False) -> None:
        """Apply one world item whose model time is `t_local_ns` on this host's clock: now if that is
        past, else at that time (an announced return: once confirmed). `snapshot`: the state at a run's
        start, not a change (never late)."""
        port = self.by_source.get(item.port)
        if port is None or item.kind not in WORLD_KINDS or item.mode not in (HAPPENS, ANNOUNCED, WITHDRAWN):
            raise Rejected(
                "malformed", f"world item for unknown port, kind {item.kind!r} or mode {item.mode}"
            )
        if item.peer is not None and item.peer not in self.by_source:
            raise Rejected("malformed", f"world item: light from unknown port {item.peer!r}")
        now = self.now()
        t_local_ns += self.lag_ns  # on this copy's clock (a snapshot's stamps too: its events shift back)
        if snapshot:
            self._drop_pending(port, item.kind)  # the snapshot is newer than anything still to come
        if item.kind != "light":
            value = 1 if item.value else 0
            if snapshot:
                self._transition(port, item.kind, value, t_local_ns)
            elif t_local_ns > now:  # on the timeline with the light, so a reader sees both in model order
                self.transitions["on_time"] += 1
                queued = self._pending_transitions.setdefault((port, item.kind), [])
                queued[:] = [e for e in queued if e.t_ns > now and not e.cancelled]  # (the rest ran)
                queued.append(
                    self._announced.at(t_local_ns, self._transition, port, item.kind, value, t_local_ns)
                )
            else:
                self.transitions["late"] += 1
                self.transition_late_ns.append(now - t_local_ns)
                self._transition(port, item.kind, value, t_local_ns)
            return
        if snapshot:  # the state as it is: at once, whatever this copy's clock says
            self._apply_light(port, item, t_local_ns)
            return
        direction = "lost" if item.peer is None else "back"
        if item.mode == WITHDRAWN:  # nothing announced for this port happens: its light is as given, now
            for key in [k for k in self._pending_light if k[0] == port]:
                self._pending_light.pop(key).cancel()
            self._held.pop(port, None)
            self._apply_light(port, item, max(t_local_ns, self._light_t.get(port, t_local_ns)))
            return
        if item.mode == ANNOUNCED:
            self.lead_ns.append(t_local_ns - now)
            if item.peer is not None:
                # Light coming back waits for its command's confirmation: were the command late (its
                # controller's loop busy at the announced moment), the announced time would show light
                # before the model's switch could have moved it. Not past `wait_ns`, though (as late as
                # the recent commands came): a confirmation later than that means a starved feed.
                self._held[port] = item.peer
                t_local_ns += max(0, item.wait_ns)
        else:
            if port in self._held and self._held[port] == item.peer:
                del self._held[port]
                self.confirm_lead_ns.append(t_local_ns - now)
            elif (port, item.peer) in self._pending_light:
                self.confirm_lead_ns.append(t_local_ns - now)
        key = (port, item.peer)
        pending = self._pending_light.pop(key, None)
        if pending is not None:
            pending.cancel()  # confirmed at its real time: this one holds
        if t_local_ns > now:
            self._pending_light[key] = self._announced.at(
                t_local_ns, self._apply_announced, port, item, t_local_ns, direction
            )
            return
        if self._apply_light(port, item, t_local_ns):
            self.late_ns[direction].append(now - t_local_ns)
            return
        applied = self._light_t.get(port)
        if applied is not None and applied < t_local_ns and self._speculative.get(port) == applied:
            # Confirmed after the speculative loss was applied: the mirror went dark this much before the
            # model did (the command reached the model that much after its announced moment).
            self.early_ns[direction].append(t_local_ns - applied)

    def confirm(self, t_local_ns: int) -> None:
        """The controller's model is complete through model time `t_local_ns` (this host's clock): every
        change up to it has reached this copy (the world feed's `through_ns`, after its items). The samplers
        read no instant past it (plus the lag): an instant they read is one this copy holds every change of,
        so a ping never passes a link that went down before it, however late the feed came (decision 0086).
        Without a lag no schedule holds the samplers: nothing to do."""
        if self.schedule is not None:
            self.schedule.raise_ceiling(t_local_ns + self.lag_ns)

    def at(self, t_ns: int, callback: Callable[[], None]) -> None:
        """Run `callback` when this copy reaches t_ns (on its own clock), in order with its changes."""
        self._announced.at(t_ns, callback)

    def notice(self, t_ns: int, callback: Callable[[], None]) -> None:
        """`at`, for a controller's notice to the probes stamped with its model time (`wire.NOTICE_T`):
        counted on time, or late by how much where this copy had already passed t_ns (it then runs at the
        next reading)."""
        now = self.now()
        if t_ns > now:
            self.notices["on_time"] += 1
        else:
            self.notices["late"] += 1
            self.notice_late_ns.append(now - t_ns)
        self._announced.at(t_ns, callback)

    def now(self) -> int:
        """Where this copy stands: the instant its samplers last read it at (lagging), else the clock's
        now. A change due after it is still on time."""
        return self._announced.horizon_ns if self._announced.pull else now_ns()

    def _apply_announced(self, port: NicPort, item: WorldItem, t_local_ns: int, direction: str) -> None:
        self._pending_light.pop((port, item.peer), None)
        unconfirmed = item.mode == ANNOUNCED and item.peer is not None
        if unconfirmed:
            self._held.pop(port, None)
        if self._apply_light(port, item, t_local_ns):
            if unconfirmed:  # its confirmation did not come in time: applied that wait late
                self.late_ns[direction].append(max(0, item.wait_ns))
            else:
                self.on_time[direction] += 1
            if item.mode == ANNOUNCED:
                self._speculative[port] = t_local_ns  # as announced: the confirmation may say otherwise

    def _apply_light(self, port: NicPort, item: WorldItem, t_local_ns: int) -> bool:
        """Apply a light state at its model time; False if it was stale or changed nothing."""
        st = self.ports[port]
        last = self._light_t.get(port)
        if last is not None and t_local_ns < last:
            return False  # overtaken by a later change already applied
        peer = self.by_source[item.peer] if item.peer is not None else None
        if t_local_ns == last:  # the change itself, again: now with the settle time the model drew
            st.settle_ns = item.settle_ns
            st.rx_level_dbm = item.level_dbm
            return False
        if st.light_from == peer and last is not None:
            return False  # no change (the model ignores a patch that leaves a port's light as it was)
        st.light_from = peer
        st.light_t_ns = t_local_ns
        st.settle_ns = item.settle_ns
        st.rx_level_dbm = item.level_dbm
        self._light_t[port] = t_local_ns
        return True

    def traffic_ok(self, slots: np.ndarray, peer_slots: np.ndarray, t_ns: int | None = None) -> np.ndarray:
        if self.stale:  # the feed was cut: nothing says these links are still up
            return np.zeros(slots.size, bool)
        return super().traffic_ok(slots, peer_slots, t_ns)

    def passes(self, slot: int, peer_slot: int, t_ns: int) -> bool:
        return not self.stale and super().passes(slot, peer_slot, t_ns)

    def passes_each(self, pairs: list[tuple[int, int]], t_ns: int) -> list[bool]:
        if self.stale:
            self.sync_optics(t_ns)
            return [False] * len(pairs)
        return super().passes_each(pairs, t_ns)

    def cancel_pending(self) -> None:
        super().cancel_pending()
        self._announced.cancel_all()
        self._pending_light.clear()
        self._pending_transitions.clear()
        self._held.clear()

    def stats(self) -> dict[str, int]:
        """How the world feed kept up, per direction: light changes applied at their model time, and how
        many were applied late (after a broker hop), by how much (median, max). The light coming back is
        what the optical mark measures: that many of its samples saw it late by that much. `notices_*`: the
        controller's circuit, window and switch notices likewise (a late re-target delays a traffic mark)."""
        out: dict[str, int] = {}
        for name, values in (("lead", self.lead_ns), ("confirm_lead", self.confirm_lead_ns)):
            if values:
                ordered = sorted(values)
                out[f"{name}_min_ns"] = ordered[0]
                out[f"{name}_median_ns"] = ordered[len(ordered) // 2]
        out["lag_ns"] = self.lag_ns
        if self.schedule is not None:
            # how often the samplers waited for the feed to confirm what they were about to read
            out["held_for_feed"] = self.schedule.holds
            out["held_for_feed_longest_ns"] = self.schedule.held_longest_ns
            out["feed_confirmation_given_up"] = self.schedule.ceilings_given_up
        out["transitions_on_time"] = self.transitions["on_time"]
        out["transitions_late"] = self.transitions["late"]
        if self.transition_late_ns:
            out["transitions_late_max_ns"] = max(self.transition_late_ns)
        out["notices_on_time"] = self.notices["on_time"]
        out["notices_late"] = self.notices["late"]
        if self.notice_late_ns:
            out["notices_late_max_ns"] = max(self.notice_late_ns)
        for direction, on_time in self.on_time.items():
            late = sorted(self.late_ns[direction])
            out[f"light_{direction}_on_time"] = on_time
            out[f"light_{direction}_late"] = len(late)
            early = self.early_ns[direction]
            out[f"light_{direction}_early"] = len(early)
            if early:
                out[f"light_{direction}_early_max_ns"] = max(early)
            if late:
                out[f"light_{direction}_late_median_ns"] = late[len(late) // 2]
                out[f"light_{direction}_late_max_ns"] = late[-1]
        return out
