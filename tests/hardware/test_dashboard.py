"""Against a real lab (`--lab INVENTORY`): the dashboard beside a real scheduler. `labctl serve --http
127.0.0.1:0` runs a short experiment from its queue on the lab; the queue page shows the job, its live
stream reaches the run's end with every moved port's marks through t5 (carrier and traffic, as the lab's
probes observe them), and the history lists the run and serves its page, figures and report. Only the
ports the inventory's NICs use are patched, and the baseline is put back at the end as by `labctl run`."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.dashboard import Served, read_stream, serve_http, wait_until_done

pytestmark = pytest.mark.hardware

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 300.0  # the scheduler's first poll, the worker's start and the lab's set-up


@pytest.fixture
def served(lab_path: Path, tmp_path: Path) -> Iterator[Served]:
    experiment = tmp_path / "short.yaml"
    experiment.write_text(
        (REPO / "experiments" / "reconfig-timeline.yaml").read_text().replace("repeat: 2", "repeat: 1")
    )
    yield from serve_http(tmp_path / "serve", job=(experiment, lab_path, ()))


def _run_of_the_job(served: Served) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        view = served.queue()
        run = next((j["run"] for j in view["jobs"] + view["done"] if j["run"]), None)
        if run is not None:
            return str(run)
        assert served.proc.poll() is None, f"serve exited ({served.proc.returncode}) before the job started"
        time.sleep(0.1)
    raise AssertionError("the job never started")


def test_the_dashboard_follows_a_run_on_the_lab(served: Served) -> None:
    status, _, page = served.get("/queue")
    assert status == 200 and b"dash" in page
    run = _run_of_the_job(served)
    events = read_stream(served.url + f"live/{run}/stream", timeout_s=900)
    assert events and events[-1][0] == "end", events[-3:]
    end = events[-1][1]
    assert end["status"] == "completed", end
    last = [data for event, data in events if event == "state"][-1]
    assert last["status"] == "completed" and last["reconfig"] + 1 == last["total"]
    assert last["ports"] and all({"t0", "t4", "t5"} <= set(p["marks"]) for p in last["ports"]), last["ports"]
    assert wait_until_done(served, timeout_s=300)["state"] == "completed"
    status, _, body = served.get("/api/runs")
    assert status == 200 and {(r["dir"], r["status"]) for r in json.loads(body)} == {(run, "completed")}
    status, _, page = served.get(f"/runs/{run}")
    assert status == 200 and b"completed" in page
    for figure in ("headline.png", "timeline.png", "distributions.png"):
        status, kind, data = served.get(f"/runs/{run}/files/{figure}")
        assert (status, kind) == (200, "image/png") and data.startswith(b"\x89PNG"), figure
    status, _, text = served.get(f"/runs/{run}/report.txt")
    assert status == 200 and b"status: completed" in text
