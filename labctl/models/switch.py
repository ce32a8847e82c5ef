"""A behavioural model of an optical circuit switch: patch state, switching time, light on each port.

Shared by the in-process simulated driver (labctl/drivers/sim) and by the protocol emulators, so every
simulated or emulated switch moves light the same way. Light changes are delivered to listeners at
their model time through the event loop, carrying the exact model timestamp (integer ns).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable

from labctl.clock import now_ns
from labctl.errors import HardwareError
from labctl.mapping import Mapping, MappingDiff, PortSpace, apply_diff
from labctl.models.timeline import Timeline
from labctl.profiles import Profile

# egress port, ingress port whose light now reaches it (None: dark), model time
LightListener = Callable[[int, int | None, int], None]

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

    def _at(self, t_ns: int, egress: int, ingress: int | None) -> None:
        self.timeline.at(t_ns, self._light, t_ns, egress, ingress)
        for listener in self.schedule_listeners:
            listener(egress, ingress, t_ns)

    def _light(self, t_ns: int, egress: int, ingress: int | None) -> None:
        if ingress is None:
            self.lit.pop(egress, None)
        else:
            self.lit[egress] = ingress
        for listener in self.listeners:
            listener(egress, ingress, t_ns)

    async def execute(self, diff: MappingDiff) -> tuple[int, int]:
        """Carry out a diff. Returns (command received, switching done) in model ns; sleeps until done."""
        self.commands += 1
        if self.refusals > 0:
            self.refusals -= 1
            raise ChangeRefused(f"{self.name}: change refused ({self.refusals} more refusals set)")
        t_cmd = now_ns()
        self.patches = apply_diff(self.patches, diff)
        for _, egress in diff.remove:
            self._at(t_cmd + self.profile.draw_ns(self.rng, "light_loss_ms"), egress, None)
        t_done = t_cmd + self.profile.draw_ns(self.rng, "switching_ms")
        for ingress, egress in diff.add:
            self._at(t_done, egress, ingress)
        await asyncio.sleep(max(0, t_done - now_ns()) / 1e9)
        return t_cmd, t_done

    def lose_state(self) -> None:
        """As after a power cycle: every patch gone, every output dark."""
        self.patches = frozenset()
        t = now_ns()
        for egress in list(self.lit):
            self._at(t, egress, None)

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
