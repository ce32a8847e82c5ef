"""The RC reliability rules (labctl.rdma.rc) driven with explicit times: what decides whether a queue pair
rides through a dark gap, and what it looks like when it does not."""

from __future__ import annotations

import pytest

from labctl.rdma.rc import (
    PSN_MASK,
    Op,
    Packet,
    QpAttrs,
    QpState,
    Requester,
    Responder,
    WcStatus,
    rnr_wait_ns,
)

US = 1_000


def pair(attrs: QpAttrs | None = None, psn: int = 0) -> tuple[Requester, Responder]:
    attrs = attrs or QpAttrs()
    req = Requester(qpn=1, dest_qpn=2, attrs=attrs, psn=psn)
    resp = Responder(qpn=2, dest_qpn=1, attrs=attrs, expected_psn=psn)
    resp.post_recv(100)
    return req, resp


def test_the_ack_timeout_and_retry_budget_follow_the_spec() -> None:
    assert QpAttrs(timeout=14).ack_timeout_ns == 4096 * 2**14  # 67.1 ms
    assert QpAttrs(timeout=14, retry_cnt=7).retry_budget_ns == 8 * 4096 * 2**14  # ~0.54 s
    assert QpAttrs(timeout=0).ack_timeout_ns is None
    assert rnr_wait_ns(12) == 640 * US and rnr_wait_ns(0) == 655_360 * US and rnr_wait_ns(1) == 10 * US
    with pytest.raises(ValueError, match="retry_cnt 8"):
        QpAttrs(retry_cnt=8)


def test_a_send_is_delivered_once_and_completes_on_its_ack() -> None:
    req, resp = pair()
    (pkt,), _ = req.send(7, b"ping", 0)
    acks, delivered = resp.receive(pkt)
    assert delivered == [b"ping"] and acks[0].op is Op.ACK
    packets, done = req.receive(acks[0], 10 * US)
    assert packets == [] and [(c.wr_id, c.status) for c in done] == [(7, WcStatus.SUCCESS)]
    assert req.next_deadline() is None
    # The same packet again (a retransmission that crossed the ACK): acknowledged, not delivered twice.
    again, delivered = resp.receive(pkt)
    assert delivered == [] and again[0].op is Op.ACK


def test_a_lost_packet_is_sent_again_after_the_local_ack_timeout() -> None:
    attrs = QpAttrs(timeout=10, retry_cnt=3)
    req, resp = pair(attrs)
    req.send(1, b"a", 0)  # lost in the dark gap
    deadline = req.next_deadline()
    assert deadline == attrs.ack_timeout_ns
    assert req.poll_timers(deadline - 1) == ([], [])  # not yet
    (retry,), _ = req.poll_timers(deadline)
    assert retry.psn == 0 and req.retries_left == 2 and req.retransmissions == 1
    acks, _ = resp.receive(retry)
    _, done = req.receive(acks[0], deadline + 5 * US)
    assert done[0].status is WcStatus.SUCCESS and req.retries_left == 3  # progress refills the budget


def test_a_gap_longer_than_the_retry_budget_errors_the_qp_and_flushes_the_rest() -> None:
    attrs = QpAttrs(timeout=10, retry_cnt=2)
    req, _ = pair(attrs)
    req.send(1, b"a", 0)
    req.send(2, b"b", 1 * US)
    t, sends = 0, 1
    while req.state is QpState.RTS:
        t = req.next_deadline()  # type: ignore[assignment]
        packets, done = req.poll_timers(t)
        sends += bool(packets)
    assert sends == attrs.retry_cnt + 1  # the first try and every retry
    assert t == attrs.retry_budget_ns  # errors exactly when the budget is spent
    assert [(c.wr_id, c.status) for c in done] == [(1, WcStatus.RETRY_EXC_ERR), (2, WcStatus.WR_FLUSH_ERR)]
    assert req.state is QpState.ERR and req.next_deadline() is None
    _, flushed = req.send(3, b"c", t)  # posting to a QP in error completes at once, flushed
    assert flushed[0].status is WcStatus.WR_FLUSH_ERR


def test_reset_with_fresh_psns_recovers_the_qp() -> None:
    req, resp = pair(QpAttrs(timeout=1, retry_cnt=0))
    req.send(1, b"a", 0)
    req.poll_timers(req.next_deadline())  # type: ignore[arg-type]
    assert req.state is QpState.ERR
    req.reset(psn=1000)
    resp.reset(psn=1000)
    (pkt,), _ = req.send(2, b"again", 10_000)
    assert pkt.psn == 1000
    acks, delivered = resp.receive(pkt)
    _, done = req.receive(acks[0], 20_000)
    assert delivered == [b"again"] and done[0].status is WcStatus.SUCCESS


def test_a_gap_in_psns_gets_one_sequence_nak_and_an_immediate_resend() -> None:
    req, resp = pair()
    req.send(1, b"a", 0)  # lost in the dark gap
    (second,), _ = req.send(2, b"b", 1 * US)
    naks, delivered = resp.receive(second)
    assert delivered == [] and naks[0].op is Op.NAK_SEQ and naks[0].psn == 0
    assert resp.receive(second) == ([], [])  # one NAK per gap
    resent, done = req.receive(naks[0], 5 * US)
    assert [p.psn for p in resent] == [0, 1] and done == [] and req.retries_left == QpAttrs().retry_cnt - 1
    for pkt in resent:
        acks, _ = resp.receive(pkt)
        _, done = req.receive(acks[0], 10 * US)
    assert resp.expected_psn == 2 and not req.outstanding


def test_receiver_not_ready_waits_the_rnr_timer_then_gives_up_after_rnr_retry() -> None:
    attrs = QpAttrs(rnr_retry=2, min_rnr_timer=14)  # 1.28 ms
    req, resp = pair(attrs)
    resp.receives_posted = 0
    (pkt,), _ = req.send(1, b"a", 0)
    t = 0
    for _ in range(attrs.rnr_retry):
        (nak,), _ = resp.receive(pkt)
        assert nak.op is Op.NAK_RNR and nak.rnr_timer == 14
        req.receive(nak, t)
        assert req.next_deadline() == t + 1_280 * US
        t = req.next_deadline()  # type: ignore[assignment]
        (pkt,), _ = req.poll_timers(t)
    (nak,), _ = resp.receive(pkt)
    _, done = req.receive(nak, t)
    assert done[0].status is WcStatus.RNR_RETRY_EXC_ERR and req.state is QpState.ERR


def test_psns_wrap_at_24_bits() -> None:
    req, resp = pair(psn=PSN_MASK)
    (a,), _ = req.send(1, b"a", 0)
    (b,), _ = req.send(2, b"b", 0)
    assert (a.psn, b.psn) == (PSN_MASK, 0)
    for pkt in (a, b):
        acks, _ = resp.receive(pkt)
        _, done = req.receive(acks[0], 1)
        assert done[0].status is WcStatus.SUCCESS
    assert resp.expected_psn == 1


def test_an_ack_for_another_qp_is_ignored() -> None:
    req, _ = pair()
    req.send(1, b"a", 0)
    assert req.receive(Packet(Op.ACK, 0, qpn=99), 1) == ([], [])
    assert len(req.outstanding) == 1
