"""Shared by tests/unit/test_sampling.py and tests/integration/test_sampling.py."""

from __future__ import annotations

from labctl.probes import sampling


async def _drain(probe: sampling.QueueProbe) -> list[object]:
    return [e async for e in probe.events()]
