"""One RC queue pair on a real RDMA port through pyverbs, the way rdma-core's tests and perftest's
`ib_send_lat` drive one: device → PD → CQ → MR → QP (INIT), the out-of-band exchange (labctl.rdma.oob),
RTR → RTS with the experiment's QP attributes, then SEND/RECV ping-pong, every completion stamped where it
is polled. Needs pyverbs (labctl.rdma.compat) and an RDMA device; without one `open()` is one line.
Its interface is labctl.rdma.qp.RcQp, which the verbs-rc probe drives (and the tests drive with a model).

Not exercised here: this machine has no RDMA device (no soft-RoCE in its kernel). What runs in CI: the
QP attributes and address handle built by the real module (`rts_attr`), and the no-device error.
"""

from __future__ import annotations

import ipaddress
import random
from dataclasses import dataclass, field
from typing import Any

from labctl.core.clock import now_ns
from labctl.inventory.schema import RdmaPortSpec
from labctl.rdma.compat import RdmaUnavailable, Verbs, devices, load
from labctl.rdma.oob import QpInfo
from labctl.rdma.qp import RECV_TAG, SUCCESS, WorkCompletion
from labctl.rdma.rc import QpAttrs

MTU = "IBV_MTU_1024"


def ipv4_gid(address: str) -> str:
    """The RoCE v2 GID of an IPv4 address (::ffff:a.b.c.d), written out as verbs prints GIDs."""
    mapped = ipaddress.IPv6Address(f"::ffff:{ipaddress.IPv4Address(address.split('/')[0])}")
    return ":".join(f"{int(mapped.packed[i : i + 2].hex(), 16):04x}" for i in range(0, 16, 2))


def rts_attr(verbs: Verbs, port: RdmaPortSpec, attrs: QpAttrs, remote: QpInfo, sq_psn: int) -> Any:
    """The QPAttr that takes a QP from INIT through RTR to RTS toward `remote`: path, PSNs, and the
    attributes that shape recovery (timeout, retry_cnt, rnr_retry, min_rnr_timer)."""
    qp, addr = verbs.module("qp"), verbs.module("addr")
    attr = qp.QPAttr(port_num=port.port)
    attr.path_mtu = verbs.const(MTU)
    attr.dest_qp_num = remote.qpn
    attr.rq_psn = remote.psn
    attr.sq_psn = sq_psn
    attr.max_dest_rd_atomic = 1
    attr.max_rd_atomic = 1
    attr.min_rnr_timer = attrs.min_rnr_timer
    attr.timeout = attrs.timeout
    attr.retry_cnt = attrs.retry_cnt
    attr.rnr_retry = attrs.rnr_retry
    if remote.gid:  # RoCE (and IB across subnets): a global route to the peer's GID
        route = addr.GlobalRoute(dgid=addr.GID(remote.gid), sgid_index=port.gid_index)
        attr.ah_attr = addr.AHAttr(port_num=port.port, is_global=1, gr=route, dlid=remote.lid)
    else:
        attr.ah_attr = addr.AHAttr(port_num=port.port, is_global=0, dlid=remote.lid)
    return attr


@dataclass
class VerbsQp:
    """An RC QP (labctl.rdma.qp.RcQp) with `depth` receive buffers of `size` bytes posted, and as many send
    buffers beside them in the same MR."""

    verbs: Verbs
    port: RdmaPortSpec
    attrs: QpAttrs
    depth: int = 64
    size: int = 64
    psn: int = field(default_factory=lambda: random.randrange(1 << 24))
    _objects: dict[str, Any] = field(default_factory=dict)
    _wr_send: int = 0  # verbs constants, looked up once at open (not per post)
    _send_flags: int = 0
    _sends: int = 0  # rotates the send buffers: a ping and a pong may be in flight together
    _gid: str = ""
    _lid: int = 0

    def open(self) -> QpInfo:
        """Open the device and create the QP (INIT); what the peer needs to connect to it."""
        names = devices(self.verbs)  # RdmaUnavailable in one line where there is none
        if self.port.device not in names:
            raise RdmaUnavailable(f"RDMA device {self.port.device!r} not found (here: {', '.join(names)})")
        v = self.verbs
        device, pd, cq, mr, qp = (v.module(m) for m in ("device", "pd", "cq", "mr", "qp"))
        objects = self._objects
        try:  # each object kept as soon as it exists, so a failure half way closes what was made
            objects["ctx"] = ctx = device.Context(name=self.port.device)
            objects["pd"] = pd_ = pd.PD(ctx)
            objects["cq"] = cq_ = cq.CQ(ctx, 4 * self.depth, None, None, 0)
            access = v.const("IBV_ACCESS_LOCAL_WRITE") | v.const("IBV_ACCESS_REMOTE_WRITE")
            objects["mr"] = mr.MR(pd_, 2 * self.size * self.depth, access)
            cap = qp.QPCap(max_send_wr=self.depth, max_recv_wr=self.depth, max_send_sge=1, max_recv_sge=1)
            init = qp.QPInitAttr(qp_type=v.const("IBV_QPT_RC"), scq=cq_, rcq=cq_, cap=cap)
            objects["qp"] = qp.QP(pd_, init, qp.QPAttr(port_num=self.port.port))  # RC: returned in INIT
            self._wr_send = v.const("IBV_WR_SEND")
            self._send_flags = v.const("IBV_SEND_SIGNALED")
            self._gid = str(ctx.query_gid(self.port.port, self.port.gid_index))
            self._lid = int(ctx.query_port(self.port.port).lid)
            self._post_receives()
        except BaseException:
            self.close()
            raise
        return self._info()

    def _info(self) -> QpInfo:
        mr_ = self._objects["mr"]
        return QpInfo(
            qpn=int(self._objects["qp"].qp_num),
            psn=self.psn,
            gid=self._gid,
            lid=self._lid,
            addr=int(mr_.buf),
            rkey=int(mr_.rkey),
        )

    def _post_receives(self) -> None:
        for slot in range(self.depth):
            self.post_recv(slot)

    def connect(self, remote: QpInfo) -> None:
        """RTR → RTS toward `remote` (after the out-of-band exchange)."""
        self._objects["qp"].to_rts(rts_attr(self.verbs, self.port, self.attrs, remote, self.psn))

    def reset(self) -> QpInfo:
        """RESET → INIT with a fresh PSN, the completion queue drained and the receives posted again."""
        v, qp_ = self.verbs, self._objects["qp"]
        qp_mod = v.module("qp")
        qp_.modify(qp_mod.QPAttr(qp_state=v.const("IBV_QPS_RESET")), v.const("IBV_QP_STATE"))
        while self._objects["cq"].poll(self.depth)[0] > 0:  # what the old connection left behind
            pass
        qp_.to_init(qp_mod.QPAttr(port_num=self.port.port))
        self.psn = random.randrange(1 << 24)
        self._post_receives()
        return self._info()

    def _sge(self, slot: int) -> Any:
        mr = self._objects["mr"]
        return self.verbs.module("wr").SGE(mr.buf + slot * self.size, self.size, mr.lkey)

    def post_recv(self, slot: int) -> None:
        wr = self.verbs.module("wr").RecvWR(wr_id=RECV_TAG | slot, num_sge=1, sg=[self._sge(slot)])
        self._objects["qp"].post_recv(wr)

    def post_send(self, wr_id: int, payload: bytes) -> int:
        """Post one signaled SEND of `payload` (at most `size` bytes); returns its post time (ns), stamped
        just before the post, as perftest does."""
        slot = self.depth + self._sends % self.depth
        self._sends += 1
        mr = self._objects["mr"]
        mr.write(payload, len(payload), slot * self.size)
        sge = self.verbs.module("wr").SGE(mr.buf + slot * self.size, len(payload), mr.lkey)
        wr = self.verbs.module("wr").SendWR(
            wr_id=wr_id, opcode=self._wr_send, num_sge=1, sg=[sge], send_flags=self._send_flags
        )
        t = now_ns()
        self._objects["qp"].post_send(wr)
        return t

    def poll(self, n: int = 16) -> list[WorkCompletion]:
        """Completions ready now, stamped at this poll. A receive that completed is posted again at once,
        so the responder never runs dry (an RNR NAK would then be ours)."""
        count, wcs = self._objects["cq"].poll(n)
        t = now_ns()
        out = []
        for wc in wcs[:count]:
            wr_id = int(wc.wr_id)
            status = self.verbs.wc_status_name(int(wc.status))
            payload = b""
            if wr_id & RECV_TAG and status == SUCCESS:
                slot = wr_id & ~RECV_TAG
                payload = bytes(self._objects["mr"].read(int(wc.byte_len), slot * self.size))
                self.post_recv(slot)
            out.append(WorkCompletion(wr_id, status, t, payload))
        return out

    def close(self) -> None:
        for name in ("qp", "mr", "cq", "pd", "ctx"):  # children before their parents
            obj = self._objects.pop(name, None)
            if obj is not None:
                obj.close()


class VerbsQpFactory:
    """QPs through pyverbs on the ports' inventory devices (labctl.rdma.qp.QpFactory)."""

    def __init__(self, ports: dict[str, RdmaPortSpec], attrs: QpAttrs, verbs: Verbs | None = None) -> None:
        self.ports = ports
        self.attrs = attrs
        self.verbs = verbs

    def check(self, sources: list[str]) -> None:
        verbs = self.verbs or load()  # PyverbsMissing in one line
        names = devices(verbs)  # RdmaUnavailable in one line
        for source in sources:
            device = self.ports[source].device
            if device not in names:
                raise RdmaUnavailable(
                    f"{source}: RDMA device {device!r} not on this host (here: {', '.join(names)}; "
                    "ibv_devices / rdma link show name them)"
                )
        self.verbs = verbs

    def make(self, local: str, peer: str) -> VerbsQp:
        if self.verbs is None:
            self.check([local])
        assert self.verbs is not None
        return VerbsQp(self.verbs, self.ports[local], self.attrs)
