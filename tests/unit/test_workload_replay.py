"""Bad replay experiments are one line. Replays on the simulated lab are
tests/integration/test_workload_replay.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.controller import run_experiment
from tests.helpers.workload_replay import REPO, _experiment


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("mode", "sometimes", "mode: Input should be 'provisioning' or 'on-demand'"),
        ("trace", "no-such-trace", "trace: no-such-trace: no such trace file"),
    ],
)
async def test_bad_replay_experiments_are_one_line(
    tmp_path: Path, field: str, value: str, message: str
) -> None:
    from labctl.errors import InputError

    with pytest.raises(InputError, match=message):
        await run_experiment(
            _experiment(tmp_path, **{field: value}),
            REPO / "inventory.yaml",
            profile="fast",
            out_dir=tmp_path / "runs",
            plots=False,
        )
    assert not (tmp_path / "runs").exists()
