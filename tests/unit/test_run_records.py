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


def test_an_atomic_write_syncs_the_file_then_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The syscalls, traced: fsync of the temporary file before the rename, fsync of the directory after
    it (a power cut between them could bring back the old file); a directory fsync that fails is heard."""
    import os
    import stat

    from labctl.core.fileio import write_json_atomic

    real_fsync, real_replace = os.fsync, os.replace
    calls: list[tuple[str, object]] = []

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        calls.append(("fsync-dir" if stat.S_ISDIR(st.st_mode) else "fsync-file", st.st_ino))
        real_fsync(fd)

    def replace(src: object, dst: object) -> None:
        calls.append(("rename", None))
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_json_atomic(tmp_path / "run.json", {"status": "completed"})
    assert [c[0] for c in calls] == ["fsync-file", "rename", "fsync-dir"]
    assert calls[2][1] == tmp_path.stat().st_ino

    def failing_dir_fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_dir_fsync)
    with pytest.raises(OSError, match="Input/output error"):
        write_json_atomic(tmp_path / "run.json", {"status": "failed"})
