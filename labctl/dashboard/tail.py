"""A run's events.jsonl read as it is written, and the live view its events fold into. Pure: no asyncio.

`Tail` only reads: the run's process writes the file and never learns that a page reads it, so a page can
never slow the run (the event log flushes whole lines; a partial last line is kept until its end arrives).

`LiveView` is what the live page shows, worked out event by event as they arrive: the reconfiguration in
progress (n of N), per moved port which marks it has reached (t0 `ocs.command`, t1 `ocs.complete`, t2 Rx
power back above the threshold, t3 firmware link up, t4 carrier up, t5 traffic with the new peer, as
labctl.analysis.breakdown defines them), the moved ports' latest Rx power, each finished port's total as a
row of the table filling in, loop lag, dropped samples and skipped ticks, each agent's clock as measured,
and the run's end. It is a progress display, not the measurement: the breakdown of record (brackets, clock
uncertainty, flags) is the analysis's, shown on the run's page once the run has ended.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

READ_CHUNK = 1 << 20
"""At most this much is read per call, so that one call never holds the event loop long."""
MARKS = ("t0", "t1", "t2", "t3", "t4", "t5")
LAG_WARN_NS = 20_000_000
"""Loop lag above this is a warning on the page (a mark can be that late)."""
MAX_WARNINGS = 20


class Tail:
    """The complete lines appended to a file since the last call (from its start on the first)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self._partial = b""

    def read(self, limit: int = READ_CHUNK) -> list[bytes]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read(limit)
        except FileNotFoundError:
            return []
        if not chunk:
            return []
        self.offset += len(chunk)
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        return [line for line in lines if line.strip()]


@dataclass
class PortMarks:
    source: str
    host: str
    port: str
    peer: str | None
    marks: dict[str, int] = field(default_factory=dict)
    """Mark name -> ns after t0 (t0 itself 0); a mark not reached is absent."""
    saw_dark: bool = False

    def public(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "host": self.host,
            "port": self.port,
            "peer": self.peer,
            "marks": self.marks,
        }


class LiveView:
    """Fold events (dicts as events.jsonl holds them) into what the live page shows."""

    def __init__(self, run_id: str, total: int | None = None, threshold_dbm: float = -10.0) -> None:
        self.run_id = run_id
        self.total = total
        self.threshold_dbm = threshold_dbm
        self.status = "waiting"  # until run.start; then running; then run.end's value
        self.error: str | None = None
        self.reconfig: int | None = None
        self.phase: str | None = None
        self.t0: int | None = None
        self.t1: int | None = None
        self.ports: dict[str, PortMarks] = {}
        self.rx_dbm: dict[str, float | None] = {}
        self.lag_ns: int | None = None
        self.lag_max_ns = 0
        self.dropped: dict[str, int] = {}
        self.skipped: dict[str, int] = {}
        """Per sampler, the ticks it skipped so far after stalls of its loop (`sampler.skip`)."""
        self.clocks: dict[str, dict[str, Any]] = {}
        """Per host, its agent's clock as last measured (`agent.clock`): offset, uncertainty, how."""
        self.warnings: list[str] = []
        self.rows: list[dict[str, Any]] = []
        self.events = 0
        self.last_seq = -1
        self.last_wall_ns: int | None = None
        self.ended = False

    # -- folding -------------------------------------------------------------------------------------------
    def fold_lines(self, lines: list[bytes]) -> int:
        """Fold raw lines; a line that is not a JSON object is skipped (a damaged log still shows). Returns
        how many new breakdown rows they finished."""
        before = len(self.rows)
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                self.fold(event)
        return len(self.rows) - before

    def fold(self, e: dict[str, Any]) -> None:
        self.events += 1
        seq = e.get("seq")
        if isinstance(seq, int):
            self.last_seq = max(self.last_seq, seq)
        wall = e.get("wall_ns")
        if isinstance(wall, int):
            self.last_wall_ns = wall if self.last_wall_ns is None else max(self.last_wall_ns, wall)
        kind, t, source, value = e.get("kind"), e.get("t_ns"), e.get("source", ""), e.get("value")
        meta: dict[str, Any] = e["meta"] if isinstance(e.get("meta"), dict) else {}
        if not isinstance(t, int):
            return
        if kind == "run.start":
            self.status = "running"
            threshold = meta.get("rx_power_threshold_dbm")
            if isinstance(threshold, int | float):
                self.threshold_dbm = float(threshold)
        elif kind == "run.end":
            self.status = str(value)
            self.error = meta.get("error")
            self.ended = True
        elif kind == "phase":
            self._phase(e, meta)
        elif kind == "ocs.command" and self.t0 is None and e.get("reconfig") == self.reconfig:
            self.t0 = t
            for p in self.ports.values():
                p.marks["t0"] = 0
        elif kind == "ocs.complete" and self.t0 is not None and self.t1 is None:
            self.t1 = t
            for p in self.ports.values():
                p.marks["t1"] = t - self.t0
        elif kind == "rx_power":
            self._rx(source, t, value)
        elif kind in ("link.firmware", "carrier") and value:
            self._mark(source, "t3" if kind == "link.firmware" else "t4", t)
        elif kind == "traffic.ok":
            port = self.ports.get(source)
            if port is not None and meta.get("peer") == port.peer and "t4" in port.marks:
                self._mark(source, "t5", t)
        elif kind == "loop.lag" and isinstance(value, int):
            self.lag_ns = value
            self.lag_max_ns = max(self.lag_max_ns, value)
            if value > LAG_WARN_NS:
                self._warn(
                    f"event loop {value / 1e6:.1f} ms late (reconfiguration {self.reconfig}): "
                    "marks can be that late"
                )
        elif kind == "agent.clock" and isinstance(value, int):
            host = str(e.get("host") or source.removeprefix("agent:"))
            self.clocks[host] = {
                "offset_ns": value,
                "uncertainty_ns": meta.get("uncertainty_ns"),
                "rtt_min_ns": meta.get("rtt_min_ns"),
                "via": meta.get("via"),
                "shared": bool(meta.get("shared_clock")),
            }
        elif kind == "sampler.drop" and isinstance(value, int):
            self.dropped[source] = value
            self._warn(f"{source}: {value} samples dropped so far")
        elif kind == "sampler.skip" and isinstance(value, int):
            self.skipped[source.removeprefix("probe:")] = value
            longest = meta.get("stall_longest_ns")
            self._warn(
                f"{source}: {value} ticks skipped so far after stalls of its loop"
                + (f" (longest {longest / 1e6:.1f} ms)" if isinstance(longest, int) and longest else "")
            )
        elif kind in ("run.abort", "run.fault", "run.timeout", "agent.lost", "agent.gap", "ocs.error"):
            self._warn(f"{kind}: {value}")

    def _phase(self, e: dict[str, Any], meta: dict[str, Any]) -> None:
        self.reconfig = e.get("reconfig")
        self.phase = str(e.get("value"))
        self.t0 = self.t1 = None
        self.ports = {}
        for p in meta.get("ports") or ():
            if isinstance(p, dict) and isinstance(p.get("source"), str):
                self.ports[p["source"]] = PortMarks(
                    p["source"], str(p.get("host", "")), str(p.get("port", "")), p.get("peer")
                )

    def _rx(self, source: str, t: int, value: Any) -> None:
        port = self.ports.get(source)
        if port is None:
            return
        dbm = float(value) if isinstance(value, int | float) else None
        self.rx_dbm[source] = dbm
        if self.t0 is None or t < self.t0:
            return
        if dbm is None or dbm < self.threshold_dbm:
            port.saw_dark = True
        elif (port.saw_dark or self.t1 is not None) and "t2" not in port.marks:
            port.marks["t2"] = t - self.t0

    def _mark(self, source: str, mark: str, t: int) -> None:
        port = self.ports.get(source)
        if port is None or self.t0 is None or t < self.t0 or mark in port.marks:
            return
        port.marks[mark] = t - self.t0
        if mark == "t5":
            self.rows.append(
                {
                    "reconfig": self.reconfig,
                    "phase": self.phase,
                    "port": port.source,
                    "marks": dict(port.marks),
                }
            )

    def _warn(self, text: str) -> None:
        self.warnings.append(text)
        del self.warnings[:-MAX_WARNINGS]

    # -- what the page gets ---------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Everything but the rows (those go once each): small, sent after every batch of events."""
        return {
            "run_id": self.run_id,
            "status": self.status,
            "error": self.error,
            "reconfig": self.reconfig,
            "total": self.total,
            "phase": self.phase,
            "ports": [p.public() for p in self.ports.values()],
            "rx_dbm": {s: self.rx_dbm.get(s) for s in self.ports},
            "lag_ns": self.lag_ns,
            "lag_max_ns": self.lag_max_ns,
            "warnings": self.warnings,
            "skipped": self.skipped,
            "clocks": self.clocks,
            "events": self.events,
            "seq": self.last_seq,
            "wall_ns": self.last_wall_ns,
            "rows": len(self.rows),
        }


def planned_reconfigurations(experiment: dict[str, Any]) -> int | None:
    """N of "reconfiguration n of N" for a timeline experiment (its baseline, then cycle x repeat); None
    for a kind whose count the run decides (a replay, a tune)."""
    cycle, repeat = experiment.get("cycle"), experiment.get("repeat")
    if isinstance(cycle, list) and isinstance(repeat, int) and experiment.get("baseline") is not None:
        return 1 + len(cycle) * repeat
    return None
