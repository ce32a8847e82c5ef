"""A QP description from the out-of-band exchange is checked before use. The exchange over a TCP side
channel is tests/integration/test_rdma_oob.py."""

from __future__ import annotations

import pytest

from labctl.rdma.oob import QpInfo


def test_a_qp_description_is_checked() -> None:
    with pytest.raises(ValueError, match="24-bit"):
        QpInfo(qpn=1 << 24, psn=0)
