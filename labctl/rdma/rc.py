"""The reliability rules of an InfiniBand Reliable Connected (RC) queue pair, without I/O.

What decides whether a queue pair rides through an OCS reconfiguration (IBTA spec vol. 1, ch. 9.7):
- The requester numbers every packet with a 24-bit PSN and keeps it until the responder acknowledges it
  (ACKs are cumulative). With nothing acknowledged for the local ACK timeout, 4.096 µs × 2^timeout, it
  goes back to the oldest unacknowledged PSN and sends again (go-back-N); each such retry spends one of
  `retry_cnt`. A NAK for a PSN sequence error (the responder saw a gap) also sends again at once from the
  NAK'd PSN, and spends a retry likewise. With the retries spent, the request completes with
  IBV_WC_RETRY_EXC_ERR and the QP moves to the error state: every other outstanding request is flushed
  (IBV_WC_WR_FLUSH_ERR).
- A responder with no receive posted answers an RNR NAK; the requester waits the RNR timer the responder
  named (its `min_rnr_timer`, encoded per Table 45 below) and sends again, spending one of `rnr_retry`
  (7 = without limit); with them spent: IBV_WC_RNR_RETRY_EXC_ERR and the error state.
- The responder delivers in PSN order only; a duplicate (an already delivered PSN) is acknowledged again
  and not delivered twice.
With nothing acknowledged, the tries go out at 0, P, …, retry_cnt × P (P = 4.096 µs × 2^timeout) and
the QP errors at (retry_cnt + 1) × P: a dark gap must end before retry_cnt × P for the last retry to get
through (0.47 s at timeout 14, retry_cnt 7, the Opus testbed's setting; the error comes at 0.55 s).
A QP in the error state is recovered by
RESET → INIT → RTR → RTS with fresh PSNs (`Requester.reset`, `Responder.reset`).

The model is driven with explicit times (integer ns): `send`, `receive`, `poll_timers(t)`, and it says
when it next needs to be woken (`next_deadline`). Packets it emits and completions it produces are returned
as lists, so a UDP carrier, an asyncio model and the unit tests drive the same code.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

PSN_MASK = (1 << 24) - 1
ACK_TIMEOUT_UNIT_NS = 4096  # 4.096 µs
INFINITE_RNR_RETRY = 7

# IBTA vol. 1, Table 45: the RNR NAK timer field (min_rnr_timer) → the wait in µs; 0 means 655.36 ms.
RNR_TIMER_US = (
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920,
    2_560, 3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
    163_840, 245_760, 327_680, 491_520,
)  # fmt: skip


class WcStatus(enum.Enum):
    """Work completion statuses, named as verbs names them (ibv_wc_status)."""

    SUCCESS = "IBV_WC_SUCCESS"
    RETRY_EXC_ERR = "IBV_WC_RETRY_EXC_ERR"
    RNR_RETRY_EXC_ERR = "IBV_WC_RNR_RETRY_EXC_ERR"
    WR_FLUSH_ERR = "IBV_WC_WR_FLUSH_ERR"


class QpState(enum.Enum):
    RESET = "IBV_QPS_RESET"
    RTS = "IBV_QPS_RTS"
    ERR = "IBV_QPS_ERR"


class Op(enum.Enum):
    SEND = "send"
    ACK = "ack"
    NAK_SEQ = "nak-seq"  # PSN sequence error: the responder expected an earlier PSN
    NAK_RNR = "nak-rnr"  # receiver not ready: no receive posted


@dataclass(frozen=True)
class Packet:
    op: Op
    psn: int
    qpn: int
    payload: bytes = b""
    rnr_timer: int = 0  # NAK_RNR: the responder's min_rnr_timer code


@dataclass(frozen=True)
class Completion:
    wr_id: int
    status: WcStatus
    t_ns: int
    psn: int


@dataclass(frozen=True)
class QpAttrs:
    """The attributes that shape recovery; verbs names and ranges (ibv_qp_attr)."""

    timeout: int = 14  # local ACK timeout exponent, 0-31 (0: wait forever)
    retry_cnt: int = 7  # 0-7
    rnr_retry: int = 7  # 0-7, 7: retry without limit
    min_rnr_timer: int = 12  # 0-31, Table 45 (12: 0.64 ms)

    def __post_init__(self) -> None:
        for name, low, high in (
            ("timeout", 0, 31),
            ("retry_cnt", 0, 7),
            ("rnr_retry", 0, 7),
            ("min_rnr_timer", 0, 31),
        ):
            value = getattr(self, name)
            if not low <= value <= high:
                raise ValueError(f"{name} {value}: must be {low}..{high}")

    @property
    def ack_timeout_ns(self) -> int | None:
        """4.096 µs × 2^timeout; None for timeout 0 (no timer)."""
        return ACK_TIMEOUT_UNIT_NS << self.timeout if self.timeout else None

    @property
    def retry_budget_ns(self) -> int | None:
        """When a requester with nothing acknowledged gives up (RETRY_EXC): (retry_cnt + 1) ACK timeouts
        after its first try; its last try goes out one timeout before that."""
        timeout = self.ack_timeout_ns
        return None if timeout is None else (self.retry_cnt + 1) * timeout


def rnr_wait_ns(code: int) -> int:
    return RNR_TIMER_US[code] * 1000


@dataclass
class _Outstanding:
    wr_id: int
    psn: int
    payload: bytes


@dataclass
class Requester:
    """The send side of an RC QP."""

    qpn: int
    dest_qpn: int
    attrs: QpAttrs = field(default_factory=QpAttrs)
    psn: int = 0
    state: QpState = QpState.RTS
    outstanding: deque[_Outstanding] = field(default_factory=deque)
    retries_left: int = field(init=False)
    rnr_retries_left: int = field(init=False)
    deadline_ns: int | None = None
    """When the ACK timer (or an RNR wait) expires; None while nothing is outstanding."""
    rnr_waiting: bool = False
    retransmissions: int = 0

    def __post_init__(self) -> None:
        self._refill()

    def _refill(self) -> None:
        self.retries_left = self.attrs.retry_cnt
        self.rnr_retries_left = self.attrs.rnr_retry

    def next_deadline(self) -> int | None:
        return self.deadline_ns if self.state is QpState.RTS else None

    def send(self, wr_id: int, payload: bytes, t_ns: int) -> tuple[list[Packet], list[Completion]]:
        """Post a SEND. In the error state it completes at once, flushed (as verbs does)."""
        if self.state is not QpState.RTS:
            return [], [Completion(wr_id, WcStatus.WR_FLUSH_ERR, t_ns, self.psn)]
        item = _Outstanding(wr_id, self.psn, payload)
        self.psn = (self.psn + 1) & PSN_MASK
        self.outstanding.append(item)
        if self.deadline_ns is None and not self.rnr_waiting:
            self._arm(t_ns)
        return [Packet(Op.SEND, item.psn, self.dest_qpn, payload)], []

    def _arm(self, t_ns: int) -> None:
        timeout = self.attrs.ack_timeout_ns
        self.deadline_ns = None if timeout is None else t_ns + timeout

    def receive(self, packet: Packet, t_ns: int) -> tuple[list[Packet], list[Completion]]:
        """An ACK or NAK from the responder."""
        if self.state is not QpState.RTS or packet.qpn != self.qpn:
            return [], []
        if packet.op is Op.ACK:
            return [], self._acknowledge(packet.psn, t_ns)
        if packet.op is Op.NAK_SEQ:
            done = self._acknowledge((packet.psn - 1) & PSN_MASK, t_ns)  # everything before it arrived
            packets, errors = self._retry(t_ns, from_psn=packet.psn)
            return packets, done + errors
        if packet.op is Op.NAK_RNR:
            done = self._acknowledge((packet.psn - 1) & PSN_MASK, t_ns)
            if self.attrs.rnr_retry != INFINITE_RNR_RETRY:
                if self.rnr_retries_left == 0:
                    return [], done + self._fail(WcStatus.RNR_RETRY_EXC_ERR, t_ns)
                self.rnr_retries_left -= 1
            self.rnr_waiting = True
            self.deadline_ns = t_ns + rnr_wait_ns(packet.rnr_timer)
            return [], done
        return [], []

    def _acknowledge(self, psn: int, t_ns: int) -> list[Completion]:
        """A cumulative ACK up to and including `psn`."""
        done = []
        while self.outstanding and _psn_le(self.outstanding[0].psn, psn):
            item = self.outstanding.popleft()
            done.append(Completion(item.wr_id, WcStatus.SUCCESS, t_ns, item.psn))
        if done:
            self._refill()  # progress: the retry counters start over
            self.rnr_waiting = False
            if self.outstanding:
                self._arm(t_ns)
            else:
                self.deadline_ns = None
        return done

    def poll_timers(self, t_ns: int) -> tuple[list[Packet], list[Completion]]:
        """Call at or after `next_deadline()`: the ACK timer fired (retry) or an RNR wait ended (resend)."""
        if self.state is not QpState.RTS or self.deadline_ns is None or t_ns < self.deadline_ns:
            return [], []
        if self.rnr_waiting:
            self.rnr_waiting = False
            return self._resend(t_ns, self.outstanding[0].psn if self.outstanding else self.psn), []
        return self._retry(t_ns, from_psn=self.outstanding[0].psn if self.outstanding else self.psn)

    def _retry(self, t_ns: int, from_psn: int) -> tuple[list[Packet], list[Completion]]:
        if self.retries_left == 0:
            return [], self._fail(WcStatus.RETRY_EXC_ERR, t_ns)
        self.retries_left -= 1
        return self._resend(t_ns, from_psn), []

    def _resend(self, t_ns: int, from_psn: int) -> list[Packet]:
        """Go back to `from_psn` and send everything outstanding from there again."""
        packets = [
            Packet(Op.SEND, item.psn, self.dest_qpn, item.payload)
            for item in self.outstanding
            if _psn_le(from_psn, item.psn)
        ]
        self.retransmissions += len(packets)
        self._arm(t_ns)
        return packets

    def _fail(self, status: WcStatus, t_ns: int) -> list[Completion]:
        """The oldest request completes with `status`, the QP goes to the error state, the rest flush."""
        out = []
        for i, item in enumerate(self.outstanding):
            out.append(Completion(item.wr_id, status if i == 0 else WcStatus.WR_FLUSH_ERR, t_ns, item.psn))
        self.outstanding.clear()
        self.state = QpState.ERR
        self.deadline_ns = None
        self.rnr_waiting = False
        return out

    def reset(self, psn: int) -> None:
        """RESET → INIT → RTR → RTS with a fresh starting PSN (the recovery of a QP in the error state)."""
        self.outstanding.clear()
        self.psn = psn & PSN_MASK
        self.state = QpState.RTS
        self.deadline_ns = None
        self.rnr_waiting = False
        self._refill()


@dataclass
class Responder:
    """The receive side of an RC QP: in-order delivery, cumulative ACKs, sequence and RNR NAKs."""

    qpn: int
    dest_qpn: int
    attrs: QpAttrs = field(default_factory=QpAttrs)
    expected_psn: int = 0
    receives_posted: int = 0
    state: QpState = QpState.RTS
    _nak_sent_for: int | None = None

    def post_recv(self, n: int = 1) -> None:
        self.receives_posted += n

    def receive(self, packet: Packet) -> tuple[list[Packet], list[bytes]]:
        """A SEND from the requester: (ACK/NAK packets to send back, payloads delivered in order)."""
        if self.state is not QpState.RTS or packet.op is not Op.SEND or packet.qpn != self.qpn:
            return [], []
        if packet.psn == self.expected_psn:
            if self.receives_posted == 0:
                return [Packet(Op.NAK_RNR, packet.psn, self.dest_qpn, rnr_timer=self.attrs.min_rnr_timer)], []
            self.receives_posted -= 1
            self.expected_psn = (self.expected_psn + 1) & PSN_MASK
            self._nak_sent_for = None
            return [Packet(Op.ACK, packet.psn, self.dest_qpn)], [packet.payload]
        last = (self.expected_psn - 1) & PSN_MASK
        if _psn_before(packet.psn, self.expected_psn):  # a duplicate: acknowledge again, deliver nothing
            return [Packet(Op.ACK, last, self.dest_qpn)], []
        if self._nak_sent_for == self.expected_psn:  # one NAK per gap, as a responder sends
            return [], []
        self._nak_sent_for = self.expected_psn
        return [Packet(Op.NAK_SEQ, self.expected_psn, self.dest_qpn)], []

    def reset(self, psn: int) -> None:
        self.expected_psn = psn & PSN_MASK
        self.state = QpState.RTS
        self._nak_sent_for = None


def _psn_before(a: int, b: int) -> bool:
    """a precedes b in 24-bit PSN space (within half the space)."""
    return a != b and ((b - a) & PSN_MASK) < (1 << 23)


def _psn_le(a: int, b: int) -> bool:
    return a == b or _psn_before(a, b)
