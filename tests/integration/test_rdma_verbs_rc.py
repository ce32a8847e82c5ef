"""The verbs-rc probe's logic against a behaviour model of verbs RC queue pairs (labctl.rdma.model: the IB
RC rules of labctl.rdma.rc over an in-memory fabric that can go dark), behind the same RcQp Protocol as
VerbsQp: the ping-pong completes; a dark gap inside the retry budget is ridden through and traffic is back
within one retransmission period of the light; a longer one ends in IBV_WC_RETRY_EXC_ERR and the error
state, then a reconnect (policy reconnect) or a port left down (survive). The real pyverbs module without a
device is one line from the probe's open. Nothing is left running: no task, no thread."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError
from labctl.core.events import Event, Kind
from labctl.probes.sampling import RdmaSettings
from labctl.probes.traffic import TrafficEndpoint
from labctl.probes.verbs_rc import VerbsRcProbe
from labctl.rdma.exchange import LocalExchange, PortExchange, QpExchange
from labctl.rdma.model import ModelFabric
from labctl.rdma.rc import QpAttrs
from tests.helpers.rdma_verbs_rc import A

B = TrafficEndpoint("nic:h2/eth0", "127.0.0.2", "lo", None, "h2")


TIMEOUT = 10  # 4.19 ms per retransmission; retry_cnt 7: the last try at 29.4 ms, RETRY_EXC at 33.6 ms


PERIOD_NS = 4096 << TIMEOUT


SLACK_NS = 8_000_000  # a loaded 2-core CI machine: thread wake-ups, the loop's turn


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
        timeout_us=kw.get("timeout_us"),
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


async def _dark_past_the_retry_budget(fabric: ModelFabric, events: list[Event], sources: list[str]) -> None:
    """Darken the ports until each one's QP has run out of retries (RETRY_EXC after 8 periods, 33.6 ms of
    the model's time): waiting for the error, not a fixed 45 ms, holds on a loaded machine too, where the
    retry timers fire late."""
    fabric.darken(sources)
    await _until(
        lambda: all(
            "IBV_WC_RETRY_EXC_ERR" in {e.value for e in _of(events, Kind.RDMA_WC_ERROR, s)} for s in sources
        ),
        within_s=10.0,
    )


async def test_the_ping_pong_completes_both_ways() -> None:
    settings = _settings()
    fabric = _fabric(settings)
    # Nothing is lost on this fabric: a ping unanswered for 250 ms is this machine stalling the poller, not
    # the link (the default, two intervals, is 1 ms, which two busy processes beside the test exceeded).
    probe = _pair(settings, fabric, timeout_us=250_000)
    async with _running([probe]) as events:
        _circuit(probe)
        await _until(lambda: probe.completions >= 40)
    for source in (A.source, B.source):
        ok = _of(events, Kind.TRAFFIC_OK, source)
        assert ok and all(
            e.meta["transport"] == "rc" and isinstance(e.value, int) and e.value > 0 for e in ok
        )
        states = _of(events, Kind.RDMA_QP_STATE, source)
        assert [e.value for e in states] == ["IBV_QPS_RTS"]
    assert not [e for e in events if e.kind in (Kind.RDMA_WC_ERROR, Kind.TRAFFIC_LOST)]
    assert probe.pongs_sent >= 40 and len(probe.round_trips) == probe.completions
    assert min(probe.round_trips) >= 2 * fabric.latency_ns  # a PING there and its PONG back
    stats = probe.stats()
    assert stats["errors"] == 0 and stats["qp_timeout"] == TIMEOUT and stats["reconnects"] == 0


async def test_a_dark_gap_inside_the_retry_budget_recovers_within_one_retransmission_period() -> None:
    settings = _settings()
    fabric = _fabric(settings)
    probe = _pair(settings, fabric)
    async with _running([probe]) as events:
        _circuit(probe)
        await _until(lambda: probe.completions >= 10)
        fabric.darken([A.source])
        t_dark = now_ns()
        await asyncio.sleep(0.012)  # ~3 periods: the PING in flight retries 3 times in the dark
        # stamped before the light comes back: the model's retries run on their own thread, and the stalled
        # PING's retry can get through between light() and a stamp taken after it (seen on a loaded machine)
        t_light = now_ns()
        fabric.light([A.source])
        done = probe.completions
        await _until(lambda: probe.completions >= done + 10)
    for source in (A.source, B.source):
        lost = [e for e in _of(events, Kind.TRAFFIC_LOST, source) if e.t_ns >= t_dark - PERIOD_NS]
        assert lost, "the stalled PING is reported lost"
        back = next(e for e in _of(events, Kind.TRAFFIC_OK, source) if e.t_ns > t_light)
        # The PING outstanding at the cut is retried once per period from its post: the first retry after
        # the light is back gets through, so traffic resumes within one period of the light.
        assert back.t_ns - t_light <= PERIOD_NS + SLACK_NS, (back.t_ns - t_light) / 1e6
        assert back.meta["prev_ns"] < back.meta["sent_ns"] < t_light
    assert not [e for e in events if e.kind in (Kind.RDMA_WC_ERROR, Kind.RDMA_RECONNECT)]
    assert fabric.dropped > 0


async def test_a_gap_past_the_retry_budget_errors_and_reconnects_with_fresh_psns() -> None:
    settings = _settings("reconnect")
    fabric = _fabric(settings)
    probe = _pair(settings, fabric)
    async with _running([probe]) as events:
        _circuit(probe)
        await _until(lambda: probe.completions >= 10)
        qpns = {end.local: end.qpn for end in probe.ends.values()}
        psns = {end.local: end.psn for end in probe.ends.values()}
        await _dark_past_the_retry_budget(fabric, events, [A.source, B.source])  # the reconnected QPs ride on
        fabric.light([A.source, B.source])
        t_light = now_ns()
        await _until(lambda: any(e.kind == Kind.TRAFFIC_OK and e.t_ns > t_light for e in events))
        done = probe.completions
        await _until(lambda: probe.completions >= done + 10)
    errors = [e for e in events if e.kind == Kind.RDMA_WC_ERROR]
    assert "IBV_WC_RETRY_EXC_ERR" in {e.value for e in errors}
    states = [e.value for e in events if e.kind == Kind.RDMA_QP_STATE]
    assert "IBV_QPS_ERR" in states and states[-1] == "IBV_QPS_RTS"
    reconnects = [e for e in events if e.kind == Kind.RDMA_RECONNECT]
    assert reconnects and all(isinstance(e.value, int) and e.value >= 0 for e in reconnects)
    assert probe.reconnects == len(reconnects) and probe.stats()["errors"] >= 1
    # A reset keeps the QP number (as verbs does) and starts from a fresh PSN.
    assert {end.local: end.qpn for end in probe.ends.values()} == qpns
    assert all(end.psn != psns[end.local] for end in probe.ends.values()), "a reset reused its PSN"
    assert any(e.kind == Kind.TRAFFIC_OK and e.t_ns > t_light for e in events)


async def test_under_survive_a_qp_past_its_retry_budget_stays_down() -> None:
    settings = _settings("survive")
    fabric = _fabric(settings)
    probe = _pair(settings, fabric)
    async with _running([probe]) as events:
        _circuit(probe)
        await _until(lambda: probe.completions >= 10)
        await _dark_past_the_retry_budget(fabric, events, [A.source])
        fabric.light([A.source])
        t_light = now_ns()
        await asyncio.sleep(0.05)
        done = probe.completions
        await asyncio.sleep(0.05)
        assert probe.completions == done
    assert "IBV_WC_RETRY_EXC_ERR" in {e.value for e in events if e.kind == Kind.RDMA_WC_ERROR}
    assert not [e for e in events if e.kind == Kind.RDMA_RECONNECT]
    assert not [e for e in events if e.kind == Kind.TRAFFIC_OK and e.t_ns > t_light]


async def test_a_window_quiesces_the_moved_ports_and_the_next_circuit_resumes_them() -> None:
    settings = _settings()
    fabric = _fabric(settings)
    probe = _pair(settings, fabric)
    async with _running([probe]) as events:
        _circuit(probe)
        await _until(lambda: probe.completions >= 10)
        probe.open_window([A.source, B.source])
        await asyncio.sleep(0.01)
        posts = probe.posts
        fabric.darken([A.source, B.source])
        await asyncio.sleep(0.08)  # far past the retry budget: idle QPs have no timer
        assert probe.posts == posts
        fabric.light([A.source, B.source])
        _circuit(probe)
        done = probe.completions
        await _until(lambda: probe.completions >= done + 10)
    assert not [e for e in events if e.kind == Kind.RDMA_WC_ERROR]


async def test_two_hosts_exchange_their_qps_over_tcp_and_reconnect_through_it() -> None:
    """Each host's probe holds its own port; the QP exchange goes over TCP between the ports' addresses,
    and both ends asking at once after a shared error settles on one reconnect."""
    settings = _settings("reconnect")
    fabric = _fabric(settings)
    port = _free_port()
    bind = _can_bind_device()
    probes = [
        VerbsRcProbe(
            [ep],
            qps=fabric,
            exchange=PortExchange([ep], [A, B], port=port, bind_device=bind),
            interval_us=500,
            settings=settings,
            report_interval_ns=20_000_000,
        )
        for ep in (A, B)
    ]
    async with _running(probes) as events:
        for probe in probes:
            _circuit(probe)
        await _until(lambda: all(p.completions >= 10 for p in probes))
        await _dark_past_the_retry_budget(fabric, events, [A.source, B.source])
        fabric.light([A.source, B.source])
        t_light = now_ns()
        await _until(
            lambda: all(
                _of(events, Kind.TRAFFIC_OK, s) and _of(events, Kind.TRAFFIC_OK, s)[-1].t_ns > t_light
                for s in (A.source, B.source)
            )
        )
    for source in (A.source, B.source):
        assert "IBV_WC_RETRY_EXC_ERR" in {e.value for e in _of(events, Kind.RDMA_WC_ERROR, source)}
        assert _of(events, Kind.RDMA_RECONNECT, source)
    assert [p.stats()["exchange_failures"] for p in probes] == [0, 0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _can_bind_device() -> bool:
    with socket.socket() as s:
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo")
        except PermissionError:
            return False
    return True


_: type[QpExchange] = LocalExchange  # the in-process exchange keeps the Protocol


async def test_a_poller_thread_that_dies_fails_the_probe_naming_it() -> None:
    """The poller thread raising outside its per-QP guard (a bug, a device call gone wrong) ends the probe's
    stream with the cause, which the controller turns into the run's failure (probe.failure()); the run
    does not wait on a probe whose thread is gone."""
    settings = _settings()
    probe = _pair(settings, _fabric(settings))
    rounds = 0

    def dying_poll() -> None:
        nonlocal rounds
        rounds += 1
        raise RuntimeError("device gone")

    probe._poll_loop = dying_poll  # type: ignore[method-assign]
    threads_before = set(threading.enumerate())
    await probe.__aenter__()
    try:
        probe.set_circuits({A.source: B.source, B.source: A.source})
        events = [e async for e in probe.events()]  # ends when the probe dies
        failure = probe.failure()
        assert failure is not None and "poller thread died: RuntimeError: device gone" in str(failure)
        assert rounds == 1 and isinstance(events, list)
    finally:
        with pytest.raises(HardwareError, match="poller thread died"):  # its exit re-raises the failure
            await probe.__aexit__(None, None, None)
    assert set(threading.enumerate()) <= threads_before
