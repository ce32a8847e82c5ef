"""What the verbs-rc probe needs of an RC queue pair, whatever is behind it: a real one through pyverbs
(labctl.rdma.verbs.VerbsQp) or a behaviour model built on the IB RC rules (labctl.rdma.model.ModelQp).

The probe's logic (ping-pong, loss, error, reconnect) is written once against `RcQp`; the tests drive it
with the model, a RoCE lab with the NIC. Both stamp a completion when it is polled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from labctl.rdma.oob import QpInfo

RECV_TAG = 1 << 62
"""Set in a receive's wr_id: an error completion's opcode is undefined in verbs, so the wr_id is what tells a
flushed receive from a failed send."""

SUCCESS = "IBV_WC_SUCCESS"
WR_FLUSH_ERR = "IBV_WC_WR_FLUSH_ERR"


@dataclass(frozen=True, slots=True)
class WorkCompletion:
    """One polled work completion."""

    wr_id: int
    status: str
    """As verbs names it: IBV_WC_SUCCESS, IBV_WC_RETRY_EXC_ERR, ..."""
    t_ns: int
    """When it was polled (CLOCK_MONOTONIC ns)."""
    payload: bytes = b""
    """A successful receive's message."""

    @property
    def is_recv(self) -> bool:
        return bool(self.wr_id & RECV_TAG)

    @property
    def ok(self) -> bool:
        return self.status == SUCCESS


class RcQp(Protocol):
    """One end of an RC connection. Not thread-safe: the caller serializes calls on one QP."""

    def open(self) -> QpInfo:
        """Create the QP, move it to INIT and post its receives; what the peer needs to connect to it."""
        ...

    def connect(self, remote: QpInfo) -> None:
        """INIT → RTR → RTS toward `remote`."""
        ...

    def reset(self) -> QpInfo:
        """Any state → RESET → INIT with a fresh starting PSN and the receives posted again (what is left in
        the completion queue is dropped); what the peer needs to connect to it again."""
        ...

    def post_send(self, wr_id: int, payload: bytes) -> int:
        """Post one signaled SEND of `payload`; returns its post time (ns), stamped just before the post."""
        ...

    def poll(self, n: int = 16) -> list[WorkCompletion]:
        """The completions ready now (at most n), each stamped at this poll. A receive that completed is
        posted again at once, so this end never answers RNR."""
        ...

    def close(self) -> None: ...


class QpFactory(Protocol):
    """Where a probe's queue pairs come from."""

    def check(self, sources: list[str]) -> None:
        """One line (labctl.core.errors.LabctlError) if QPs for these ports cannot be opened here: no pyverbs,
        no RDMA device, the inventory's device not on this host."""
        ...

    def make(self, local: str, peer: str) -> RcQp:
        """A new (unopened) QP on port `local` for the connection to port `peer`."""
        ...
