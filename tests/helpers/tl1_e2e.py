"""Shared by tests/integration/test_tl1_e2e.py and tests/unit/test_tl1_e2e.py."""

from __future__ import annotations

from pathlib import Path

TL1_INVENTORY = Path(__file__).resolve().parents[2] / "experiments" / "inventories" / "tl1-emulated.yaml"
