"""The real pyverbs module without a device is one line from the verbs-rc probe's open. The probe against the
behaviour model of verbs RC queue pairs, on the real clock, is tests/integration/test_rdma_verbs_rc.py."""

from __future__ import annotations

import pytest

from labctl.inventory.schema import RdmaPortSpec
from labctl.probes.verbs_rc import VerbsRcProbe
from labctl.rdma import compat
from labctl.rdma.exchange import LocalExchange
from labctl.rdma.oob import Answer
from labctl.rdma.rc import QpAttrs
from labctl.rdma.verbs import VerbsQpFactory
from tests.helpers.rdma_verbs_rc import A


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
