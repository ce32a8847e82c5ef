"""The dashboard against a real `labctl serve --http 127.0.0.1:0` running a real fast experiment on the
simulated lab: the queue shows the job, the live stream reaches `completed` with every port's t5, the
history lists the run and serves its figures; the token and path rules hold; a non-loopback address without
a token exits 2 with one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.dashboard import Served, read_stream, serve_http, wait_until_done
from tests.helpers.serve_processes import labctl_argv

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from serve_http(tmp_path_factory.mktemp("dashboard"))


@pytest.fixture(scope="module")
def done(served: Served) -> dict[str, object]:
    return wait_until_done(served)


def test_the_queue_shows_the_job_and_the_live_stream_reaches_completed(served: Served) -> None:
    view = served.queue()
    jobs = view["jobs"] + view["done"]
    assert [j["name"] for j in jobs] == ["dash"], view
    status, kind, page = served.get("/queue")
    assert status == 200 and kind.startswith("text/html") and b"dash" in page
    # the live page follows the job to its run, then streams it to its end
    status, _, page = served.get(f"/live/job/{jobs[0]['id']}")
    assert status == 200
    run = None
    for _ in range(600):
        view = served.queue()
        run = next((j["run"] for j in view["jobs"] + view["done"] if j["run"]), None)
        if run is not None:
            break
        time.sleep(0.1)
    assert run is not None, "the job never started"
    events = read_stream(served.url + f"live/{run}/stream")
    states = [data for event, data in events if event == "state"]
    rows = [row for event, data in events if event == "rows" for row in data]
    end = events[-1][1]
    assert states[-1]["status"] == "completed" and end["status"] == "completed"
    assert states[-1]["reconfig"] + 1 == states[-1]["total"] == 9
    ports = states[-1]["ports"]
    assert len(ports) == 16 and all("t5" in p["marks"] for p in ports), ports
    assert len(rows) == 9 * 16  # every port of every reconfiguration (the baseline's too) came back
    assert set(end["ticks_skipped"]) == {"rx-power", "model-traffic"}


def _policy(stat: Path) -> int:
    return int(stat.read_text().rsplit(")", 1)[1].split()[38])  # field 41 of proc(5): 0 normal, 5 idle


def test_the_pages_are_served_below_the_scheduler_and_its_runs(served: Served) -> None:
    """The dashboard's thread (and the threads it starts) runs SCHED_IDLE, so a run's sampler that wakes takes
    the core from it at once; the scheduler's thread, whose runs inherit its policy, is as it was."""
    import os

    proc = Path(f"/proc/{served.proc.pid}")
    assert _policy(proc / "stat") == os.SCHED_OTHER
    policies = {_policy(task / "stat") for task in (proc / "task").iterdir()}
    assert policies == {os.SCHED_OTHER, os.SCHED_IDLE}, policies


def test_the_history_lists_the_run_and_its_figures_load(served: Served, done: dict[str, object]) -> None:
    run = str(done["run"])
    status, _, body = served.get("/api/runs")
    assert status == 200
    assert [r["dir"] for r in json.loads(body)] == [run]
    status, _, page = served.get("/runs")
    assert status == 200 and run.encode() in page
    status, _, page = served.get(f"/runs/{run}")
    assert status == 200 and b"completed" in page
    for figure in ("headline.png", "timeline.png", "distributions.png"):
        assert f"/runs/{run}/files/{figure}".encode() in page
        status, kind, data = served.get(f"/runs/{run}/files/{figure}")
        assert (status, kind) == (200, "image/png") and data.startswith(b"\x89PNG")
    status, _, text = served.get(f"/runs/{run}/report.txt")
    assert status == 200 and b"status: completed" in text
    status, _, trace = served.get(f"/runs/{run}/export/perfetto")
    assert status == 200 and json.loads(trace)["traceEvents"]
    status, _, vcd = served.get(f"/runs/{run}/export/vcd")
    assert status == 200 and b"$enddefinitions" in vcd
    status, _, page = served.get("/runs?status=crashed")
    assert status == 200 and run.encode() not in page
    status, _, page = served.get("/runs?since=yesterday-ish")
    assert status == 400 and b"since" in page


@pytest.mark.parametrize(
    "path",
    [
        "/runs/no-such-run",
        "/runs/..%2F..%2Fetc",
        "/runs/%2E%2E",
        "/live/..%2Fq.sqlite",
        "/runs/{run}/files/..%2F..%2Fq.sqlite",
        "/runs/{run}/files/.hidden.json",
        "/runs/{run}/files/events.exe",
        "/runs/{run}/export/pdf",
    ],
)
def test_unknown_runs_and_traversal_are_404_pages(served: Served, done: dict[str, object], path: str) -> None:
    status, kind, page = served.get(path.format(run=done["run"]))
    assert status == 404 and kind.startswith("text/html"), (path, status)
    assert b'id="error"' in page


def test_every_mutating_endpoint_needs_the_token(served: Served, done: dict[str, object]) -> None:
    body = json.dumps({"experiment": "experiments/reconfig-timeline.yaml"}).encode()
    for path in ("/api/jobs/1/cancel", "/api/jobs/1/resubmit", "/api/jobs/c1/cancel", "/api/submit"):
        for token in (None, "", "not-the-token", served.token + "x"):
            status, answer = served.post(path, token, body)
            assert status == 403, (path, token, status, answer)
            assert "token" in answer["error"]
        status, _, _ = served.get(path)  # never a GET that changes state
        assert status == 405, path
    assert [j["state"] for j in served.queue()["done"]] == ["completed"]  # nothing changed
    status, answer = served.post("/api/jobs/42/cancel", served.token)
    assert status == 404 and "no job" in answer["error"]
    status, answer = served.post(
        "/api/submit", served.token, json.dumps({"experiment": "../../etc/passwd.yaml"}).encode()
    )
    assert status == 400 and "leaves" in answer["error"]


def test_a_crashed_run_and_a_run_being_written_are_shown_as_such(
    served: Served, done: dict[str, object], tmp_path: Path
) -> None:
    source = served.runs / str(done["run"])
    runs = tmp_path / "runs"
    for name, status, pid in (("crashed-run", "running", 2**22 + 1), ("writing-run", "running", os.getpid())):
        target = runs / name
        shutil.copytree(
            source, target, ignore=shutil.ignore_patterns("catalog.json", "summary.json", "*.png")
        )
        meta = json.loads((target / "run.json").read_text())
        meta.update(status=status, pid=pid, finished_wall_ns=None)
        (target / "run.json").write_text(json.dumps(meta))
    argv = labctl_argv("dashboard", str(runs), "--http", "127.0.0.1:0")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[1]
        dash = Served(proc, url, "", runs, tmp_path / "none")
        status, _, page = dash.get("/runs/crashed-run")
        assert status == 200 and b'id="status" class="status status-crashed">crashed' in page
        status, _, page = dash.get("/runs/writing-run")
        assert status == 200 and b"being written" in page
        status, _, _ = dash.get("/queue")
        assert status == 404  # no queue without a scheduler
        status, _ = dash.post("/api/jobs/1/cancel", "anything")
        assert status == 404
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
        proc.stdout.close()  # type: ignore[union-attr]


@pytest.mark.parametrize("command", [("serve", "--db", "{tmp}/q.sqlite"), ("dashboard", "{tmp}")])
def test_a_non_loopback_address_without_a_token_exits_2_with_one_line(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    args = [a.format(tmp=tmp_path) for a in command]
    proc = subprocess.run(
        labctl_argv(*args, "--http", "0.0.0.0:0"), capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "token" in lines[0], proc.stderr
    assert "dashboard:" not in proc.stdout
