"""Carrier as a poll sees it: each port's carrier read from the lab's behaviour model at link_state_hz.

A sampled cross-check of `model-link` (which reports every transition at its model time). Like every
carrier source it writes transitions, not levels: each port's first reading (`meta.initial`), then an event
each time a poll sees that port's carrier change, stamped at that poll and bracketed by the poll before it
(`meta.prev_ns`), so its marks are late by up to one period, as a real poller's would be."""

from __future__ import annotations

from collections.abc import Sequence

from labctl.core.events import Event, Kind
from labctl.inventory.schema import NicPort
from labctl.models.fabric import SimFabric
from labctl.probes.base import ProbeContext, ProbeKind
from labctl.probes.sampling import Probe, QueueProbe, run_ticks


class PolledCarrierProbe(QueueProbe):
    name = "polled-carrier"
    counters = ("samples",)  # stats() reports each counter and its rate in run.json

    def __init__(self, world: SimFabric, ports: Sequence[NicPort], hz: float) -> None:
        super().__init__(queue_size=4096)  # bounded: a full queue drops the oldest and counts it
        self.world = world
        self.ports = list(ports)
        self.period_ns = round(1e9 / hz)
        self.last: dict[str, int] = {}  # each port's carrier as its last sample saw it
        self.prev_tick_ns: int | None = None  # the sample before: where a change seen now may have happened
        self.samples = 0

    def tick(self, t_ns: int) -> None:
        """One sample of every port, stamped `t_ns`: an event for each port whose carrier it sees change.

        No heartbeat while steady: the breakdown takes a port's first `carrier` 1 after a reconfiguration's
        command as its new link's carrier-up (t4), so a heartbeat of the old link's carrier, polled between
        the command and the drop, would be a carrier-up before the new link's firmware was up."""
        reports = []
        for port in self.ports:
            carrier = self.world.state(port).carrier  # this port's own reading, in this sample
            was = self.last.get(port.source)
            if carrier == was:
                continue
            self.last[port.source] = carrier
            # The first reading is the state found, not a change. A change happened after the sample before
            # (`prev_ns`), which did not see it: the breakdown and the causality checks read that bracket.
            meta = {"initial": True} if was is None else {"prev_ns": self.prev_tick_ns}
            event = Event(
                t_ns=t_ns, kind=Kind.CARRIER, source=port.source, host=port.host, value=carrier, meta=meta
            )
            reports.append(event)
        self.prev_tick_ns = t_ns
        self.samples += len(self.ports)
        self.report(iter(reports), len(reports))

    async def _run(self) -> None:
        await run_ticks(self.period_ns, self.tick)  # absolute schedule; the tick runs in the timer's callback


def _build(ctx: ProbeContext) -> Probe:
    return PolledCarrierProbe(
        ctx.require_world("polled-carrier"),
        [site.port for site in ctx.ports],
        ctx.settings.link_state_hz,
    )


PROBE = ProbeKind(
    "polled-carrier",
    (Kind.CARRIER,),
    "each port's carrier read from the lab's behaviour model at link_state_hz",
    _build,
)
