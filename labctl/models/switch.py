"""A behavioural model of an optical circuit switch: patch state, switching time, light on each port.

Shared by the in-process simulated driver (labctl/drivers/sim) and by the protocol emulators, so every
simulated or emulated switch moves light the same way. Light changes are delivered to listeners at
their model time through the event loop, carrying the exact model timestamp (integer ns).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from labctl.clock import now_ns
from labctl.errors import HardwareError
from labctl.mapping import Mapping, MappingDiff, PortSpace, apply_diff
from labctl.models.timeline import Timeline
from labctl.profiles import Profile

# egress port, ingress port whose light now reaches it (None: dark), model time
LightListener = Callable[[int, int | None, int], None]
# egress ports, ingress ports (-1: dark), model times: one array each, in the order the changes happened
LightBatchListener = Callable[[np.ndarray, np.ndarray, np.ndarray], None]

INSERTION_LOSS_DB = 1.5  # typical for a beam-steering OCS path


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
        self.timeline = Timeline()
        self.commands = 0
        self.refusals = 0
        """Fault injection: refuse this many of the next changes (each leaves the patches unchanged)."""

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

    def add_batch_listener(self, listener: LightBatchListener) -> None:
        """Told of light changes as arrays, a command's worth at a time (each change at its own model time):
        a model of hundreds of ports updates its optics in a few array operations instead of a Python call
        per port (labctl.models.fabric)."""
        self.batch_listeners.append(listener)

    def _at(self, times: Sequence[int], egresses: Sequence[int], ingresses: Sequence[int | None]) -> None:
        """Schedule light changes (egress now lit by ingress, None: dark) at their model times."""
        if not egresses:
            return
        for t_ns, egress, ingress in zip(times, egresses, ingresses, strict=True):
            for listener in self.schedule_listeners:
                listener(egress, ingress, t_ns)
        order = np.argsort(np.asarray(times, np.int64), kind="stable")
        batch = _LightBatch(
            np.asarray(times, np.int64)[order],
            np.asarray(egresses, np.int64)[order],
            np.asarray([-1 if i is None else i for i in ingresses], np.int64)[order],
        )
        self.timeline.at(int(batch.t_ns[0]), self._light, batch)

    def _light(self, batch: _LightBatch) -> None:
        """Apply the batch's changes due by the time the timeline is being run to; the rest stay scheduled
        at their own times."""
        start = batch.next
        end = int(np.searchsorted(batch.t_ns, self.timeline.horizon_ns, side="right"))
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

    async def execute(self, diff: MappingDiff) -> tuple[int, int]:
        """Carry out a diff. Returns (command received, switching done) in model ns; sleeps until done."""
        self.commands += 1
        if self.refusals > 0:
            self.refusals -= 1
            raise ChangeRefused(f"{self.name}: change refused ({self.refusals} more refusals set)")
        t_cmd = now_ns()
        self.patches = apply_diff(self.patches, diff)
        # Each mirror loses its light at its own time; the new paths all light up when switching is done.
        removed = [egress for _, egress in diff.remove]
        lost = [t_cmd + self.profile.draw_ns(self.rng, "light_loss_ms") for _ in removed]
        self._at(lost, removed, [None] * len(removed))
        t_done = t_cmd + self.profile.draw_ns(self.rng, "switching_ms")
        added = list(diff.add)
        self._at([t_done] * len(added), [egress for _, egress in added], [ingress for ingress, _ in added])
        await asyncio.sleep(max(0, t_done - now_ns()) / 1e9)
        return t_cmd, t_done

    def lose_state(self) -> None:
        """As after a power cycle: every patch gone, every output dark."""
        self.patches = frozenset()
        dark = list(self.lit)
        self._at([now_ns()] * len(dark), dark, [None] * len(dark))

    def power_dbm(self, port: int) -> float | None:
        """What the switch's own power monitor reads at `port`: input light on ingress, output on egress."""
        if self.space.is_ingress(port):
            return self.transmitting.get(port)
        ingress = self.lit.get(port)
        if ingress is None or ingress not in self.transmitting:
            return None
        return self.transmitting[ingress] - INSERTION_LOSS_DB

    def cancel_pending(self) -> None:
        self.timeline.cancel_all()

    def ports_lit(self) -> Iterable[int]:
        return self.lit.keys()


class _LightBatch:
    """Light changes of one command, sorted by model time; `next`: the first not yet applied."""

    __slots__ = ("egress", "ingress", "next", "t_ns")

    def __init__(self, t_ns: np.ndarray, egress: np.ndarray, ingress: np.ndarray) -> None:
        self.t_ns = t_ns
        self.egress = egress
        self.ingress = ingress
        self.next = 0
