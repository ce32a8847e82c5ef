"""The README's example table is what the command it shows prints (issue 26): the same phases in the same
order, each over the same unit and count. The values are a run's own (they differ run to run and by
profile: the README's is the opus-testbed profile's, this test runs the fast one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _rows(text: str) -> list[tuple[str, str, str]]:
    """(phase, unit, n) of each row of a breakdown table, as printed."""
    rows = []
    for line in text.splitlines():
        if line.startswith("│"):
            cells = [c.strip() for c in line.strip("│").split("│")]
            rows.append((cells[0], cells[1], cells[2]))
    return rows


def test_the_readme_table_is_what_labctl_run_prints(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    start = readme.index("┃ phase")
    shown = _rows(readme[start : readme.index("```", start)])
    assert shown, "the README's example table is gone"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "labctl.cli",
            "run",
            "experiments/reconfig-timeline.yaml",
            "--profile",
            "fast",
            "--seed",
            "1",
            "--no-plots",
            "--out",
            str(tmp_path / "runs"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "160"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert _rows(done.stdout) == shown
    resolution = next(line for line in readme.splitlines() if line.startswith("mark resolution"))
    printed = next(line for line in done.stdout.splitlines() if line.startswith("mark resolution"))
    assert resolution.split(":")[0] == printed.split(":")[0]
