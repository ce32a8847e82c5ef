"""Run records written atomically: a failing writer leaves the old file. Damaged run directories are
tests/integration/test_run_records.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.core.fileio import atomic_path


def test_atomic_path_keeps_the_old_file_when_the_writer_fails(tmp_path: Path) -> None:
    path = tmp_path / "breakdown.csv"
    path.write_text("old\n")

    def killed_mid_write() -> None:
        with atomic_path(path) as tmp:
            tmp.write_text("half a fi")
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        killed_mid_write()
    assert path.read_text() == "old\n" and list(tmp_path.iterdir()) == [path]
    with atomic_path(path) as tmp:
        tmp.write_text("new\n")
    assert path.read_text() == "new\n" and list(tmp_path.iterdir()) == [path]
