"""Writing files so that a reader, or a crash, never sees half of one."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary name to write `path` under; renamed over `path` only if the block finishes, so a reader
    (or a crash) never sees a half-written file. Writers that infer a format from the name must be told it:
    the temporary name ends in `.tmp`."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        # The rename lives in the directory: until the directory is on disk, a power cut can bring back the
        # old file (or none) although the new one's data was synced.
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def fsync_dir(directory: Path) -> None:
    """Make the directory's entries (a rename, a new file) durable. An error is the caller's to hear:
    the write may not survive a power cut."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Any) -> None:
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=False, default=str)
        f.write("\n")
