"""RDMA recovery on real RoCE/InfiniBand ports: an RC SEND/RECV ping-pong through verbs, in the style of
perftest's `ib_send_lat`, one queue pair per (port, peer) circuit end.

Each port keeps one QP per peer it has had a circuit to, as a training job keeps its connections. The QPs
are connected through an out-of-band exchange (labctl.rdma.exchange: in process where both ends are this
probe's, else TCP to the peer port's address). While a port has a circuit it posts a PING to its peer
every `interval_us`, the next once the last was answered; the peer's receive completion posts a PONG at
once. The PONG's receive completion, stamped where it is polled, is `traffic.ok` (value: PING post to PONG
poll, ns; `meta.transport = "rc"`, `meta.prev_ns` = the previous PING's post: the bracket); a PING
unanswered for `traffic_timeout_us` (default 2 intervals) is `traffic.lost`, stamped at its post. The NIC
retransmits unseen (local ACK timeout 4.096 µs × 2^timeout, `retry_cnt` times); with the retries spent the
SEND completes with IBV_WC_RETRY_EXC_ERR: `rdma.wc_error` (value: the status name) and `rdma.qp_state`
IBV_QPS_ERR. Under the `reconnect` policy the QP goes RESET → INIT → RTR → RTS with fresh PSNs through the
exchange (`rdma.reconnect`, value: ns from the error to RTS again); under `survive` the port stays down.

A reconfiguration starts (`open_window`): the moved ports stop posting, as a job does at a step boundary
(an idle QP has no timer and survives any dark gap); the circuits that follow (`set_circuits`) resume it.

Completions are polled off the event loop, in one thread per probe that polls every QP, answers PINGs
and posts the next PING itself (so the round trip does not include the loop), sleeping `poll_idle_us`
when nothing completed; what the loop must know (outcomes, errors) goes to it in batches. Exchanges and
reconnects run on the loop. The QPs come from a `QpFactory`: pyverbs on the inventory's devices, or the
behaviour model (labctl.rdma.model) the tests drive the same logic with.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Self

from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError, InputError, LabctlError
from labctl.core.events import Event, Kind
from labctl.inventory.schema import RdmaPortSpec
from labctl.probes.base import PortSite, ProbeContext, ProbeKind
from labctl.probes.sampling import Probe, QueueProbe, RdmaSettings
from labctl.probes.traffic import PingOutcomes, TrafficEndpoint, _endpoint
from labctl.rdma.exchange import PortExchange, QpExchange
from labctl.rdma.oob import ExchangeError, PeerBusy, QpInfo
from labctl.rdma.qp import WR_FLUSH_ERR, QpFactory, RcQp, WorkCompletion
from labctl.rdma.rc import QpAttrs, QpState
from labctl.rdma.verbs import VerbsQpFactory

log = logging.getLogger("labctl.rdma")

PING, PONG = 1, 2
_MSG = struct.Struct("!BxxxI")  # kind, sequence
PONG_TAG = 1 << 61  # set in a PONG's send wr_id (a PING's is its sequence)
RETRY_S = 0.2  # an exchange that failed (peer not listening yet, circuit not carrying IP yet) is tried again


@dataclass
class _End:
    """One circuit end: this port's QP toward one peer."""

    local: str
    peer: str
    qp: RcQp
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Serializes the QP's calls: the poller thread's polls and posts, the loop's reset and connect."""
    guard: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One exchange at a time per end."""
    state: QpState = QpState.RESET
    """RESET: not connected (never, or being reset): the poller leaves it alone."""
    opened: bool = False
    connected_once: bool = False
    exchanging: bool = False
    qpn: int = 0
    psn: int = 0  # the starting PSN of its latest connection
    rts_ns: int = 0  # when its latest connection reached RTS: an error stamped before is already over
    seq: int = 0
    ping: tuple[int, int, int | None] | None = None
    """The PING in flight: (sequence, post time, the post before it)."""
    last_post: int = 0
    stalled: bool = False  # traffic.lost reported since the last answer
    errored_at: int | None = None
    task: asyncio.Task[None] | None = None
    failures: int = 0


def _in_rts(end: _End) -> bool:
    return end.state is QpState.RTS  # read afresh: an await may have passed since the last look


Note = tuple[str, _End, int, int, int | None, int | None, str]
"""What the poller tells the loop: (kind, end, post time, observed time, rtt, previous post, status)."""


class VerbsRcProbe(QueueProbe):
    name = "verbs-rc"
    counters = ("posts", "completions", "pongs_sent")

    def __init__(
        self,
        endpoints: Sequence[TrafficEndpoint],
        *,
        qps: QpFactory,
        exchange: QpExchange,
        interval_us: int = 1000,
        timeout_us: int | None = None,
        settings: RdmaSettings | None = None,
        report_interval_ns: int = 100_000_000,
        poll_idle_us: int = 20,
        keep_round_trips: int = 100_000,
    ) -> None:
        super().__init__()
        self.by_source = {e.source: e for e in endpoints}
        self.qps = qps
        self.exchange = exchange
        self.period_ns = interval_us * 1000
        self.timeout_ns = (timeout_us if timeout_us is not None else 2 * interval_us) * 1000
        self.settings = settings or RdmaSettings()
        s = self.settings
        self.attrs = QpAttrs(
            timeout=s.timeout, retry_cnt=s.retry_cnt, rnr_retry=s.rnr_retry, min_rnr_timer=s.min_rnr_timer
        )
        self.outcomes = PingOutcomes(
            self, {e.source: e.host for e in endpoints}, report_interval_ns, transport="rc", qp="verbs"
        )
        self.poll_idle_s = poll_idle_us / 1e6
        self.ends: dict[tuple[str, str], _End] = {}
        """One QP per (port, peer), kept across circuits."""
        self.active: dict[str, str] = {}
        """Port → the peer it pings now."""
        self.round_trips: deque[int] = deque(maxlen=keep_round_trips)
        """The latest PING → PONG round trips, ns (bench/rdma.py reports them perftest's way)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self.posts = 0
        self.completions = 0
        self.pongs_sent = 0
        self.errors = 0
        self.recv_flushed = 0
        self.reconnects = 0
        self.exchange_failures = 0

    def stats(self) -> dict[str, float | int]:
        out = super().stats()
        out.update(
            errors=self.errors,
            reconnects=self.reconnects,
            recv_flushed=self.recv_flushed,
            exchange_failures=self.exchange_failures,
            **{f"qp_{k}": v for k, v in vars(self.attrs).items()},
        )
        return out

    # -- the controller's side -------------------------------------------------------------------------
    def set_circuits(self, peers: dict[str, str | None]) -> None:
        for source, peer in peers.items():
            if source not in self.by_source:
                continue
            self.outcomes.forget(source)
            if peer is None:
                self.active.pop(source, None)
                continue
            self.active[source] = peer
            end = self._end(source, peer)
            if end.state is not QpState.RTS and self._initiates(end):
                self._start_connect(end)

    def open_window(self, sources: Collection[str] | None = None) -> None:
        """A reconfiguration starts: these ports stop posting (an idle QP has no timer, so it survives a dark
        gap of any length); the circuits that follow resume them."""
        for source in list(self.active) if sources is None else sources:
            self.active.pop(source, None)

    def close_window(self) -> None:
        pass

    # -- lifecycle --------------------------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        self._check_startable()
        self.qps.check(list(self.by_source))  # no pyverbs, no device: one line, before anything starts
        await self.exchange.open(self._answer)
        try:
            await super().__aenter__()
        except BaseException:
            await self.exchange.close()
            raise
        return self

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        died: asyncio.Future[BaseException] = self._loop.create_future()
        self._thread = threading.Thread(
            target=self._poll_thread, args=(died,), name=f"{self.name}-poll", daemon=True
        )
        self._thread.start()
        try:
            cause = await died  # pending for as long as the poller lives
            raise HardwareError(f"its poller thread died: {type(cause).__name__}: {cause}") from cause
        finally:
            await self._shutdown()

    def _poll_thread(self, died: asyncio.Future[BaseException]) -> None:
        """The poller, and word to the loop if it ever ends by an exception (a bug, a device call that
        raised outside the per-QP guard): the probe then fails and names it, the run does not wait on."""
        try:
            self._poll_loop()
        except BaseException as e:
            log.error("%s: poller thread died: %s: %s", self.name, type(e).__name__, e)
            loop = self._loop
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(_settle, died, e)

    async def _shutdown(self) -> None:
        self._closing = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join()  # it sleeps at most poll_idle_us between rounds
            self._thread = None
        tasks = [end.task for end in self.ends.values() if end.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.exchange.close()
        for end in self.ends.values():
            with end.lock:
                try:  # one QP that fails to close must not keep the others open
                    end.qp.close()
                except Exception as e:
                    log.warning("%s: closing its QP to %s: %s", end.local, end.peer, e)

    # -- circuit ends and their exchanges (on the loop) -------------------------------------------------
    def _end(self, local: str, peer: str) -> _End:
        end = self.ends.get((local, peer))
        if end is None:
            end = self.ends[(local, peer)] = _End(local, peer, self.qps.make(local, peer))
        return end

    def _initiates(self, end: _End) -> bool:
        """Who asks: the first connection, the end whose source sorts first (the other answers); a
        reconnect, either end that saw its QP fail (PeerBusy settles both asking at once)."""
        if end.connected_once:
            return self.settings.policy == "reconnect"
        return end.local < end.peer

    def _start_connect(self, end: _End) -> None:
        if self._closing or (end.task is not None and not end.task.done()):
            return
        end.task = asyncio.get_running_loop().create_task(
            self._connect(end), name=f"{self.name}:connect:{end.local}"
        )

    def _fresh(self, end: _End) -> QpInfo:
        """This end's QP in INIT with a fresh PSN (opened the first time, reset after)."""
        with end.lock:
            end.state = QpState.RESET
            end.ping = None
            end.stalled = False
            info = end.qp.reset() if end.opened else end.qp.open()
            end.opened = True
            end.qpn = info.qpn
            end.psn = info.psn
            return info

    def _connected(self, end: _End, theirs: QpInfo) -> None:
        with end.lock:
            end.qp.connect(theirs)
            end.state = QpState.RTS
            end.connected_once = True
            end.failures = 0
            end.rts_ns = now_ns()
            # Read and cleared under the lock: an error the poller records right after is not wiped.
            errored_at, end.errored_at = end.errored_at, None
        t = now_ns()
        if errored_at is not None:
            self.reconnects += 1
            self._put(end, Kind.RDMA_RECONNECT, t, t - errored_at, psn=end.psn, remote_psn=theirs.psn)
        self._put(end, Kind.RDMA_QP_STATE, t, QpState.RTS.value, policy=self.settings.policy)

    async def _connect(self, end: _End) -> None:
        """Ask the peer's end until this one is in RTS, while its circuit is in use."""
        while not self._closing and not _in_rts(end) and self.active.get(end.local) == end.peer:
            async with end.guard:
                if _in_rts(end):
                    return  # the peer's request connected it meanwhile
                end.exchanging = True
                try:
                    theirs = await self.exchange.exchange(end.local, end.peer, self._fresh(end))
                    self._connected(end, theirs)
                    return
                except PeerBusy:
                    pass  # the peer asks us at this moment; its request connects this end
                except (LabctlError, OSError) as e:
                    self.exchange_failures += 1
                    end.failures += 1
                    (log.warning if end.failures == 1 else log.debug)("%s: %s", end.local, e)
                finally:
                    end.exchanging = False
            await asyncio.sleep(RETRY_S)

    async def _answer(self, local: str, peer: str, theirs: QpInfo) -> QpInfo:
        """The peer's end asks this one to connect to `theirs` (first connection or reconnect)."""
        if self._closing:
            raise ExchangeError(f"{local}: the probe is stopping")
        end = self._end(local, peer)
        if end.exchanging and local < peer:
            raise PeerBusy(f"{local} is connecting to {peer} itself")
        async with end.guard:
            if self._closing:  # stopped while this answer waited: its QP is closed
                raise ExchangeError(f"{local}: the probe is stopping")
            mine = self._fresh(end)
            self._connected(end, theirs)
            return mine

    # -- the poller (its own thread) -------------------------------------------------------------------
    def _poll_loop(self) -> None:
        loop = self._loop
        assert loop is not None
        while not self._stop.is_set():
            notes: list[Note] = []
            busy = False
            for end in list(self.ends.values()):
                # An end the loop is resetting or connecting (device calls, milliseconds on real verbs)
                # is skipped this round, not waited for: the other QPs keep their timing.
                if not end.lock.acquire(blocking=False):
                    continue
                try:
                    if end.state is QpState.RESET:
                        continue
                    try:
                        busy |= self._service(end, notes)
                    except Exception as e:  # a post or poll the device refused: this QP is unusable
                        self.errors += 1
                        end.state = QpState.ERR
                        end.ping = None
                        t = now_ns()
                        end.errored_at = t
                        notes.append(("fault", end, 0, t, None, None, f"{type(e).__name__}: {e}"))
                finally:
                    end.lock.release()
            if notes:
                loop.call_soon_threadsafe(self._on_notes, notes)
            if not busy:
                time.sleep(self.poll_idle_s)

    def _service(self, end: _End, notes: list[Note]) -> bool:
        """Poll one end's QP, answer PINGs, complete our PING, post the next. Under end.lock."""
        wcs = end.qp.poll(32)
        for wc in wcs:
            if wc.is_recv and wc.ok:
                self._received(end, wc, notes)
            elif wc.is_recv and wc.status == WR_FLUSH_ERR:
                self.recv_flushed += 1  # the error state flushed the posted receives: not news
            elif not wc.ok:
                self.errors += 1
                notes.append(("wc_error", end, wc.wr_id, wc.t_ns, None, None, wc.status))
                if end.state is QpState.RTS:
                    end.state = QpState.ERR
                    end.ping = None
                    end.errored_at = wc.t_ns
                    notes.append(("qp_err", end, 0, wc.t_ns, None, None, QpState.ERR.value))
        if end.state is not QpState.RTS or self.active.get(end.local) != end.peer:
            return bool(wcs)
        t = now_ns()
        if end.ping is None:
            if t - end.last_post >= self.period_ns:
                end.seq = (end.seq + 1) & 0xFFFFFFFF
                posted = end.qp.post_send(end.seq, _MSG.pack(PING, end.seq))
                end.ping = (end.seq, posted, end.last_post or None)
                end.last_post = posted
                self.posts += 1
        elif not end.stalled and t - end.ping[1] >= self.timeout_ns:
            end.stalled = True  # traffic stopped at that PING's post
            notes.append(("lost", end, end.ping[1], t, None, None, ""))
        return bool(wcs)

    def _received(self, end: _End, wc: WorkCompletion, notes: list[Note]) -> None:
        if len(wc.payload) < _MSG.size:
            return
        kind, seq = _MSG.unpack_from(wc.payload)
        if kind == PING:
            end.qp.post_send(PONG_TAG | seq, _MSG.pack(PONG, seq))
            self.pongs_sent += 1
        elif kind == PONG and end.ping is not None and end.ping[0] == seq:
            _, posted, previous = end.ping
            end.ping = None
            end.stalled = False
            rtt = wc.t_ns - posted
            self.completions += 1
            self.round_trips.append(rtt)
            notes.append(("ok", end, posted, wc.t_ns, rtt, previous, ""))

    # -- events (on the loop) ---------------------------------------------------------------------------
    def _on_notes(self, notes: list[Note]) -> None:
        if self._closing:
            return
        for kind, end, posted, t, rtt, previous, status in notes:
            active = self.active.get(end.local) == end.peer
            if kind == "ok" and active:
                self.outcomes.report(end.local, end.peer, True, posted, t, rtt, previous)
            elif kind == "lost" and active:
                self.outcomes.report(end.local, end.peer, False, posted, t, None)
            elif kind == "wc_error":
                self._put(end, Kind.RDMA_WC_ERROR, t, status, wr_id=posted)
            elif kind == "fault":
                self._put(end, Kind.RDMA_WC_ERROR, t, status)
            # An error whose QP was reset and reconnected (by the peer's request) before this note came:
            # the QP is in RTS again, so no ERR state and no second reconnect (its wc_error stands).
            if kind in ("qp_err", "fault") and t >= end.rts_ns:
                self._put(end, Kind.RDMA_QP_STATE, t, QpState.ERR.value, policy=self.settings.policy)
                if active and self._initiates(end):
                    self._start_connect(end)

    def _put(self, end: _End, kind: str, t: int, value: int | str, **meta: object) -> None:
        if self._closing:
            return
        self.queue.put(
            Event(
                t_ns=t,
                kind=kind,
                source=end.local,
                host=self.by_source[end.local].host,
                value=value,
                meta={"peer": end.peer, "qpn": end.qpn, **meta},
            )
        )


def _rdma_port(site: PortSite) -> RdmaPortSpec:
    if site.port.rdma is None:
        raise InputError(
            f"{site.port.label}: the verbs-rc probe needs the port's RDMA device in the inventory "
            "(rdma: {device: mlx5_0, port: 1, gid_index: 3}; ibv_devices, rdma link show, show_gids)"
        )
    return site.port.rdma


def _build(ctx: ProbeContext) -> Probe:
    """QPs through pyverbs on the context's ports (their inventory `rdma:`), exchanged with the peers at
    their inventory addresses."""
    settings = ctx.settings.rdma
    endpoints = [_endpoint(site) for site in ctx.ports]
    qps = VerbsQpFactory(
        {site.port.source: _rdma_port(site) for site in ctx.ports},
        QpAttrs(
            timeout=settings.timeout,
            retry_cnt=settings.retry_cnt,
            rnr_retry=settings.rnr_retry,
            min_rnr_timer=settings.min_rnr_timer,
        ),
    )
    return VerbsRcProbe(
        endpoints,
        qps=qps,
        exchange=PortExchange(endpoints, [_endpoint(site) for site in ctx.peers]),
        interval_us=ctx.settings.traffic_interval_us,
        timeout_us=ctx.settings.traffic_timeout_us,
        settings=settings,
        report_interval_ns=ctx.report_interval_ns,
    )


PROBE = ProbeKind(
    "verbs-rc",
    (Kind.TRAFFIC_OK, Kind.TRAFFIC_LOST, Kind.RDMA_WC_ERROR, Kind.RDMA_QP_STATE, Kind.RDMA_RECONNECT),
    "RC SEND/RECV ping-pong through verbs (pyverbs) per circuit, QPs kept per peer, ib_send_lat style",
    _build,
)


def _settle(future: asyncio.Future[BaseException], cause: BaseException) -> None:
    if not future.done():
        future.set_result(cause)
