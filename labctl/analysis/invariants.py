"""Invariants every run's events must satisfy, whatever the lab: checked over a finished run's events.jsonl.

Causality (decision 0044): a port passes no traffic while its link is down. A `traffic.ok` is a ping (or
RC SEND) that went from a NIC port to its circuit's peer and was answered, so at some moment while it
travelled both ends were up: every link signal observed on either port (`carrier`, `link.firmware`) could
have been up at that moment. A `traffic.ok` for which no such moment exists is a violation: a model that
passes traffic on a dead link, or a probe that stamps or attributes an answer wrongly.

The check is exact where the measurement is, and allows only for what the measurement cannot tell:

- **Travel time.** A `traffic.ok` stamped on the answer's receipt names the send time (`meta.sent_ns`):
  the path had to be up at some moment between the two, not at the receipt itself (a pong that was in
  flight or in a socket buffer when the link dropped is still an answer). Without `meta.sent_ns` (the
  model's probe reads the model at the instant it stamps) the travel is that instant.
- **Sampled up-marks.** An up observation with a bracket (`meta.prev_ns`, or `meta.after_ns` of a polled
  carrier or link state) happened after the bracket's start (decision 0026: the sample before did not see
  it), so the signal may have been up since then.
- **Receipt-stamped up-marks.** A netlink message (`meta.via`, no bracket) is stamped when it is read, and
  rtnetlink carries no kernel time: the carrier may have risen at any moment since the previous
  observation of that signal (which showed it down). Where the lab stamps the firmware link before it
  changes it (the kernel lab's `link.firmware`), that signal bounds the port from below exactly.
- **Down-marks** are never earlier than the change (a receipt or a poll comes after it; linkwatch even
  defers carrier-down by up to 1 s), so a signal may have been up until its down observation.
- **Before a signal's first observation** nothing is known: it may have been up.
- **While its observer's events went missing** (`agent.gap`: a broker outage lost a host's batches, from
  `meta.after_ns`, the latest stamp before them, to `meta.before_ns`, the earliest after) the signal may
  have been up, until its next observation.
- **After its observer was lost** (`agent.lost`: the agent of the port's host went away mid-run) nothing is
  known either from the signal's last observation on: the lab went on without anyone watching (an agent
  whose mirror runs behind the model, decision 0046, is lost before it reported what its model did last).

Everything else is exact: the model stamps transitions at their model times, and a ping of the model
probe at the instant it read the model.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from labctl.core.events import Event, Kind

LINK_KINDS = (Kind.CARRIER, Kind.LINK_FIRMWARE)
_CHECKED = (Kind.CARRIER, Kind.LINK_FIRMWARE, Kind.TRAFFIC_OK, Kind.AGENT_LOST, Kind.AGENT_GAP)
# The byte patterns of those kinds in an events.jsonl line: the other lines (most of a 1M-line run: Rx
# power samples) are not decoded at all.
_MARKERS = tuple(f'"kind":"{kind}"'.encode() for kind in _CHECKED)
_NEG = np.iinfo(np.int64).min
_POS = np.iinfo(np.int64).max


@dataclass(frozen=True, slots=True)
class Violation:
    """A `traffic.ok` that travelled (from `sent_ns` to `t_ns`) while its port or its peer was down."""

    source: str
    peer: str | None
    t_ns: int
    sent_ns: int
    reconfig: int | None
    down: str
    """Which end was down for the whole travel (both names: each was up at times, never both at once)."""
    down_since_ns: int | None
    """The end's last possible up moment before the travel (None: never up before it)."""
    up_after_ns: int | None
    """Its first possible up moment after the travel (None: never up again in the run)."""

    def line(self) -> str:
        travel = (
            f"sent {(self.t_ns - self.sent_ns) / 1e3:.1f} us before"
            if self.sent_ns != self.t_ns
            else "read at once"
        )
        since = (
            f"{(self.t_ns - self.down_since_ns) / 1e6:.3f} ms before"
            if self.down_since_ns is not None
            else "the start"
        )
        until = (
            f"{(self.up_after_ns - self.t_ns) / 1e6:.3f} ms after"
            if self.up_after_ns is not None
            else "the end"
        )
        return (
            f"reconfig {self.reconfig}: traffic.ok {self.source} -> {self.peer or '?'} at t_ns={self.t_ns} "
            f"({travel}) while {self.down} was down, from {since} until {until}"
        )


class _Meta(msgspec.Struct, frozen=True):
    peer: str | None = None
    prev_ns: int | None = None
    after_ns: int | None = None
    sent_ns: int | None = None
    via: str | None = None
    before_ns: int | None = None


class _Row(msgspec.Struct):
    """The fields the check needs (decoding skips the rest)."""

    t_ns: int
    source: str
    kind: str
    value: int | float | str | None = None
    reconfig: int | None = None
    meta: _Meta = _Meta()
    host: str | None = None


_decoder = msgspec.json.Decoder(_Row)


def _rows_of(path: Path) -> Iterator[_Row]:
    """A run's link and traffic.ok rows, streamed (a torn last line is skipped, as `read_events` does)."""
    with open(path, "rb") as f:
        pending: bytes | None = None
        for line in f:
            if pending is not None:
                yield _decoder.decode(pending)
                pending = None
            if any(m in line for m in _MARKERS):
                if line.endswith(b"\n"):
                    yield _decoder.decode(line)
                else:
                    pending = line
        if pending is not None:  # the last line: decoded if whole, skipped if the write was cut short
            try:
                yield _decoder.decode(pending)
            except msgspec.DecodeError:
                return


def _rows_from_events(events: Iterable[Event]) -> Iterator[_Row]:
    for e in events:
        if e.kind in _CHECKED:
            m = e.meta
            yield _Row(
                e.t_ns,
                e.source,
                e.kind,
                e.value,
                e.reconfig,
                _Meta(
                    m.get("peer"),
                    m.get("prev_ns"),
                    m.get("after_ns"),
                    m.get("sent_ns"),
                    m.get("via"),
                    m.get("before_ns"),
                ),
                e.host,
            )


def _up_intervals(
    obs: list[_Row], unwatched: bool = False, gaps: Iterable[tuple[int, int]] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """When one signal of one port may have been up, as sorted disjoint closed intervals (starts, ends),
    from its observations in time order (the allowances are the module's). `unwatched`: its observer was
    lost during the run, so after the last observation it may have been up; `gaps`: spans whose
    observations went missing, during which (and until the next observation) it may have been up."""
    starts: list[int] = []
    ends: list[int] = []
    up_since: int | None = _NEG  # unknown before the first observation: may have been up
    previous: int | None = None  # the time of the previous observation
    for row in obs:
        t = row.t_ns
        if row.value == 1 or row.value == 1.0:
            if up_since is None:
                bracket = row.meta.prev_ns if row.meta.prev_ns is not None else row.meta.after_ns
                if bracket is not None:
                    up_since = min(bracket, t)
                elif row.meta.via is not None:  # stamped on receipt, no kernel time
                    up_since = previous if previous is not None else _NEG
                else:  # stamped at the change (the model) or before it (the kernel lab's firmware link)
                    up_since = t
        elif up_since is not None:  # down (any other value): it may have been up until observed down
            starts.append(up_since)
            ends.append(t)
            up_since = None
        previous = t
    if up_since is None and unwatched and previous is not None:
        up_since = previous
    if up_since is not None:
        starts.append(up_since)
        ends.append(_POS)
    times = [row.t_ns for row in obs]
    for a, b in gaps:  # up to the first observation at or after the gap's end (its last, then, is known)
        k = bisect.bisect_left(times, b)
        starts.append(a)
        ends.append(times[k] if k < len(times) else _POS)
    return _merged(starts, ends)


def _merged(starts: list[int], ends: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Closed intervals, sorted and merged where they meet."""
    out_s: list[int] = []
    out_e: list[int] = []
    for s, e in sorted(zip(starts, ends, strict=True)):
        if out_e and s <= out_e[-1]:
            out_e[-1] = max(out_e[-1], e)
        else:
            out_s.append(s)
            out_e.append(e)
    return np.array(out_s, np.int64), np.array(out_e, np.int64)


def _intersect(
    a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """The intersection of two sorted lists of disjoint closed intervals."""
    (sa, ea), (sb, eb) = a, b
    starts: list[int] = []
    ends: list[int] = []
    i = j = 0
    while i < sa.size and j < sb.size:
        lo, hi = max(int(sa[i]), int(sb[j])), min(int(ea[i]), int(eb[j]))
        if lo <= hi:
            starts.append(lo)
            ends.append(hi)
        if ea[i] < eb[j]:
            i += 1
        else:
            j += 1
    return np.array(starts, np.int64), np.array(ends, np.int64)


_ALWAYS = (np.array([_NEG], np.int64), np.array([_POS], np.int64))


def _overlaps(intervals: tuple[np.ndarray, np.ndarray], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per [lo, hi]: whether it meets one of the intervals (sorted, disjoint, closed)."""
    starts, stops = intervals
    k = np.searchsorted(stops, lo, side="left")  # the first interval not over before lo...
    ok = k < starts.size
    ok[ok] = starts[k[ok]] <= hi[ok]  # ...must begin by hi
    return ok


def _gap(intervals: tuple[np.ndarray, np.ndarray], lo: int, hi: int) -> tuple[int | None, int | None]:
    """The last up moment before [lo, hi] and the first after it (None: none)."""
    starts, stops = intervals
    k = int(np.searchsorted(stops, lo, side="left"))
    before = int(stops[k - 1]) if k > 0 else None
    after = int(starts[k]) if k < starts.size else None
    return before, after


def check_rows(rows: Iterable[_Row]) -> list[Violation]:
    """The causality violations among a run's link and traffic.ok rows, in any order."""
    signals: dict[tuple[str, str], list[_Row]] = defaultdict(list)
    # per (source, peer): send times, receipt times, reconfigurations
    traffic: dict[tuple[str, str | None], tuple[list[int], list[int], list[int | None]]] = {}
    lost_hosts: set[str] = set()
    gaps: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for row in rows:
        if row.kind == Kind.AGENT_LOST:
            if row.host is not None:
                lost_hosts.add(row.host)
            continue
        if row.kind == Kind.AGENT_GAP:
            if row.host is not None:
                after = row.meta.after_ns if row.meta.after_ns is not None else _NEG
                before = row.meta.before_ns if row.meta.before_ns is not None else _POS
                gaps[row.host].append((after, before))
            continue
        if row.kind == Kind.TRAFFIC_OK:
            sends, gots, recs = traffic.setdefault((row.source, row.meta.peer), ([], [], []))
            gots.append(row.t_ns)
            sends.append(row.meta.sent_ns if row.meta.sent_ns is not None else row.t_ns)
            recs.append(row.reconfig)
        else:
            signals[(row.source, row.kind)].append(row)
    up: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for (source, _kind), obs in signals.items():
        obs.sort(key=lambda r: r.t_ns)
        host = obs[0].host
        intervals = _up_intervals(obs, host in lost_hosts, gaps.get(host, ()) if host else ())
        up[source] = _intersect(up[source], intervals) if source in up else intervals
    violations: list[Violation] = []
    for (source, peer), (sent_l, got_l, reconfigs) in traffic.items():
        sent, got = np.array(sent_l, np.int64), np.array(got_l, np.int64)
        lo, hi = np.minimum(sent, got), np.maximum(sent, got)
        mine = up.get(source, _ALWAYS)
        theirs = up.get(peer, _ALWAYS) if peer is not None else _ALWAYS
        both = _intersect(mine, theirs)
        for i in np.flatnonzero(~_overlaps(both, lo, hi)).tolist():
            a, b = int(lo[i]), int(hi[i])
            if not _overlaps(mine, lo[i : i + 1], hi[i : i + 1])[0]:
                down, gap = source, _gap(mine, a, b)
            elif not _overlaps(theirs, lo[i : i + 1], hi[i : i + 1])[0]:
                down, gap = str(peer), _gap(theirs, a, b)
            else:
                down, gap = f"{source} or {peer} (never both up)", _gap(both, a, b)
            violations.append(Violation(source, peer, int(got[i]), int(sent[i]), reconfigs[i], down, *gap))
    violations.sort(key=lambda v: (v.t_ns, v.source))
    return violations


def check_events(events: Iterable[Event]) -> list[Violation]:
    """Causality violations among events in memory."""
    return check_rows(_rows_from_events(events))


def check_file(path: Path) -> list[Violation]:
    """Causality violations of one events.jsonl, streamed: only link and traffic.ok lines are decoded."""
    return check_rows(_rows_of(path))


def check_run(run_dir: Path) -> list[Violation]:
    """Causality violations of a run directory's events.jsonl."""
    return check_file(Path(run_dir) / "events.jsonl")
