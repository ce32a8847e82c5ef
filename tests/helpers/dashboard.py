"""A real `labctl serve --http 127.0.0.1:0` with a fast experiment queued, for the dashboard's integration
and browser tests (tests/integration/test_dashboard*.py): the process, its address and token, and a few
HTTP helpers on the standard library."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import REPO
from tests.helpers.serve_processes import labctl_argv

START_TIMEOUT_S = 30.0


@dataclass
class Served:
    proc: subprocess.Popen[str]
    url: str
    token: str
    runs: Path
    db: Path

    def get(self, path: str, *, headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
        """(status, content type, body) of a GET; an HTTP error is an answer too."""
        return request(self.url + path.lstrip("/"), headers=headers)

    def post(self, path: str, token: str | None = None, body: bytes = b"") -> tuple[int, Any]:
        headers = {} if token is None else {"X-Labctl-Token": token}
        status, _, data = request(self.url + path.lstrip("/"), method="POST", headers=headers, data=body)
        return status, json.loads(data or b"null")

    def queue(self) -> dict[str, Any]:
        status, _, body = self.get("/api/queue")
        assert status == 200, body
        return json.loads(body)


def request(
    url: str, *, method: str = "GET", headers: dict[str, str] | None = None, data: bytes | None = None
) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, method=method, headers=headers or {}, data=data)
    try:
        with urllib.request.urlopen(req, timeout=30) as answer:
            return answer.status, answer.headers.get("content-type", ""), answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type", ""), e.read()


def submit_fast(db: Path, name: str = "dash") -> None:
    submit(db, REPO / "experiments" / "reconfig-timeline.yaml", REPO / "inventory.yaml", "--profile", "fast",
           name=name)  # fmt: skip


def submit(db: Path, experiment: Path, inventory: Path, *options: str, name: str = "dash") -> None:
    subprocess.run(
        labctl_argv("submit", str(experiment), "-i", str(inventory), *options, "--db", str(db), "--name", name),
        check=True, capture_output=True,
    )  # fmt: skip


def serve_http(
    tmp: Path, *extra: str, job: tuple[Path, Path, tuple[str, ...]] | None = None
) -> Iterator[Served]:
    """`labctl serve --http 127.0.0.1:0` on a queue with one run submitted (`job`: experiment, inventory and
    submit options; default: the main experiment, fast, on the simulated lab), until the caller is done;
    then SIGTERM (the serve stops its run, restores its baseline) and reaped, killed if it hangs."""
    tmp.mkdir(parents=True, exist_ok=True)
    db, runs, token_file = tmp / "q.sqlite", tmp / "runs", tmp / "token"
    if job is None:
        submit_fast(db)
    else:
        submit(db, job[0], job[1], *job[2])
    argv = labctl_argv(
        "serve", "--db", str(db), "--out", str(runs), "--poll", "0.1",
        "--http", "127.0.0.1:0", "--token-file", str(token_file), *extra,
    )  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = None
        deadline = time.monotonic() + START_TIMEOUT_S
        assert proc.stdout is not None
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("dashboard: http://"):
                url = line.split()[1]
        assert url is not None, f"serve --http printed no address (exit {proc.poll()})"
        yield Served(proc, url, token_file.read_text().strip(), runs, db)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def wait_until_done(served: Served, timeout_s: float = 120.0) -> dict[str, Any]:
    """The queued run's job once it has finished (the queue's `done`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = served.queue()
        if view["done"]:
            return dict(view["done"][0])
        time.sleep(0.2)
    raise AssertionError("the fast run did not finish in time")


def read_stream(url: str, timeout_s: float = 120.0) -> list[tuple[str, Any]]:
    """A live page's Server-Sent Events, (event, data) each, until its `end` event."""
    got: list[tuple[str, Any]] = []
    with urllib.request.urlopen(url, timeout=timeout_s) as answer:
        event = None
        for raw in answer:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event is not None:
                got.append((event, json.loads(line[6:])))
                if event == "end":
                    break
    return got
