"""The switches' own per-port optical power monitors, polled as a second Rx power source."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError
from labctl.core.events import Event, Kind
from labctl.ocs.protocol import OpticalSwitch
from labctl.probes.base import ProbeContext, ProbeKind
from labctl.probes.sampling import Probe, QueueProbe, ticks


class SwitchPowerProbe(QueueProbe):
    """Polls `OpticalSwitch.port_power(ports)` of every watched switch at `hz`, each switch on its own.

    The driver call itself writes one `rx_power` event per port with source `ocs:<switch>/<port>` (every
    driver call feeds the event stream), so this probe only paces the calls. A failed read is recorded as
    an `ocs.error` event and polling goes on: the switch's monitor is a second opinion, never a reason to
    stop a run.
    """

    name = "switch-power"
    counters = ("reads", "errors")

    def __init__(self, watched: Sequence[tuple[OpticalSwitch, Sequence[int]]], hz: float) -> None:
        super().__init__(queue_size=16)
        self.watched = [(switch, sorted(set(ports))) for switch, ports in watched]
        self.period_ns = round(1e9 / hz)
        self.reads = 0
        self.errors = 0

    async def _read(self, switch: OpticalSwitch, ports: list[int]) -> None:
        try:
            await switch.port_power(ports)
            self.reads += 1
        except HardwareError as e:
            self.errors += 1
            self.queue.put(
                Event(
                    t_ns=now_ns(),
                    kind=Kind.OCS_ERROR,
                    source=f"ocs:{switch.name}",
                    value=str(e),
                    meta={"operation": "port_power", "errors": self.errors},
                )
            )

    async def _poll(self, switch: OpticalSwitch, ports: list[int]) -> None:
        async with contextlib.aclosing(ticks(self.period_ns)) as schedule:
            async for _ in schedule:
                await self._read(switch, ports)

    async def _run(self) -> None:
        # One schedule per switch: a slow or unreachable switch (up to its operation deadline) delays only
        # its own readings.
        async with asyncio.TaskGroup() as group:
            for switch, ports in self.watched:
                group.create_task(self._poll(switch, ports), name=f"switch-power:{switch.name}")


def _build(ctx: ProbeContext) -> Probe:
    return SwitchPowerProbe(ctx.switches, ctx.settings.switch_power_hz)


PROBE = ProbeKind(
    "switch-power",
    (Kind.RX_POWER, Kind.OCS_ERROR),
    "the switches' own per-port power monitors, at switch_power_hz (the readings are the drivers' own "
    "rx_power events; this probe writes only the ocs.error of a failed read)",
    _build,
)
