"""A behaviour model of verbs RC queue pairs behind labctl.rdma.qp.RcQp, on the IB RC rules of
labctl.rdma.rc, over an in-memory fabric whose ports can be darkened: what the verbs-rc probe's logic is
tested against where there is no RDMA device (and what a lab rehearsal could run).

Time is real (CLOCK_MONOTONIC): a QP does its work when it is polled, as a NIC would have done it by then.
A packet sent at t reaches the far QP at t + `latency_ns` unless either end's port is dark at t; the far QP
handles it at its next poll. The requester's timers (ACK timeout retries, RETRY_EXC) run at each poll too,
so the model's resolution is the poll period (the probe polls every few tens of µs).
Thread-safe: one lock over the fabric, since both ends of a connection may be polled from different threads.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections import deque
from collections.abc import Iterable

from labctl.core.clock import now_ns
from labctl.rdma.oob import QpInfo
from labctl.rdma.qp import RECV_TAG, WorkCompletion
from labctl.rdma.rc import Op, Packet, QpAttrs, QpState, Requester, Responder, WcStatus


class ModelFabric:
    """Ports joined by a lossless wire with a fixed latency, each of which can go dark; a QP factory
    (labctl.rdma.qp.QpFactory) for the probe."""

    def __init__(self, attrs: QpAttrs, latency_ns: int = 5_000, seed: int | None = None) -> None:
        self.attrs = attrs
        self.latency_ns = latency_ns
        self.lock = threading.RLock()
        self.rng = random.Random(seed)
        self.dark: set[str] = set()
        self.qps: dict[int, ModelQp] = {}
        self._qpns = itertools.count(self.rng.randrange(0x100, 0x10000))
        self.dropped = 0

    def darken(self, ports: Iterable[str]) -> None:
        with self.lock:
            self.dark.update(ports)

    def light(self, ports: Iterable[str]) -> None:
        with self.lock:
            self.dark.difference_update(ports)

    # -- QpFactory ----------------------------------------------------------------------------------------
    def check(self, sources: list[str]) -> None:
        """Every port can have model QPs."""

    def make(self, local: str, peer: str) -> ModelQp:
        return ModelQp(self, local)

    # -- the wire -----------------------------------------------------------------------------------------
    def _register(self, qp: ModelQp) -> int:
        with self.lock:
            qpn = next(self._qpns) & 0xFFFFFF
            self.qps[qpn] = qp
            return qpn

    def _transmit(self, port: str, packets: list[Packet], t_ns: int) -> None:
        with self.lock:
            for packet in packets:
                far = self.qps.get(packet.qpn)
                if far is None or port in self.dark or far.port in self.dark:
                    self.dropped += 1
                    continue
                far.inbox.append((t_ns + self.latency_ns, packet))


class ModelQp:
    """One RC QP (labctl.rdma.qp.RcQp) on a ModelFabric port: a Requester and a Responder sharing one QP
    number, `depth` receives posted."""

    def __init__(self, fabric: ModelFabric, port: str, depth: int = 64) -> None:
        self.fabric = fabric
        self.port = port
        self.depth = depth
        self.qpn = 0
        self.psn = 0
        self.state = QpState.RESET
        self.requester: Requester | None = None
        self.responder: Responder | None = None
        self.inbox: deque[tuple[int, Packet]] = deque()
        self._ready: list[WorkCompletion] = []  # completions made by a post (a flushed send)
        self._free_slots: deque[int] = deque()

    def _init(self) -> QpInfo:
        self.psn = self.fabric.rng.randrange(1 << 24)
        self.state = QpState.RESET  # INIT, in verbs terms: receives posted, nothing sent or accepted yet
        self.requester = self.responder = None
        self.inbox.clear()
        self._ready.clear()
        self._free_slots = deque(range(self.depth))
        return QpInfo(qpn=self.qpn, psn=self.psn, lid=1)

    def open(self) -> QpInfo:
        with self.fabric.lock:
            self.qpn = self.fabric._register(self)
            return self._init()

    def connect(self, remote: QpInfo) -> None:
        with self.fabric.lock:
            attrs = self.fabric.attrs
            self.requester = Requester(self.qpn, remote.qpn, attrs, psn=self.psn)
            self.responder = Responder(self.qpn, remote.qpn, attrs, expected_psn=remote.psn)
            self.responder.post_recv(len(self._free_slots))
            self.state = QpState.RTS

    def reset(self) -> QpInfo:
        with self.fabric.lock:
            return self._init()

    def post_send(self, wr_id: int, payload: bytes) -> int:
        with self.fabric.lock:
            t = now_ns()
            if self.requester is None:
                raise RuntimeError(f"QP {self.qpn:#x} is not connected: a post needs RTS (or ERR)")
            packets, done = self.requester.send(wr_id, payload, t)
            self._ready.extend(WorkCompletion(c.wr_id, c.status.value, t) for c in done)
            self.fabric._transmit(self.port, packets, t)
            return t

    def poll(self, n: int = 16) -> list[WorkCompletion]:
        with self.fabric.lock:
            t = now_ns()
            out = self._ready
            self._ready = []
            req, resp = self.requester, self.responder
            if req is None or resp is None:
                self.inbox.clear()  # INIT/RESET: nothing is accepted
                return out
            while self.inbox and self.inbox[0][0] <= t:
                _, packet = self.inbox.popleft()
                if self.state is not QpState.RTS:
                    continue  # a QP in the error state answers nothing
                if packet.op is Op.SEND:
                    replies, delivered = resp.receive(packet)
                    self.fabric._transmit(self.port, replies, t)
                    for payload in delivered:
                        slot = self._free_slots.popleft()
                        out.append(WorkCompletion(RECV_TAG | slot, WcStatus.SUCCESS.value, t, payload))
                        self._free_slots.append(slot)  # posted again at once, as VerbsQp does
                        resp.post_recv(1)
                else:
                    packets, done = req.receive(packet, t)
                    self.fabric._transmit(self.port, packets, t)
                    out.extend(WorkCompletion(c.wr_id, c.status.value, t) for c in done)
            deadline = req.next_deadline()
            if deadline is not None and t >= deadline:
                packets, done = req.poll_timers(t)
                self.fabric._transmit(self.port, packets, t)
                out.extend(WorkCompletion(c.wr_id, c.status.value, t) for c in done)
            if req.state is QpState.ERR and self.state is QpState.RTS:
                # The error state flushes the receive queue too, as verbs does.
                self.state = QpState.ERR
                resp.state = QpState.ERR
                out.extend(
                    WorkCompletion(RECV_TAG | slot, WcStatus.WR_FLUSH_ERR.value, t)
                    for slot in self._free_slots
                )
                self._free_slots.clear()
            return out[:n] + self._requeue(out[n:])

    def _requeue(self, rest: list[WorkCompletion]) -> list[WorkCompletion]:
        self._ready.extend(rest)  # more than n: the next poll gets them, as a CQ keeps them
        return []

    def close(self) -> None:
        with self.fabric.lock:
            self.fabric.qps.pop(self.qpn, None)
            self.state = QpState.RESET
            self.requester = self.responder = None
