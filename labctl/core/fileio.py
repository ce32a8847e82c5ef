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
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path: Path, data: Any) -> None:
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=False, default=str)
        f.write("\n")
