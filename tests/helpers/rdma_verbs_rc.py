"""Shared by tests/integration/test_rdma_verbs_rc.py and tests/unit/test_rdma_verbs_rc.py."""

from __future__ import annotations

from labctl.probes.traffic import TrafficEndpoint

A = TrafficEndpoint("nic:h1/eth0", "127.0.0.1", "lo", None, "h1")
