"""`probes.transport: rdma` on the simulated lab: the RC rules over the NIC model. t5 comes from the RC
transport and the transport phase is bounded by the local ACK timeout; other labs without it refuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labctl.analysis.breakdown_table import read_breakdown_csv
from labctl.core.errors import InputError
from labctl.run.lifecycle import run_experiment
from tests.conftest import REPO


def _experiment(tmp_path: Path, rdma: str) -> Path:
    text = (
        (REPO / "experiments" / "reconfig-timeline.yaml")
        .read_text()
        .replace("repeat: 2 ", "repeat: 1 ")
        .replace("hold_s: 0.5 ", "hold_s: 0.1 ")
        .replace("  transport: udp ", f"  rdma: {rdma}\n  transport: rdma ")
    )
    path = tmp_path / "rdma.yaml"
    path.write_text(text)
    return path


async def test_the_simulated_lab_measures_rdma_recovery_within_one_ack_timeout(tmp_path: Path) -> None:
    # fast profile: dark ~2-3 ms, firmware 40-60 ms, so ~65 ms without a link; timeout 12 (16.8 ms): the last
    # of 7 retries at 117 ms rides through, and the SEND comes back at most one period after the link did.
    outcome = await run_experiment(
        _experiment(tmp_path, "{timeout: 12, retry_cnt: 7}"),
        REPO / "inventory.yaml",
        profile="fast",
        out_dir=tmp_path / "runs",
        plots=False,
        seed=2,
    )
    assert outcome.status == "completed", outcome.error
    frame = read_breakdown_csv(outcome.run_dir / "breakdown.csv")
    rows = frame[frame["reconfig"] > 0]
    assert (rows["transport"] == "rdma").all() and rows["t5_traffic_ns"].notna().all()
    period = 4096 << 12
    # transport = t5 - t4. The model brings transport up 10-20 ms after carrier (fast profile); the RC
    # retries bracket that moment: the try before the SEND that got through went out no later than it (or
    # it would have got through), so each bracket starts by t4 + 20 ms (+ a ping interval). How long after
    # it the next try went is one RC period when the host runs the retry timer on time, more on a busy
    # host: that widens the bracket (t5's resolution), it does not move the bracket's start.
    assert (rows["transport_ns"] >= 0).all()
    start = rows["t5_traffic_ns"] - rows["t5_resolution_ns"]
    late = start > rows["t4_carrier_up_ns"] + 20_000_000 + 2_000_000
    cols = ["t4_carrier_up_ns", "t5_traffic_ns", "transport_ns", "t5_resolution_ns", "t5_source"]
    assert not late.any(), rows.loc[late, [c for c in cols if c in rows]].to_string()
    assert (rows["t5_resolution_ns"] > 0).all() and (rows["t5_resolution_ns"] >= period // 2).any()
    stats = json.loads((outcome.run_dir / "run.json").read_text())["probes"]["model-rc-traffic"]
    assert stats["errors"] == 0 and stats["qp_timeout"] == 12
    assert summary_flagged(outcome.run_dir) == 0


def summary_flagged(run_dir: Path) -> int:
    return int(json.loads((run_dir / "summary.json").read_text())["flagged_rows"])


async def test_a_lab_without_the_rc_transport_refuses_it_in_one_line(tmp_path: Path) -> None:
    inventory = (
        (REPO / "inventory.yaml").read_text().replace("lab: opus-testbed", "lab: opus-testbed\nkind: agents")
    )
    inventory += "\nbroker: {url: mqtt://127.0.0.1:1}\n"
    inv = tmp_path / "agents.yaml"
    inv.write_text(inventory)
    with pytest.raises(InputError, match=r"probes\.transport: 'rdma' is not available on lab kind agents"):
        await run_experiment(
            _experiment(tmp_path, "{timeout: 12}"),
            inv,
            profile="fast",
            out_dir=tmp_path / "runs",
            plots=False,
        )


async def test_a_wire_of_the_nic_model_delivers_rc_packets_in_the_order_they_were_sent() -> None:
    """Each packet's delay is drawn on its own; a go-back-N burst must still arrive in PSN order, or the
    responder would read sequence errors that spend the requester's retries (seen under load as a QP in
    RETRY_EXC right after its link came back)."""
    import asyncio
    import random
    from collections import namedtuple
    from types import SimpleNamespace

    from labctl.probes.model import ModelCarrier
    from labctl.rdma.rc import Op, Packet

    port = namedtuple("port", "source")
    a, b = port("nic:h1/p0"), port("nic:h2/p0")
    draws = random.Random(7)
    fabric = SimpleNamespace(
        port_at=[a, b],
        slot={a: 0, b: 1},
        passes=lambda *_: True,
        rtt_ns=lambda: draws.randrange(20_000, 4_000_000),  # 10 µs to 2 ms one way
    )
    carrier = ModelCarrier(fabric)  # type: ignore[arg-type]
    arrived: list[tuple[str, int]] = []
    done = asyncio.Event()

    def deliver(at: str, remote: str, packet: Packet, t_ns: int) -> None:
        arrived.append((at, packet.psn))
        if len(arrived) == 120:
            done.set()

    await carrier.open(deliver)
    try:
        carrier.send(a.source, b.source, [Packet(Op.SEND, psn, 1, b"") for psn in range(50)])
        carrier.send(b.source, a.source, [Packet(Op.ACK, psn, 2, b"") for psn in range(20)])
        carrier.send(a.source, b.source, [Packet(Op.SEND, psn, 1, b"") for psn in range(50, 100)])
        await asyncio.wait_for(done.wait(), 10)
    finally:
        carrier.close()
    assert [psn for at, psn in arrived if at == b.source] == list(range(100))
    assert [psn for at, psn in arrived if at == a.source] == list(range(20))
