"""Shared by tests/unit/test_rdma_simulated.py and tests/integration/test_rdma_simulated.py."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import REPO


def _experiment(tmp_path: Path, rdma: str) -> Path:
    text = (
        (REPO / "experiments" / "reconfig-timeline.yaml")
        .read_text()
        .replace("repeat: 2 ", "repeat: 1 ")
        .replace("hold_s: 0.5 ", "hold_s: 0.1 ")
        .replace("  transport: udp ", f"  rdma: {rdma}\n  transport: rdma ")
    )
    path = tmp_path / "rdma.yaml"
    path.write_text(text)
    return path
