"""The UDP traffic probe's timeout judges the link, not the prober: an answer that arrived while the probe's
own loop was stalled is read before any ping is called lost.

After a stall the loop finds the timer and the socket ready at once and may run the timer first. Before the
fix, every circuit of a starved agent was called lost at each stall and ok again at the next ping: on a
saturated machine that flapping flooded the agents' streams (105k `traffic.lost` in one rehearsal run),
which then reached the controller past the recovery timeout. Real sockets on loopback, the probe's own
calls in the order the loop may make them (no event loop: the order is the point, not the timing).
"""

from __future__ import annotations

import select
import socket
import time

from labctl.core.events import Kind
from labctl.probes.traffic import TrafficEndpoint, UdpTrafficProbe

A = TrafficEndpoint("nic:h1/p0", "127.0.0.2", "lo", None, "h1")
B = TrafficEndpoint("nic:h2/p0", "127.0.0.3", "lo", None, "h2")
TIMEOUT_US = 2000


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _readable(sock: socket.socket) -> None:
    ready, _, _ = select.select([sock], [], [], 5.0)
    assert ready, "nothing arrived on loopback within 5 s"


def _stalled_past_the_timeout(probe: UdpTrafficProbe) -> None:
    """a pings b, b answers, and a's loop does not run until the ping is past its timeout."""
    probe._tick(1)  # the ping goes out
    _readable(probe._socks[B.source])
    probe._readable(B.source, probe._socks[B.source])  # b's reader answers it
    _readable(probe._socks[A.source])  # the answer waits in a's buffer
    time.sleep(2 * TIMEOUT_US / 1e6)  # a's loop stalled: longer only makes the ping older


def test_an_answer_waiting_in_the_buffer_is_read_before_a_ping_is_called_lost() -> None:
    probe = UdpTrafficProbe([A, B], interval_us=1000, timeout_us=TIMEOUT_US, port=_free_udp_port())
    probe._open()
    try:
        probe.set_circuits({A.source: B.source})
        _stalled_past_the_timeout(probe)
        probe._tick(1)  # the timer runs first, as it may after a stall
        events = probe.queue.drain()
        assert probe.lost == 0 and probe.late == 0 and probe.pongs == 1, events
        assert [e.kind for e in events] == [Kind.TRAFFIC_OK], events
        # The answer is stamped when it was read (where it was observed), so its RTT holds the stall.
        assert events[0].value is not None and events[0].value >= TIMEOUT_US * 1000
    finally:
        for sock in probe._socks.values():
            sock.close()


def test_a_ping_no_one_answers_is_lost_at_its_timeout() -> None:
    probe = UdpTrafficProbe([A, B], interval_us=1000, timeout_us=TIMEOUT_US, port=_free_udp_port())
    probe._open()
    try:
        probe.set_circuits({A.source: B.source})
        probe._tick(1)  # b's reader never runs: no answer
        _readable(probe._socks[B.source])
        time.sleep(2 * TIMEOUT_US / 1e6)
        probe._tick(1)
        events = probe.queue.drain()
        assert probe.lost == 1 and probe.pongs == 0, events
        assert [e.kind for e in events] == [Kind.TRAFFIC_LOST], events
    finally:
        for sock in probe._socks.values():
            sock.close()
