"""One RC queue pair on a real RDMA port through pyverbs, the way rdma-core's tests and perftest's
`ib_send_lat` drive one: device → PD → CQ → MR → QP (INIT), the out-of-band exchange (labctl.rdma.oob),
RTR → RTS with the experiment's QP attributes, then SEND/RECV ping-pong, every completion stamped where it
is polled. Needs pyverbs (labctl.rdma.compat) and an RDMA device; without one `open()` is one line.

Not exercised here: this machine has no RDMA device (no soft-RoCE in its kernel). What runs in CI: the
QP attributes and address handle built by the real module (`rts_attr`), and the no-device error.
"""

from __future__ import annotations

import ipaddress
import random
from dataclasses import dataclass, field
from typing import Any

from labctl.clock import now_ns
from labctl.inventory import RdmaPortSpec
from labctl.rdma.compat import Verbs, devices
from labctl.rdma.oob import QpInfo
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
    """An RC QP with `depth` receive buffers of `size` bytes posted."""

    verbs: Verbs
    port: RdmaPortSpec
    attrs: QpAttrs
    depth: int = 64
    size: int = 64
    psn: int = field(default_factory=lambda: random.randrange(1 << 24))
    _objects: dict[str, Any] = field(default_factory=dict)
    _wr_send: int = 0  # verbs constants, looked up once at open (not per post)
    _wc_recv: int = 0

    def open(self) -> QpInfo:
        """Open the device and create the QP (INIT); what the peer needs to connect to it."""
        names = devices(self.verbs)  # RdmaUnavailable in one line where there is none
        if self.port.device not in names:
            from labctl.rdma.compat import RdmaUnavailable

            raise RdmaUnavailable(f"RDMA device {self.port.device!r} not found (here: {', '.join(names)})")
        v = self.verbs
        device, pd, cq, mr, qp = (v.module(m) for m in ("device", "pd", "cq", "mr", "qp"))
        objects = self._objects
        try:  # each object kept as soon as it exists, so a failure half way closes what was made
            objects["ctx"] = ctx = device.Context(name=self.port.device)
            objects["pd"] = pd_ = pd.PD(ctx)
            objects["cq"] = cq_ = cq.CQ(ctx, 2 * self.depth, None, None, 0)
            access = v.const("IBV_ACCESS_LOCAL_WRITE") | v.const("IBV_ACCESS_REMOTE_WRITE")
            objects["mr"] = mr_ = mr.MR(pd_, self.size * self.depth, access)
            cap = qp.QPCap(max_send_wr=self.depth, max_recv_wr=self.depth, max_send_sge=1, max_recv_sge=1)
            init = qp.QPInitAttr(qp_type=v.const("IBV_QPT_RC"), scq=cq_, rcq=cq_, cap=cap)
            objects["qp"] = qp_ = qp.QP(pd_, init, qp.QPAttr(port_num=self.port.port))
            self._wr_send = v.const("IBV_WR_SEND")
            self._wc_recv = v.const("IBV_WC_RECV")
            gid = str(ctx.query_gid(self.port.port, self.port.gid_index))
            lid = int(ctx.query_port(self.port.port).lid)
            for i in range(self.depth):
                self.post_recv(i)
        except BaseException:
            self.close()
            raise
        return QpInfo(
            qpn=int(qp_.qp_num), psn=self.psn, gid=gid, lid=lid, addr=int(mr_.buf), rkey=int(mr_.rkey)
        )

    def connect(self, remote: QpInfo) -> None:
        """RTR → RTS toward `remote` (after the out-of-band exchange)."""
        self._objects["qp"].to_rts(rts_attr(self.verbs, self.port, self.attrs, remote, self.psn))

    def _sge(self, slot: int) -> Any:
        mr = self._objects["mr"]
        return self.verbs.module("wr").SGE(mr.buf + (slot % self.depth) * self.size, self.size, mr.lkey)

    def post_recv(self, wr_id: int) -> None:
        wr = self.verbs.module("wr").RecvWR(wr_id=wr_id, num_sge=1, sg=[self._sge(wr_id)])
        self._objects["qp"].post_recv(wr)

    def post_send(self, wr_id: int) -> int:
        """Post one SEND; returns its post time (ns), stamped just before the post, as perftest does."""
        wr = self.verbs.module("wr").SendWR(
            wr_id=wr_id, opcode=self._wr_send, num_sge=1, sg=[self._sge(wr_id)]
        )
        t = now_ns()
        self._objects["qp"].post_send(wr)
        return t

    def poll(self, n: int = 16) -> list[tuple[int, str, int, int]]:
        """Completions ready now: (wr_id, status name, opcode, poll time ns). A receive that completed is
        posted again at once, so the responder never runs dry (an RNR NAK would then be ours)."""
        count, wcs = self._objects["cq"].poll(n)
        t = now_ns()
        out = []
        for wc in wcs[:count]:
            status = self.verbs.wc_status_name(int(wc.status))
            out.append((int(wc.wr_id), status, int(wc.opcode), t))
            if int(wc.opcode) & self._wc_recv and status == "IBV_WC_SUCCESS":
                self.post_recv(int(wc.wr_id))
        return out

    def close(self) -> None:
        for name in ("qp", "mr", "cq", "pd", "ctx"):  # children before their parents
            obj = self._objects.pop(name, None)
            if obj is not None:
                obj.close()
