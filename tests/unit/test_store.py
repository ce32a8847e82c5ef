"""Reading run directories back: a damaged or foreign directory is one clear line, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.analysis.store import load_run
from labctl.core.errors import InputError
from tests.helpers.store import make_run


def test_a_good_run_loads(tmp_path: Path) -> None:
    run = load_run(make_run(tmp_path))
    assert run.meta["status"] == "completed" and len(run.events) == 1 and run.breakdown.empty


def test_a_folder_without_runs_says_so(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no run directory in it"):
        load_run(tmp_path)
