"""A run's port signals as a Value Change Dump (IEEE 1364 VCD), the waveform format ARTIQ writes and
GTKWave or Surfer open (issue 27).

One scope per host, one per NIC port in it, four 1-bit wires per port: `light` (Rx power at or above the
run's threshold; 0 below it, and 0 where the receiver reads no light at all: an `rx_power` sample of None,
below the module's floor, is dark, the sample that matters most), `firmware` (the NIC's link), `carrier`
(Linux carrier) and `traffic` (the last ping went through). Each changes at the stamp of the event that
observed it, in ns from the run's start (the timescale is 1 ns, so no stamp is rounded); a wire is `x` until
its first observation. Events are taken in time order (an agent's may reach the log after a later one from
elsewhere). There is no real-valued Rx power signal: the Perfetto trace has the dBm
(labctl.analysis.perfetto).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from labctl.analysis.breakdown import DEFAULT_THRESHOLD_DBM

SIGNALS = ("light", "firmware", "carrier", "traffic")


def _identifier(n: int) -> str:
    """The n-th VCD identifier code: printable ASCII 33..126, as many characters as it takes."""
    chars = []
    while True:
        n, digit = divmod(n, 94)
        chars.append(chr(33 + digit))
        if n == 0:
            return "".join(chars)
        n -= 1


def _name(text: str) -> str:
    """A scope or wire name without whitespace (VCD separates by it) or the hierarchy separator."""
    return re.sub(r"[\s/.:]+", "_", text) or "_"


def _level(kind: str, value: Any, threshold_dbm: float) -> tuple[str, str] | None:
    """(signal, '0' or '1') of an event, None for one that says nothing about a port's signals."""
    if kind == "rx_power":
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "light", "0"  # no light: below the module's floor (NaN: a None a frame made a float)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return "light", "1" if value >= threshold_dbm else "0"
        return None
    if kind == "link.firmware" and value in (0, 1, True, False):
        return "firmware", str(int(value))
    if kind == "carrier" and value in (0, 1, True, False):
        return "carrier", str(int(value))
    if kind == "traffic.ok":
        return "traffic", "1"
    if kind == "traffic.lost":
        return "traffic", "0"
    return None


def vcd_lines(events: pd.DataFrame, origin_ns: int, threshold_dbm: float, run_id: str) -> Iterator[str]:
    """The VCD file, line by line."""
    changes: list[tuple[int, str, str, str]] = []  # (ns from the start, source, signal, level)
    ports: dict[str, tuple[str, str]] = {}  # source → (host, port)
    frame = events.sort_values("t_ns", kind="stable")
    for kind, source, host, value, t in zip(
        frame["kind"], frame["source"], frame["host"], frame["value"], frame["t_ns"], strict=True
    ):
        source = str(source)
        if not source.startswith("nic:"):
            continue
        observed = _level(str(kind), value, threshold_dbm)
        if observed is None:
            continue
        ports.setdefault(source, (str(host or source[4:].split("/")[0]), source.rsplit("/", 1)[-1]))
        changes.append((int(t) - origin_ns, source, observed[0], observed[1]))
    ids: dict[tuple[str, str], str] = {}
    yield "$date labctl run " + run_id + " $end"
    yield "$version labctl export --format vcd $end"
    yield "$timescale 1 ns $end"
    by_host: dict[str, list[str]] = {}
    for source, (host, _port) in sorted(ports.items()):
        by_host.setdefault(host, []).append(source)
    for host, sources in by_host.items():
        yield f"$scope module {_name(host)} $end"
        for source in sources:
            yield f"$scope module {_name(ports[source][1])} $end"
            for signal in SIGNALS:
                ids[(source, signal)] = code = _identifier(len(ids))
                yield f"$var wire 1 {code} {signal} $end"
            yield "$upscope $end"
        yield "$upscope $end"
    yield "$enddefinitions $end"
    yield "#0"
    yield "$dumpvars"
    for code in ids.values():
        yield f"x{code}"
    yield "$end"
    last_t: int | None = None
    current: dict[str, str] = {}
    for t, source, signal, level in changes:
        code = ids[(source, signal)]
        if current.get(code) == level:
            continue  # a heartbeat: nothing changed
        t = max(t, 0)
        if t != last_t:
            yield f"#{t}"
            last_t = t
        current[code] = level
        yield f"{level}{code}"


def write_vcd(run_dir: Path, out: Path) -> int:
    """Write the run's port signals to `out`; returns how many value changes it holds."""
    from labctl.analysis.store import load_run

    run = load_run(run_dir)
    origin = int(run.meta.get("timebase", {}).get("mono0_ns") or run.events["t_ns"].min())
    start = run.events[run.events["kind"] == "run.start"]
    meta = start["meta"].iloc[0] if len(start) else {}
    threshold = (
        float(meta.get("rx_power_threshold_dbm", DEFAULT_THRESHOLD_DBM))
        if isinstance(meta, dict)
        else DEFAULT_THRESHOLD_DBM
    )
    changes = 0
    with open(out, "w", encoding="ascii") as f:
        for line in vcd_lines(run.events, origin, threshold, str(run.meta.get("run_id", ""))):
            f.write(line + "\n")
            changes += line[:1] in "01"
    return changes
