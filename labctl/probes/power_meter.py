"""Optical power from bench power meters (Keysight N77xx over SCPI): a second Rx-power source.

Each meter of the inventory's `power_meters:` is reached with pyvisa (the pyvisa-py `@py` backend, a
`TCPIP0::<address>::<port>::SOCKET` resource, newline termination) from one worker thread of its own, so
no VISA call ever blocks the event loop. At start the thread configures every mapped slot: `*IDN?`
(an N77xx, or the probe refuses), `*CLS`, wavelength (`SENS<n>:POW:WAV <nm>NM`), dBm (`SENS<n>:POW:UNIT 0`),
averaging time (`SENS<n>:POW:ATIM <ms>MS`), autorange, continuous measurement (`INIT<n>:CHAN1:CONT 1`),
then `SYST:ERR?` until the queue is empty (any error: the probe does not start, with the errors in one
line) and reads the settings back: the device's own averaging time is what the readings mean, so it is the
one recorded (an `instrument` event and the probe's stats in run.json), next to the one asked for.

It then fetches every slot at once each poll (`FETC1:CHAN1:POW?;:FETC2:CHAN1:POW?…`, one round trip,
answered `v1;v2;…`) and hands the readings to the loop, which writes `rx_power` events (source
`pm:<meter>/ch<n>`, value dBm, meta: channel, what it is mapped to, the NIC port whose light it is,
`mw`, `averaging_ns`, `prev_ns`) on change (deadband, threshold crossings) and as a heartbeat, as the DOM
poller does. A continuously measuring N77xx averages back-to-back windows and `FETC` returns the last
completed one: the reading answered at t covers a window that ended after the query was sent minus one
averaging time A. So a change first seen at t happened after the previous poll was sent minus 2A (the light
may have arrived late in the previous window, too little of it to cross the threshold): `prev_ns` is that,
and the mark's bracket is one poll period plus two averaging times wide.

A poll that fails (timeout, connection lost) is counted, written as a `sampler.error`, and the session is
reopened; a meter failing for `max_error_streak_s` is given up on (the others go on). A meter is a second
opinion: losing one mid-run never stops the run, though a meter that cannot be configured stops it from
starting.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import numpy as np

from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError
from labctl.core.events import Event, Kind
from labctl.core.extras import require
from labctl.probes.base import MeterSite, ProbeContext, ProbeKind
from labctl.probes.sampling import Probe, QueueProbe, staggered_heartbeats

NO_LIGHT_DBM = -70.0
"""Readings below this are reported as no light (value None, as the DOM poller's): an N77xx's range ends
near -80 dBm and a dark port reads its noise floor, whose wander is no change of the light."""
MAX_POLL_HZ = 1000.0  # default rate cap: one fetch per averaging time, at most this often
MAX_ERRORS_READ = 32  # SYST:ERR? reads before giving up on emptying the queue
PURPOSE = "the power-meter probe (Keysight N77xx over SCPI)"


def require_visa() -> Any:
    """pyvisa and its pure-Python backend, or one line naming the extra to install."""
    require("pyvisa_py", "scpi", PURPOSE)
    return require("pyvisa", "scpi", PURPOSE)


def resource_name(host: str, port: int) -> str:
    return f"TCPIP0::{host}::{port}::SOCKET"


class ScpiSession:
    """One VISA session to a meter. Blocking: used only on the meter's worker thread."""

    def __init__(self, resource: str, timeout_s: float) -> None:
        pyvisa = require_visa()
        self.resource = resource
        self._rm = pyvisa.ResourceManager("@py")
        try:
            self._inst = self._rm.open_resource(
                resource, read_termination="\n", write_termination="\n", timeout=round(timeout_s * 1000)
            )
        except BaseException:
            self._rm.close()
            raise

    def query(self, command: str) -> str:
        return str(self._inst.query(command)).strip()

    def write(self, command: str) -> None:
        self._inst.write(command)

    def close(self) -> None:
        try:
            self._inst.close()
        finally:
            self._rm.close()


def _error_code(entry: str) -> int:
    try:
        return int(entry.split(",", 1)[0])
    except ValueError:
        return -1  # not an error-queue answer at all: counts as an error


@dataclass(frozen=True)
class MeterSetup:
    """What a meter reported after configuration."""

    idn: str
    averaging_ns: dict[int, int]
    wavelength_nm: dict[int, float]

    @property
    def longest_averaging_ns(self) -> int:
        return max(self.averaging_ns.values())


def configure(session: ScpiSession, site: MeterSite) -> MeterSetup:
    """Identify the meter, set every mapped slot up, check its error queue, and read the settings back."""
    name, spec = site.name, site.spec
    idn = session.query("*IDN?")
    fields = [f.strip() for f in idn.split(",")]
    if len(fields) < 2 or not fields[1].upper().startswith("N77"):
        raise HardwareError(f"power meter {name} ({session.resource}): *IDN? answered {idn!r}, not an N77xx")
    session.write("*CLS")
    slots = sorted({ch.channel for ch in site.channels})
    for n in slots:
        session.write(f"SENS{n}:POW:WAV {spec.wavelength_nm:g}NM")
        session.write(f"SENS{n}:POW:UNIT 0")
        session.write(f"SENS{n}:POW:ATIM {spec.averaging_time_ms:.6g}MS")
        session.write(f"SENS{n}:POW:RANG:AUTO 1")
        session.write(f"INIT{n}:CHAN1:CONT 1")
    check_errors(session, name, "configuring it")
    averaging: dict[int, int] = {}
    wavelength: dict[int, float] = {}
    for n in slots:
        averaging[n] = round(float(session.query(f"SENS{n}:POW:ATIM?")) * 1e9)
        wavelength[n] = round(float(session.query(f"SENS{n}:POW:WAV?")) * 1e9, 3)
        unit = session.query(f"SENS{n}:POW:UNIT?")
        if unit.strip().lstrip("+") not in ("0", "DBM"):
            raise HardwareError(f"power meter {name}: slot {n} reads in unit {unit!r} after being set to dBm")
    check_errors(session, name, "reading its settings back")
    return MeterSetup(idn, averaging, wavelength)


def check_errors(session: ScpiSession, name: str, doing: str) -> None:
    """Read `SYST:ERR?` until it says `0`; raise every error it held, in one line."""
    errors = []
    for _ in range(MAX_ERRORS_READ):
        entry = session.query("SYST:ERR?")
        if _error_code(entry) == 0:
            break
        errors.append(entry)
    else:
        errors.append(f"... (still not empty after {MAX_ERRORS_READ} reads)")
    if errors:
        raise HardwareError(f"power meter {name}: {doing} left errors: {'; '.join(errors)}")


@dataclass
class _Meter:
    """One meter: its site, its worker thread, and what the loop remembers of each channel's reports."""

    site: MeterSite
    setup: MeterSetup | None = None
    resource: str = ""
    period_ns: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    configured: concurrent.futures.Future[MeterSetup] = field(default_factory=concurrent.futures.Future)
    finished: concurrent.futures.Future[None] = field(default_factory=concurrent.futures.Future)
    thread: threading.Thread | None = None
    read_errors: int = 0
    failed: str | None = None
    # Per channel (in `site.channels` order): last reported dBm and time, last poll's send time, heartbeat.
    reported_dbm: np.ndarray = field(default_factory=lambda: np.zeros(0))
    reported_t: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    heartbeat_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    force: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    prev_sent_ns: int = 0

    def __post_init__(self) -> None:
        # Running from the start: an awaiting task that is cancelled cannot cancel them under the thread.
        self.configured.set_running_or_notify_cancel()
        self.finished.set_running_or_notify_cancel()

    @property
    def slots(self) -> list[int]:
        return [ch.channel for ch in self.site.channels]

    @property
    def fetch(self) -> str:
        return ";:".join(f"FETC{n}:CHAN1:POW?" for n in self.slots)


class PowerMeterProbe(QueueProbe):
    """Polls every meter of its context from a worker thread per meter; reports on the loop.

    Reports like the DOM poller: a channel's reading is written when it moved by `deadband_db`, crossed
    `threshold_dbm` (always: the first reading at or above it is the first poll that saw the light back),
    was forced by a switch acknowledgement of its port (`switched`), or as a staggered heartbeat."""

    name = "power-meter"
    counters = ("samples", "read_errors")

    def __init__(
        self,
        meters: Sequence[MeterSite],
        *,
        deadband_db: float = 0.5,
        report_interval_ns: int = 100_000_000,
        threshold_dbm: float | None = None,
        max_error_streak_s: float = 2.0,
        queue_size: int = 65536,
    ) -> None:
        super().__init__(queue_size)
        require_visa()  # before a lab is built around it: one line naming the extra
        self.meters = [_Meter(site) for site in meters]
        self.deadband_db = deadband_db
        self.report_interval_ns = report_interval_ns
        self.threshold_dbm = -math.inf if threshold_dbm is None else threshold_dbm
        self.max_error_streak_s = max_error_streak_s
        self.samples = 0  # channel readings
        self.read_errors = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False

    def stats(self) -> dict[str, float | int]:
        out = super().stats()
        for m in self.meters:
            name = m.site.name
            out[f"{name}.averaging_ns_requested"] = round(m.site.spec.averaging_time_ms * 1e6)
            if m.setup is not None:
                out[f"{name}.averaging_ns"] = m.setup.longest_averaging_ns  # what the device set
                out[f"{name}.wavelength_nm"] = max(m.setup.wavelength_nm.values())
                out[f"{name}.poll_period_ns"] = m.period_ns
            out[f"{name}.read_errors"] = m.read_errors
        return out

    # -- lifecycle -------------------------------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        self._check_startable()
        self._loop = asyncio.get_running_loop()
        for m in self.meters:
            m.resource = resource_name(*m.site.endpoint())
        for m in self.meters:
            m.thread = threading.Thread(target=self._work, args=(m,), name=f"power-meter:{m.site.name}")
            m.thread.start()
        try:
            for m in self.meters:
                m.setup = await asyncio.wrap_future(m.configured)
        except BaseException:
            await self._stop_workers()
            raise
        for m in self.meters:
            self._started(m)
        return await super().__aenter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self._stop_workers()  # first: no reading reaches the stream once it has ended
        finally:
            await super().__aexit__(exc_type, exc, tb)

    async def _stop_workers(self) -> None:
        self._stopping = True
        for m in self.meters:
            m.stop.set()
        for m in self.meters:
            if m.thread is not None:
                await asyncio.wrap_future(m.finished)  # never an error: the thread reports its own
                m.thread.join()  # it has returned: this only reaps it

    async def _run(self) -> None:
        # The samplers are the worker threads; this task ends when every meter was given up on.
        await asyncio.gather(*(asyncio.wrap_future(m.finished) for m in self.meters))

    def _started(self, m: _Meter) -> None:
        assert m.setup is not None
        spec, n = m.site.spec, len(m.site.channels)
        m.reported_dbm = np.full(n, math.nan)
        m.reported_t = np.zeros(n, np.int64)
        m.heartbeat_ns = staggered_heartbeats(self.report_interval_ns, n)
        m.force = np.zeros(n, bool)
        self.queue.put(
            Event(
                t_ns=now_ns(),
                kind=Kind.INSTRUMENT,
                source=f"pm:{m.site.name}",
                value=m.setup.idn,
                meta={
                    "probe": self.name,
                    "resource": m.resource,
                    "averaging_ns": m.setup.averaging_ns,
                    "averaging_ns_requested": round(spec.averaging_time_ms * 1e6),
                    "wavelength_nm": m.setup.wavelength_nm,
                    "unit": "dBm",
                    "poll_period_ns": m.period_ns,
                    "channels": {ch.channel: ch.label for ch in m.site.channels},
                },
            )
        )

    # -- the worker thread -----------------------------------------------------------------------------------
    def _work(self, m: _Meter) -> None:
        """The meter's thread: open and configure, then poll at its period until told to stop."""
        session: ScpiSession | None = None
        try:
            try:
                session = ScpiSession(m.resource, m.site.spec.timeout_s)
                setup = configure(session, m.site)
            except HardwareError as e:
                m.configured.set_exception(e)
                return
            except Exception as e:  # pyvisa's errors, refused connections: one line, where and why
                m.configured.set_exception(
                    HardwareError(f"power meter {m.site.name} ({m.resource}): {type(e).__name__}: {e}")
                )
                return
            spec = m.site.spec
            hz = spec.poll_hz or min(MAX_POLL_HZ, 1e9 / setup.longest_averaging_ns)
            m.period_ns = max(round(1e9 / hz), 1)
            m.configured.set_result(setup)
            session = self._poll(m, session)
        except BaseException as e:  # a bug: end the thread with it, never hang the loop on it
            if not m.configured.done():
                m.configured.set_exception(e)
        finally:
            if session is not None:
                with contextlib.suppress(Exception):
                    session.close()
            m.finished.set_result(None)

    def _poll(self, m: _Meter, session: ScpiSession | None) -> ScpiSession | None:
        """Fetch every slot each period; returns the session still open (None: none)."""
        period, fetch = m.period_ns, m.fetch
        max_streak = max(1, round(self.max_error_streak_s * 1e9 / period))
        streak = 0
        next_t = now_ns()
        while not m.stop.is_set():
            wait = next_t - now_ns()
            if wait > 0 and m.stop.wait(wait / 1e9):
                break
            sent = now_ns()
            try:
                if session is None:  # reopened after a failed poll: a late answer must not be read as new
                    session = ScpiSession(m.resource, m.site.spec.timeout_s)
                reply = session.query(fetch)
                t = now_ns()  # observed: the readings existed when the answer arrived
                values = [float(v) for v in reply.split(";")]
                if len(values) != len(m.slots):
                    raise ValueError(f"{len(values)} readings for {len(m.slots)} slots in {reply!r}")
            except Exception as e:
                streak += 1
                why = f"power meter {m.site.name}: poll failed: {type(e).__name__}: {e}"
                give_up = streak >= max_streak
                self._post(self._poll_failed, m, why, give_up)
                if session is not None:
                    with contextlib.suppress(Exception):
                        session.close()
                    session = None
                if give_up:
                    break
            else:
                streak = 0
                self._post(self._sampled, m, sent, t, values)
            next_t += period
            if now_ns() - next_t > 2 * period:  # stalled (a slow answer): skip what was missed
                next_t = now_ns() + period
        return session

    def _post(self, callback: Any, *args: Any) -> None:
        loop = self._loop
        if loop is not None and not self._stopping:
            with contextlib.suppress(RuntimeError):  # the loop closed under a thread being stopped
                loop.call_soon_threadsafe(callback, *args)

    # -- on the loop -----------------------------------------------------------------------------------------
    def _poll_failed(self, m: _Meter, why: str, give_up: bool) -> None:
        if self._stopping:
            return
        self.read_errors += 1
        m.read_errors += 1
        if give_up:
            m.failed = f"{why} ({m.read_errors} failed polls; no longer polled)"
        self.queue.put(
            Event(
                t_ns=now_ns(),
                kind=Kind.SAMPLER_ERROR,
                source=f"pm:{m.site.name}",
                value=m.failed or why,
                meta={"probe": self.name, "read_errors": m.read_errors},
            )
        )

    def _sampled(self, m: _Meter, sent: int, t: int, values: list[float]) -> None:
        # Before `_started` (the start still awaits another meter's configuration): not yet reported.
        if self._stopping or m.reported_dbm.size != len(values):
            return
        assert m.setup is not None
        self.samples += len(values)
        raw = np.asarray(values, np.float64)
        dbm = np.where(raw >= NO_LIGHT_DBM, raw, -math.inf)  # below it: no light, whatever the noise did
        last = m.reported_dbm
        first = np.isnan(last)
        above, was_above = dbm >= self.threshold_dbm, last >= self.threshold_dbm
        lit, was_lit = dbm > -math.inf, last > -math.inf
        with np.errstate(invalid="ignore"):  # inf - inf where both are dark: no move
            delta = np.abs(np.where(lit & was_lit, dbm - last, 0.0))
        moved = first | (above != was_above) | (lit != was_lit) | (delta >= self.deadband_db)
        due = moved | m.force | (t - m.reported_t >= m.heartbeat_ns)
        # The reading covers a window that ended after `sent` - A; the previous one's, after its send - A;
        # light too late in that window to lift its mean over the threshold: a further A.
        prev = m.prev_sent_ns - 2 * m.setup.longest_averaging_ns if m.prev_sent_ns else 0
        m.prev_sent_ns = sent
        m.force[:] = False
        rows = np.flatnonzero(due).tolist()
        if not rows:
            return
        m.reported_dbm[due] = dbm[due]
        m.reported_t[due] = t
        self.report(self._events(m, rows, t, raw[due].tolist(), prev), len(rows))

    def _events(self, m: _Meter, rows: list[int], t: int, raw: list[float], prev: int) -> Any:
        assert m.setup is not None
        for k, value in zip(rows, raw, strict=True):
            ch = m.site.channels[k]
            meta: dict[str, object] = {
                "channel": ch.channel,
                "port": ch.label,
                "switch": ch.switch,
                "switch_port": ch.egress,
                "mw": float(f"{math.pow(10.0, value / 10.0):.6g}"),
                "averaging_ns": m.setup.averaging_ns[ch.channel],
            }
            if ch.nic is not None:
                meta["nic"] = ch.nic.source
            if prev > 0:
                meta["prev_ns"] = prev
            dbm = round(value, 3) if value >= NO_LIGHT_DBM else None
            yield Event(t_ns=t, kind=Kind.RX_POWER, source=ch.source, value=dbm, meta=meta)

    # -- told by the controller ------------------------------------------------------------------------------
    def expect_switch_acks(self) -> None:
        """`switched` follows every switch change (nothing else to do: reports are on change already)."""

    def switched(self, sources: Collection[str]) -> None:
        """The switch moved the light of these NIC ports: report each one's next reading, whatever it shows
        (a new circuit at the old level would otherwise wait for the heartbeat)."""
        moved = set(sources)
        for m in self.meters:
            for k, ch in enumerate(m.site.channels):
                if ch.nic is not None and ch.nic.source in moved and k < m.force.size:
                    m.force[k] = True

    @property
    def failures(self) -> list[str]:
        return [m.failed for m in self.meters if m.failed is not None]


def _build(ctx: ProbeContext) -> Probe:
    return PowerMeterProbe(
        ctx.meters,
        deadband_db=ctx.settings.rx_power_deadband_db,
        report_interval_ns=ctx.report_interval_ns,
        threshold_dbm=ctx.settings.rx_power_threshold_dbm,
    )


PROBE = ProbeKind(
    "power-meter",
    (Kind.RX_POWER, Kind.INSTRUMENT),
    "bench optical power meters (Keysight N77xx over SCPI, pyvisa): each channel's averaged power on the "
    "switch or NIC port it taps, as rx_power from pm:<meter>/ch<n>",
    _build,
)
