"""A behavioural model of an optical circuit switch: patch state, switching time, light on each port.

Shared by the in-process simulated driver (labctl/ocs/drivers/sim) and by the protocol emulators, so every
simulated or emulated switch moves light the same way. Light changes are delivered to listeners at
their model time through the event loop, carrying the exact model timestamp (integer ns).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter

import numpy as np

from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError
from labctl.inventory.mapping import Mapping, MappingDiff, PortSpace, apply_diff
from labctl.inventory.profiles import Profile
from labctl.linux.timerfd import Alarm, sleep_until
from labctl.models.timeline import Timeline
from labctl.ocs.protocol import VOA_MODES

__all__ = [  # the public surface (docs/architecture.md, "Public surface"); the rest is internal
    "INSERTION_LOSS_DB",
    "MAX_ATTENUATION_DB",
    "VOA_MODES",
    "ChangeRefused",
    "OpmConfig",
    "SwitchModel",
    "VoaSetting",
]

# egress port, ingress port whose light now reaches it (None: dark), model time
LightListener = Callable[[int, int | None, int], None]
# egress port, ingress port (None: dark), model time, "announce" (a change drawn ahead of its command) or
# "withdraw" (what was announced for this egress will not happen: its light is as given, now)
AnnounceListener = Callable[[int, int | None, int, str], None]
# egress ports, ingress ports (-1: dark), model times: one array each, in the order the changes happened
LightBatchListener = Callable[[np.ndarray, np.ndarray, np.ndarray], None]

INSERTION_LOSS_DB = 1.5  # typical for a beam-steering OCS path
# egress port whose attenuation changed, model time
VoaListener = Callable[[int, int], None]

MAX_ATTENUATION_DB = 40.0
"""What VOA_MODE_MAXIMUM attenuates by, and the most any mode does (an emulator choice: decision 0064)."""
ATTENUATION_STEP_DB = 0.01
"""`atten-level` has two fraction digits (the YANG's floatFormat2d): the model's attenuation resolution."""


@dataclass(frozen=True, slots=True)
class VoaSetting:
    """One egress port's variable optical attenuator, as the optical-switch YANG's `voa/port` holds it.

    `level` is the output power in dBm (ABSOLUTE, CONVERGED) or the attenuation in dB below the reference
    ingress's light (RELATIVE); `reference` is that ingress (0: the one patched to the port); `held_db` is
    what FIXED holds (the attenuation in force when it was set)."""

    mode: str = "VOA_MODE_NONE"
    level: float = 0.0
    reference: int = 0
    held_db: float = 0.0


@dataclass(frozen=True, slots=True)
class OpmConfig:
    """One port's power monitor settings (the YANG's `opm-config/port`): the wavelength its readings are
    calibrated for (nm), an offset added to every reading (dB), and the averaging-time step (1..8)."""

    wavelength_nm: float = 1550.0
    offset_db: float = 0.0
    averaging_time: int = 4


class ChangeRefused(HardwareError):
    """The switch refused a change and left its patches as they were (a locked port, a busy controller)."""


class SwitchModel:
    """Patch state plus an optical timeline. Concurrent changes move independent mirrors in parallel."""

    def __init__(self, name: str, space: PortSpace, profile: Profile, rng: random.Random) -> None:
        self.name = name
        self.space = space
        self.profile = profile
        self.rng = rng
        self.patches: Mapping = frozenset()
        self.lit: dict[int, int] = {}  # egress → ingress whose light reaches it now
        self.transmitting: dict[int, float] = {}  # ingress → launch power (dBm) of the attached transmitter
        self.listeners: list[LightListener] = []
        self.batch_listeners: list[LightBatchListener] = []
        self.schedule_listeners: list[LightListener] = []
        self.announce_listeners: list[AnnounceListener] = []
        self.timeline = Timeline()
        # Announced ahead of their command (`arm`): egress -> [(model time, ingress or None, arming)], taken
        # by the command that carries them; what is left when the caller is done is withdrawn (`disarm`).
        self._armed: dict[int, list[tuple[int, int | None, int]]] = {}
        self._arming_go: dict[int, int] = {}
        self._armings = 0
        self.armed_stats = {
            "armed": 0,  # light changes announced ahead of their command
            "taken": 0,  # ... carried out by it
            "exact": 0,  # ... at their announced time
            "moved": 0,  # ... at another (the command came too early or late for it: see _take_armed)
            "moved_max_ns": 0,
            "withdrawn": 0,  # ... and withdrawn (no command took them)
            "command_early_max_ns": 0,  # how far before / after its announced moment a command came
            "command_late_max_ns": 0,
        }
        self.commands = 0
        self.refusals = 0
        """Fault injection: refuse this many of the next changes (each leaves the patches unchanged)."""
        self.voa: dict[int, VoaSetting] = {}  # egress → its attenuator, where one is set (not NONE)
        self.opm: dict[int, OpmConfig] = {}  # port → its power monitor settings, where not the defaults
        self.voa_listeners: list[VoaListener] = []

    @classmethod
    def many(
        cls, spaces: dict[str, PortSpace], profile: Profile, rng: random.Random
    ) -> dict[str, SwitchModel]:
        """One model per switch (name → port space), sharing the profile and the random stream."""
        return {name: cls(name, space, profile, rng) for name, space in spaces.items()}

    def add_listener(self, listener: LightListener) -> None:
        self.listeners.append(listener)

    def add_schedule_listener(self, listener: LightListener) -> None:
        """Told of every light change when it is scheduled (the command arrived), before it happens: a
        copy of the model elsewhere (an agent's mirror) can then apply it at its model time."""
        self.schedule_listeners.append(listener)

    def add_announce_listener(self, listener: AnnounceListener) -> None:
        """Told of light changes drawn ahead of their command (`arm`), and of their withdrawal: a copy of
        the model elsewhere can hold them before the command comes and its schedule confirms them."""
        self.announce_listeners.append(listener)

    def add_batch_listener(self, listener: LightBatchListener) -> None:
        """Told of light changes as arrays, a command's worth at a time (each change at its own model time):
        a model of hundreds of ports updates its optics in a few array operations instead of a Python call
        per port (labctl.models.fabric)."""
        self.batch_listeners.append(listener)

    def _at(self, times: Sequence[int], egresses: Sequence[int], ingresses: Sequence[int | None]) -> None:
        """Schedule light changes (egress now lit by ingress, None: dark) at their model times."""
        if not egresses:
            return
        self._tell_schedule(times, egresses, ingresses)
        self._on_timeline(times, egresses, ingresses)

    def _tell_schedule(
        self, times: Sequence[int], egresses: Sequence[int], ingresses: Sequence[int | None]
    ) -> None:
        if self.schedule_listeners:
            for t_ns, egress, ingress in zip(times, egresses, ingresses, strict=True):
                for listener in self.schedule_listeners:
                    listener(egress, ingress, t_ns)

    def _on_timeline(
        self, times: Sequence[int], egresses: Sequence[int], ingresses: Sequence[int | None]
    ) -> None:
        order = np.argsort(np.asarray(times, np.int64), kind="stable")
        batch = _LightBatch(
            np.asarray(times, np.int64)[order],
            np.asarray(egresses, np.int64)[order],
            np.asarray([-1 if i is None else i for i in ingresses], np.int64)[order],
        )
        self.timeline.at(int(batch.t_ns[0]), self._light, batch)

    def _light(self, batch: _LightBatch) -> None:
        """Apply the batch's changes due by the time the timeline is being run to, and before any other
        entry's (a command sent while an earlier one's light is still moving: a reader catching the model
        up over both applies their changes in model-time order, not one command's after the other's); the
        rest stay scheduled at their own times."""
        start = batch.next
        horizon, other = self.timeline.horizon_ns, self.timeline.next_due_ns()
        if other is not None and other <= horizon:
            end = int(np.searchsorted(batch.t_ns, other, side="left"))
        else:
            end = int(np.searchsorted(batch.t_ns, horizon, side="right"))
        end = max(end, start + 1)  # this entry was due: at least its first change is
        batch.next = end
        times, egresses, ingresses = batch.t_ns[start:end], batch.egress[start:end], batch.ingress[start:end]
        for egress, ingress in zip(egresses.tolist(), ingresses.tolist(), strict=True):
            if ingress < 0:
                self.lit.pop(egress, None)
            else:
                self.lit[egress] = ingress
        for batch_listener in self.batch_listeners:
            batch_listener(egresses, ingresses, times)
        if self.listeners:
            changes = zip(times.tolist(), egresses.tolist(), ingresses.tolist(), strict=True)
            for t_ns, egress, ingress in changes:
                for listener in self.listeners:
                    listener(egress, None if ingress < 0 else ingress, t_ns)
        if end < batch.t_ns.size:
            self.timeline.at(int(batch.t_ns[end]), self._light, batch)

    def arm(self, diff: MappingDiff, go_ns: int) -> int:
        """A command carrying `diff` is to arrive by `go_ns`: draw its delays now and tell the announce
        listeners of its light changes at once, at `go_ns` plus each delay, so that a copy of this model
        elsewhere (an agent's mirror, a broker hop away) has them before they happen (decision 0041). The
        command is sent about then (its driver's path here takes a loop turn or two): each change keeps its
        announced time where that is still a delay in the profile's range after the command's arrival
        (`_take_armed`); the schedule listeners confirm each at its real time, as for any command. Returns
        the arming's id for `disarm`."""
        self._armings += 1
        arming = self._armings
        self._arming_go[arming] = go_ns
        removed = sorted([egress for _, egress in diff.remove])
        for egress in removed:
            t_ns = go_ns + self.profile.draw_ns(self.rng, "light_loss_ms")
            self._armed.setdefault(egress, []).append((t_ns, None, arming))
            for announce in self.announce_listeners:
                announce(egress, None, t_ns, "announce")
        t_done = go_ns + self.profile.draw_ns(self.rng, "switching_ms")
        for ingress, egress in sorted(diff.add):
            self._armed.setdefault(egress, []).append((t_done, ingress, arming))
            for announce in self.announce_listeners:
                announce(egress, ingress, t_done, "announce")
        self.armed_stats["armed"] += len(removed) + len(diff.add)
        return arming

    def disarm(self, arming: int) -> list[int]:
        """Withdraw what an arming announced that no command took (the change was refused, failed or never
        sent): the egress ports whose announced light is not going to happen. The schedule listeners hear
        each one's light as it is now, so a mirror that applied the announcement goes back."""
        self._arming_go.pop(arming, None)
        ports = []
        for egress, pending in list(self._armed.items()):
            kept = [entry for entry in pending if entry[2] != arming]
            if len(kept) == len(pending):
                continue
            ports.append(egress)
            if kept:
                self._armed[egress] = kept
            else:
                del self._armed[egress]
        now = now_ns()
        for egress in ports:
            for announce in self.announce_listeners:
                announce(egress, self.lit.get(egress), now, "withdraw")
        self.armed_stats["withdrawn"] += len(ports)
        return ports

    def _take_armed(self, egress: int, ingress: int | None, t_cmd: int, delay: str) -> int | None:
        """The model time of this change if it was announced (else None): its announced time, where that
        is a delay within the profile's range `delay` after the command's arrival; else the nearest time
        that is. So a command that reached the model a little early or late (its driver's path takes a loop
        turn or two) keeps its announcement, and the switch never moves faster or slower than its profile
        says (a change moved counts in `armed_stats`: a mirror that applied the announced time was off by
        that much, unless the confirmation reached it first)."""
        pending = self._armed.get(egress)
        if not pending:
            return None
        for k, (t_ns, armed_ingress, arming) in enumerate(pending):
            if armed_ingress == ingress:
                del pending[k]
                if not pending:
                    del self._armed[egress]
                go_ns = self._arming_go.get(arming, t_cmd)
                low, high = self.profile.range_ns(delay)
                t_model = min(max(t_ns, t_cmd + low), t_cmd + high)
                stats = self.armed_stats
                stats["taken"] += 1
                if t_model == t_ns:
                    stats["exact"] += 1
                else:
                    stats["moved"] += 1
                    stats["moved_max_ns"] = max(stats["moved_max_ns"], abs(t_model - t_ns))
                stats["command_early_max_ns"] = max(stats["command_early_max_ns"], go_ns - t_cmd)
                stats["command_late_max_ns"] = max(stats["command_late_max_ns"], t_cmd - go_ns)
                return t_model
        return None

    async def execute(self, diff: MappingDiff) -> tuple[int, int]:
        """Carry out a diff. Returns (command received, switching done) in model ns; sleeps until done."""
        self.commands += 1
        if self.refusals > 0:
            self.refusals -= 1
            raise ChangeRefused(f"{self.name}: change refused ({self.refusals} more refusals set)")
        t_cmd = now_ns()
        self.patches = apply_diff(self.patches, diff)
        # Each mirror loses its light at its own time; the new paths all light up when switching is done.
        # Delays drawn when the change was announced ahead (`arm`) count from the command's arrival too.
        removed = sorted([egress for _, egress in diff.remove])
        lost = self._times(t_cmd, removed, [None] * len(removed), "light_loss_ms")
        self._at(lost, removed, [None] * len(removed))
        added = sorted(diff.add, key=itemgetter(1))  # by egress
        ingresses: list[int | None] = [ingress for ingress, _ in added]
        egresses = [egress for _, egress in added]
        back = self._times(t_cmd, egresses, ingresses, "switching_ms")
        t_done = max(back) if back else t_cmd + self.profile.draw_ns(self.rng, "switching_ms")
        if back and min(back) == t_done > now_ns() and not self.timeline.pull:
            await self._acknowledge_then_light(t_done, back, egresses, ingresses)
        else:
            self._at(back, egresses, ingresses)
            if t_done > now_ns():  # a switch of 0 ms answers at once, as a driver whose reply is already in
                # to the microsecond, as a switch's own reply would: asyncio.sleep's whole-millisecond
                # rounding (~0.5 ms late on average) would count as the controller's overhead
                await sleep_until(t_done)
        return t_cmd, t_done

    async def _acknowledge_then_light(
        self, t_done: int, times: list[int], egresses: list[int], ingresses: list[int | None]
    ) -> None:
        """Wait to t_done (a timerfd, to the microsecond), the command's new paths lighting up then too:
        the acknowledgement's turn first, the light's entry on the timeline a turn after it. In a real lab
        the NICs react on other machines while the controller takes the switch's reply; in one loop the
        fabric model's reactions to 2 x 16 ports (~0.3 ms) would run first and land in the control path
        the controller times. Every reaction still carries its model time (t_done): the order in the loop
        changes no stamp. Cancelled before t_done, the light is scheduled at once: it still comes."""
        loop = asyncio.get_running_loop()
        self._tell_schedule(times, egresses, ingresses)
        waiter: asyncio.Future[None] = loop.create_future()
        scheduled = fired = False

        def light() -> None:
            nonlocal scheduled
            if not scheduled:
                scheduled = True
                self.timeline.undefer(deferred)
                self._on_timeline(times, egresses, ingresses)

        # A reader catching the model up past t_done before that turn (a sampler's tick handled first in a
        # late loop) sees the light all the same: read dark, it would move t2 and shrink its resolution.
        deferred = self.timeline.defer(t_done, light)

        def fire() -> None:
            nonlocal fired
            fired = True
            if not waiter.done():
                waiter.set_result(None)  # wakes the acknowledged command's task next turn ...
            loop.call_soon(light)  # ... and the light comes after it

        alarm = Alarm(on_fire=fire)
        try:
            alarm.arm(t_done)
            await waiter
        finally:
            alarm.close()
            if not fired:
                light()

    def _times(self, t_cmd: int, egresses: list[int], ingresses: list[int | None], delay: str) -> list[int]:
        """Each change's model time: as announced (`_take_armed`), else drawn now from `delay` after the
        command's arrival (one draw for all the new paths of a command: they light up together when
        switching is done)."""
        if not self._armed:  # nothing announced (no agents' mirrors): the same draws, without a call per port
            if not egresses:
                return []
            if ingresses.count(None) == len(ingresses):
                lost: list[int] = (t_cmd + _draws_ns(self.profile, self.rng, delay, len(egresses))).tolist()
                return lost
            if None not in ingresses:
                return [t_cmd + self.profile.draw_ns(self.rng, delay)] * len(egresses)
        times: list[int] = []
        shared: int | None = None
        for egress, ingress in zip(egresses, ingresses, strict=True):
            armed = self._take_armed(egress, ingress, t_cmd, delay)
            if armed is not None:
                times.append(armed)
            elif ingress is None:
                times.append(t_cmd + self.profile.draw_ns(self.rng, delay))
            else:
                shared = shared if shared is not None else t_cmd + self.profile.draw_ns(self.rng, delay)
                times.append(shared)
        return times

    def lose_state(self) -> None:
        """As after a power cycle: every patch gone, every output dark."""
        self.patches = frozenset()
        dark = list(self.lit)
        self._at([now_ns()] * len(dark), dark, [None] * len(dark))

    def power_dbm(self, port: int) -> float | None:
        """The light at `port`: input light on ingress, output on egress (after its attenuator)."""
        if self.space.is_ingress(port):
            return self.transmitting.get(port)
        ingress = self.lit.get(port)
        if ingress is None or ingress not in self.transmitting:
            return None
        return self.transmitting[ingress] - INSERTION_LOSS_DB - self.attenuation_db(port, ingress)

    def monitor_dbm(self, port: int) -> float | None:
        """What the switch's own power monitor reports at `port`: the light plus the port's `opm-config`
        offset (the YANG: the offset is added when reporting opm-power; the wavelength changes nothing here,
        the model's light has no spectrum)."""
        dbm = self.power_dbm(port)
        config = self.opm.get(port)
        return dbm if dbm is None or config is None else dbm + config.offset_db

    # -- variable optical attenuators and power monitor settings ---------------------------------------------
    def add_voa_listener(self, listener: VoaListener) -> None:
        """Told when an egress port's attenuator setting changes (egress, model time): the light the NIC on
        that port receives changes at once (labctl.models.fabric)."""
        self.voa_listeners.append(listener)

    def set_voa(self, egress: int, setting: VoaSetting) -> None:
        """Set the attenuator of an egress port (ValueError: not an egress, or a mode the YANG lacks). FIXED
        holds the attenuation in force now. Takes effect at once (no VOA settling time is modelled)."""
        if not self.space.is_egress(egress):
            raise ValueError(f"port {egress} is not an egress port: attenuators sit on egress ports")
        if setting.mode not in VOA_MODES:
            raise ValueError(f"atten-mode {setting.mode!r}: one of {', '.join(VOA_MODES)}")
        if setting.mode == "VOA_MODE_FIXED":
            setting = VoaSetting(setting.mode, held_db=self.attenuation_db(egress))
        if setting.mode == "VOA_MODE_NONE":
            self.voa.pop(egress, None)
        else:
            self.voa[egress] = setting
        t_ns = now_ns()
        for listener in self.voa_listeners:
            listener(egress, t_ns)

    def voa_setting(self, egress: int) -> VoaSetting:
        return self.voa.get(egress, VoaSetting())

    def attenuation_db(self, egress: int, ingress: int | None = None) -> float:
        """How many dB the egress port's attenuator takes off the light reaching it from `ingress` (default:
        the ingress patched to it now), to `ATTENUATION_STEP_DB`, between 0 and `MAX_ATTENUATION_DB`.
        ABSOLUTE and CONVERGED attenuate the path down to `level` dBm (not at all where it is below that, or
        dark); RELATIVE to `level` dB below the reference ingress's light (the path's own: `level` dB)."""
        setting = self.voa.get(egress)
        if setting is None:
            return 0.0
        mode = setting.mode
        if mode == "VOA_MODE_MAXIMUM":
            return MAX_ATTENUATION_DB
        if mode == "VOA_MODE_FIXED":
            return setting.held_db
        ingress = self.lit.get(egress) if ingress is None else ingress
        path = None if ingress is None else self.transmitting.get(ingress)
        if mode == "VOA_MODE_RELATIVE":
            reference = setting.reference or ingress
            if reference is None or reference == ingress or path is None:
                atten = setting.level
            else:
                ref = self.transmitting.get(reference)
                atten = setting.level if ref is None else path - (ref - setting.level)
        else:  # ABSOLUTE, CONVERGED: a target output power
            atten = 0.0 if path is None else path - INSERTION_LOSS_DB - setting.level
        atten = min(max(atten, 0.0), MAX_ATTENUATION_DB)
        return round(round(atten / ATTENUATION_STEP_DB) * ATTENUATION_STEP_DB, 2)

    def set_opm(self, port: int, config: OpmConfig) -> None:
        """A port's power monitor settings (ValueError outside the YANG's ranges)."""
        if port not in self.space.all_ports:
            raise ValueError(f"port {port} is not a port of this {self.space} switch")
        if not 1260.0 <= config.wavelength_nm <= 1640.0:
            raise ValueError(f"wavelength {config.wavelength_nm:g} nm is outside 1260..1640")
        if not -100.0 <= config.offset_db <= 100.0:
            raise ValueError(f"offset {config.offset_db:g} dB is outside -100..100")
        if not 1 <= config.averaging_time <= 8:
            raise ValueError(f"averaging-time {config.averaging_time} is outside 1..8")
        if config == OpmConfig():
            self.opm.pop(port, None)
        else:
            self.opm[port] = config

    def opm_config(self, port: int) -> OpmConfig:
        return self.opm.get(port, OpmConfig())

    def cancel_pending(self) -> None:
        self.timeline.cancel_all()

    def ports_lit(self) -> Iterable[int]:
        return self.lit.keys()


def _draws_ns(profile: Profile, rng: random.Random, name: str, n: int) -> np.ndarray:
    """`Profile.draw_many_ns` as an array: the same stream of draws and the same values (random.uniform(a,
    b) is a + (b - a) * random(); round() and rint both round half to even), with one Python call a draw
    instead of three."""
    low, high = getattr(profile, name)
    unit = 1_000 if name.endswith("_us") else 1_000_000
    draw = rng.random
    r = np.array([draw() for _ in range(n)])
    ns: np.ndarray = np.rint((low + (high - low) * r) * unit).astype(np.int64)
    return ns


class _LightBatch:
    """Light changes of one command, sorted by model time; `next`: the first not yet applied."""

    __slots__ = ("egress", "ingress", "next", "t_ns")

    def __init__(self, t_ns: np.ndarray, egress: np.ndarray, ingress: np.ndarray) -> None:
        self.t_ns = t_ns
        self.egress = egress
        self.ingress = ingress
        self.next = 0
