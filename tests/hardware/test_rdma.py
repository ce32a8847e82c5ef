"""Against a real RoCE/InfiniBand lab (`--lab INVENTORY`, every NIC port with `rdma: {device, port,
gid_index}`, the agents able to open /dev/infiniband/uverbs*): the reconfiguration timeline with
`probes.transport: rdma`, the agents running the verbs-rc probe on the lab's ports. t5 then comes from the
RC ping-pong, and at the default QP attributes (timeout 14, retry_cnt 7) no QP may error.

Never run here: the machine this was written on has no RDMA device (tests/integration/test_rdma_verbs_rc.py runs
the probe's logic on the QP model)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from labctl.core.events import Kind, read_events
from labctl.inventory.schema import Inventory
from labctl.run.lifecycle import run_experiment

pytestmark = pytest.mark.hardware

REPO = Path(__file__).resolve().parents[2]


def _rdma_experiment(tmp_path: Path, rdma: str = "{policy: reconnect}") -> Path:
    text = (
        (REPO / "experiments" / "reconfig-timeline.yaml")
        .read_text()
        .replace("repeat: 2 ", "repeat: 1 ")
        .replace("  transport: udp ", f"  rdma: {rdma}\n  transport: rdma ")
    )
    assert "transport: rdma" in text, "experiments/reconfig-timeline.yaml changed shape"
    path = tmp_path / "rdma.yaml"
    path.write_text(text)
    return path


async def test_the_verbs_rc_probe_marks_t5_on_the_labs_ports(
    lab: Inventory, lab_path: Path, tmp_path: Path
) -> None:
    missing = [port.label for port in lab.ports if port.rdma is None]
    if missing:
        pytest.skip(
            f"the lab's ports have no `rdma:` keys ({', '.join(missing[:3])}, ...): see docs/how-to/rdma.md"
        )
    outcome = await run_experiment(
        _rdma_experiment(tmp_path), lab_path, out_dir=tmp_path / "runs", plots=False
    )
    assert outcome.status == "completed", outcome.error
    rows = pd.read_csv(outcome.run_dir / "breakdown.csv")
    rows = rows[rows.reconfig > 0]
    assert len(rows) > 0 and not rows.timed_out.any()
    assert (rows["transport"] == "rdma").all() and rows["t5_traffic_ns"].notna().all()
    events = list(read_events(outcome.run_dir / "events.jsonl"))
    ok = [e for e in events if e.kind == Kind.TRAFFIC_OK]
    assert ok and all(e.meta.get("transport") == "rc" and e.meta.get("qp") == "verbs" for e in ok)
    errors = [e for e in events if e.kind == Kind.RDMA_WC_ERROR]
    assert not errors, f"QPs errored at the default attributes: {errors[:3]}"
    assert "verbs-rc" in json.dumps(json.loads((outcome.run_dir / "run.json").read_text()).get("probes", {}))
