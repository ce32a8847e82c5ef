"""Carrier as a poll sees it: each port's carrier read from the lab's behaviour model at link_state_hz.

A sampled cross-check of `model-link` (which reports every transition at its model time): the marks it
gives are late by up to one period, as a real poller's would be."""

from __future__ import annotations

from collections.abc import Sequence

from labctl.core.events import Event, Kind
from labctl.inventory.schema import NicPort
from labctl.models.fabric import SimFabric
from labctl.probes.base import ProbeContext, ProbeKind
from labctl.probes.sampling import Probe, QueueProbe, ReportGate, run_ticks


class PolledCarrierProbe(QueueProbe):
    name = "polled-carrier"
    counters = ("samples",)  # stats() reports each counter and its rate in run.json

    def __init__(
        self, world: SimFabric, ports: Sequence[NicPort], hz: float, report_interval_ns: int
    ) -> None:
        super().__init__(queue_size=4096)  # bounded: a full queue drops the oldest and counts it
        self.world = world
        self.ports = list(ports)
        self.period_ns = round(1e9 / hz)
        self.gate = ReportGate(report_interval_ns)
        self.last: dict[str, int] = {}
        self.prev_tick_ns: int | None = None  # the sample before: where a change seen now may have happened
        self.samples = 0

    def tick(self, t_ns: int) -> None:
        """One sample of every port, stamped `t_ns`: an event on a change and a heartbeat while steady."""
        reports = []
        for port in self.ports:
            carrier = self.world.state(port).carrier
            changed = self.last.get(port.source) != carrier
            self.last[port.source] = carrier
            if self.gate.due(port.source, changed, t_ns):
                # A change is seen a period late at most: its bracket (`prev_ns`, the sample before that
                # did not see it) says so, and the breakdown and the causality checks read it.
                meta = {"prev_ns": self.prev_tick_ns} if changed and self.prev_tick_ns is not None else {}
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
        ctx.report_interval_ns,
    )


PROBE = ProbeKind(
    "polled-carrier",
    (Kind.CARRIER,),
    "each port's carrier read from the lab's behaviour model at link_state_hz",
    _build,
)
