"""The verbs-rc probe against the behaviour model of verbs RC queue pairs (labctl.rdma.model): the ping-pong
completes; the real pyverbs module without a device is one line from the probe's open. Dark gaps and
reconnects, on the real clock, are tests/integration/test_rdma_verbs_rc.py."""

from __future__ import annotations

import pytest

from labctl.events import Kind
from labctl.inventory import RdmaPortSpec
from labctl.probes.verbs_rc import VerbsRcProbe
from labctl.rdma import compat
from labctl.rdma.exchange import LocalExchange
from labctl.rdma.oob import Answer
from labctl.rdma.rc import QpAttrs
from labctl.rdma.verbs import VerbsQpFactory
from tests.helpers.rdma_verbs_rc import (
    TIMEOUT,
    A,
    B,
    _circuit,
    _fabric,
    _of,
    _pair,
    _running,
    _settings,
    _until,
)


async def test_the_ping_pong_completes_both_ways() -> None:
    settings = _settings()
    fabric = _fabric(settings)
    probe = _pair(settings, fabric)
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


async def test_the_real_pyverbs_module_without_a_device_is_one_line_from_the_probes_open() -> None:
    try:
        verbs = compat.load()
    except compat.PyverbsMissing as e:
        pytest.skip(f"pyverbs: {e} (CI installs python3-pyverbs)")
    if compat.SYSFS_INFINIBAND.is_dir() and any(compat.SYSFS_INFINIBAND.iterdir()):
        pytest.skip("this host has an RDMA device")
    qps = VerbsQpFactory({A.source: RdmaPortSpec(device="mlx5_0")}, QpAttrs(), verbs)
    exchange = _Counting([A.source])
    probe = VerbsRcProbe([A], qps=qps, exchange=exchange)
    with pytest.raises(compat.RdmaUnavailable) as info:
        await probe.__aenter__()
    message = str(info.value)
    assert "\n" not in message and "no RDMA device" in message
    assert exchange.opened == 0  # nothing was started
    await probe.__aexit__(None, None, None)


class _Counting(LocalExchange):
    def __init__(self, sources: list[str]) -> None:
        super().__init__(sources)
        self.opened = 0

    async def open(self, answer: Answer) -> None:
        self.opened += 1
        await super().open(answer)
