"""Shared by tests/integration/test_rdma_verbs_rc.py and tests/unit/test_rdma_verbs_rc.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from labctl.events import Event
from labctl.probes.traffic import TrafficEndpoint
from labctl.probes.verbs_rc import VerbsRcProbe
from labctl.rdma.exchange import LocalExchange, QpExchange
from labctl.rdma.model import ModelFabric
from labctl.rdma.rc import QpAttrs
from labctl.sampling import RdmaSettings

A = TrafficEndpoint("nic:h1/eth0", "127.0.0.1", "lo", None, "h1")

B = TrafficEndpoint("nic:h2/eth0", "127.0.0.2", "lo", None, "h2")

TIMEOUT = 10  # 4.19 ms per retransmission; retry_cnt 7: the last try at 29.4 ms, RETRY_EXC at 33.6 ms


def _settings(policy: str = "reconnect") -> RdmaSettings:
    return RdmaSettings(timeout=TIMEOUT, retry_cnt=7, policy=policy)  # type: ignore[arg-type]


def _fabric(settings: RdmaSettings) -> ModelFabric:
    attrs = QpAttrs(timeout=settings.timeout, retry_cnt=settings.retry_cnt)
    return ModelFabric(attrs, latency_ns=5_000, seed=1)


@asynccontextmanager
async def _running(probes: list[VerbsRcProbe]) -> AsyncIterator[list[Event]]:
    """The probes started, their events collected; on exit every probe stopped and nothing left behind."""
    threads_before = set(threading.enumerate())
    events: list[Event] = []

    async def collect(probe: VerbsRcProbe) -> None:
        async for e in probe.events():
            events.append(e)

    tasks = []
    try:
        for probe in probes:
            await probe.__aenter__()
            tasks.append(asyncio.create_task(collect(probe)))
        yield events
    finally:
        for probe in probes:
            await probe.__aexit__(None, None, None)
        await asyncio.gather(*tasks)
    assert set(threading.enumerate()) <= threads_before, "a poller thread outlived its probe"
    assert asyncio.all_tasks() == {asyncio.current_task()}, "a task outlived the probes"


def _pair(settings: RdmaSettings, fabric: ModelFabric, **kw: int) -> VerbsRcProbe:
    """One probe holding both ends (both ports on one host): the exchange is in process."""
    return VerbsRcProbe(
        [A, B],
        qps=fabric,
        exchange=LocalExchange([A.source, B.source]),
        interval_us=kw.get("interval_us", 500),
        settings=settings,
        report_interval_ns=kw.get("report_interval_ns", 20_000_000),
    )


def _circuit(probe: VerbsRcProbe) -> None:
    probe.set_circuits({A.source: B.source, B.source: A.source})


async def _until(condition: Callable[[], bool], within_s: float = 3.0) -> None:
    for _ in range(round(within_s / 0.002)):
        if condition():
            return
        await asyncio.sleep(0.002)
    raise AssertionError(f"not within {within_s} s")


def _of(events: list[Event], kind: str, source: str = A.source) -> list[Event]:
    return [e for e in events if e.kind == kind and e.source == source]


_: type[QpExchange] = LocalExchange  # the in-process exchange keeps the Protocol
