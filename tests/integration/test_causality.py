"""Causality (decision 0044) over a whole simulated run: its events pass the invariant checker. The checker
on constructed events is tests/unit/test_causality.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.analysis.invariants import check_file


@pytest.mark.slow
async def test_a_simulated_run_is_causal(tmp_path: Path, inventory_path: Path, experiment_path: Path) -> None:
    """A run of the simulated lab (the fast profile, the issue's seed) has no traffic on a dead link. The
    bug showed in about half of such runs; the suite's own runs are all checked by tests/conftest.py."""
    from labctl.run.lifecycle import run_experiment

    outcome = await run_experiment(
        experiment_path, inventory_path, profile="fast", seed=2, out_dir=tmp_path, plots=False
    )
    assert outcome.status == "completed", outcome.error
    assert check_file(outcome.run_dir / "events.jsonl") == []
