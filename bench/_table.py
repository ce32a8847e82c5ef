"""The bench scripts' headline figures as rows, for `bench/all.py`'s one table.

Each script calls `record(...)` where it prints a headline figure. When the environment variable
`LABCTL_BENCH_TABLE` names a file, each call appends one JSON line to it:

    {"bench": "tl1", "figure": "...", "value": 0.41, "unit": "ms", "peer": "...", "peer_value": 0.12,
     "ratio": 3.42, "goal": "<= 1 ms"}

`ratio` is value / peer_value when both are given (and finite, peer_value non-zero), else null; values
that are not finite (NaN, inf) are written as null. Without the variable, `record` does nothing, so a
script run by hand prints what it always printed and writes nothing. Standard library only.
"""

from __future__ import annotations

import json
import math
import os

ENV = "LABCTL_BENCH_TABLE"


def _finite(x: float | None) -> float | None:
    if x is None or (isinstance(x, int) and not isinstance(x, bool)):  # a count stays a count
        return x
    x = float(x)
    return x if math.isfinite(x) else None


def record(
    bench: str,
    figure: str,
    value: float,
    unit: str,
    *,
    peer: str | None = None,
    peer_value: float | None = None,
    goal: str | None = None,
) -> None:
    """Append one row to the file `LABCTL_BENCH_TABLE` names; nothing when it is unset or empty."""
    path = os.environ.get(ENV)
    if not path:
        return
    v, pv = _finite(value), _finite(peer_value)
    row = {
        "bench": bench,
        "figure": figure,
        "value": v,
        "unit": unit,
        "peer": peer,
        "peer_value": pv,
        "ratio": v / pv if v is not None and pv else None,
        "goal": goal,
    }
    with open(path, "a", encoding="utf-8") as f:  # one write per row: whole lines even if appended to twice
        f.write(json.dumps(row, ensure_ascii=False) + "\n")
