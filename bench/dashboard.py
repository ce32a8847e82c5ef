"""The live dashboard against a running fast experiment: how long from an event to the page, and what 100
open pages cost the run.

Each round is a real `labctl serve --http 127.0.0.1:0 --exit-when-idle` with one fast run of
reconfig-timeline (`--profile fast`) queued; rounds alternate between no page open (the named peer) and
`--clients` Server-Sent Events clients on the run's live stream for the whole run (plain asyncio sockets in
this process, every one reading every message; one of them also timing each state message; as root at the
lowest priority, standing for browsers on other machines). Per round:
the run's flagged rows (summary.json) and skipped ticks (run.json, every probe's), and with clients the
event-to-page latency: for each event logged after the clients connected, the time from its `wall_ns` to
the first state message whose `seq` covers it (so it includes the run's own log flush, every 0.5 s, and
the server's 50 ms poll). Goals (the issue): latency median and p99 <= 1 s; with clients, flagged rows 0
and skipped ticks no more than without.

    python3 bench/dashboard.py --rounds 2 --clients 100
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))  # bench/ is not a package
from _table import record  # noqa: E402

EXPERIMENT = REPO / "experiments" / "reconfig-timeline.yaml"
INVENTORY = REPO / "inventory.yaml"


def labctl(*args: str) -> list[str]:
    return [sys.executable, "-m", "labctl.cli", *args]


async def _get_json(host: str, port: int, path: str) -> Any:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    await writer.wait_closed()
    return json.loads(data.split(b"\r\n\r\n", 1)[1])


async def _client(host: str, port: int, run: str, times: list[tuple[int, int]] | None) -> int:
    """One page: read the live stream to its end; `times` gets (receipt ns, seq) of each state message."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET /live/{run}/stream HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    got = 0
    event = b""
    try:
        while True:
            line = await reader.readline()
            if not line:
                break
            if line.startswith(b"event: "):
                event = line[7:].strip()
            elif line.startswith(b"data: "):
                got += 1
                if event == b"end":
                    break
                if times is not None and event == b"state":
                    times.append((time.time_ns(), int(json.loads(line[6:])["seq"])))
    finally:
        writer.close()
        await writer.wait_closed()
    return got


async def _watch(host: str, port: int, clients: int) -> tuple[str, list[tuple[int, int]], int]:
    """Wait for the job's run, then `clients` pages on it until it ends."""
    run = None
    deadline = time.monotonic() + 60
    while run is None:
        if time.monotonic() > deadline:
            raise SystemExit("the run did not start within 60 s")
        view = await _get_json(host, port, "/api/queue")
        run = next((j["run"] for j in view["jobs"] + view["done"] if j["run"]), None)
        if run is None:
            await asyncio.sleep(0.05)
    times: list[tuple[int, int]] = []
    counts = await asyncio.gather(
        *(_client(host, port, run, times if i == 0 else None) for i in range(clients))
    )
    return run, times, sum(counts)


@contextlib.contextmanager
def _as_remote_browsers() -> Iterator[None]:
    """The clients stand for browsers on other machines, but here share the lab machine's cores: as root
    they run at the lowest priority, taking only what the serve and its run leave (the serve, started
    before, keeps its own), so that what the pages cost the run is the server's work. Not root: a niced
    process cannot come back, and the next round's serve would inherit it, so they run as they are."""
    if os.geteuid() != 0:
        yield
        return
    before = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, 19)
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)


def one_round(tmp: Path, clients: int) -> dict[str, Any]:
    db, runs = tmp / "q.sqlite", tmp / "runs"
    subprocess.run(
        labctl("submit", str(EXPERIMENT), "-i", str(INVENTORY), "--profile", "fast", "--db", str(db)),
        check=True, capture_output=True,
    )  # fmt: skip
    serve = subprocess.Popen(
        labctl("serve", "--db", str(db), "--out", str(runs), "--poll", "0.1", "--exit-when-idle",
               "--http", "127.0.0.1:0"),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert serve.stdout is not None
        url = serve.stdout.readline().split()[1]  # dashboard: http://127.0.0.1:PORT/
        host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
        if clients:
            with _as_remote_browsers():
                run, times, messages = asyncio.run(_watch(host, int(port), clients))
        else:
            run, times, messages = "", [], 0
        serve.wait(timeout=300)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        if serve.stdout is not None:
            serve.stdout.close()
    run_dir = next(runs.iterdir()) if not run else runs / run
    summary = json.loads((run_dir / "summary.json").read_text())
    meta = json.loads((run_dir / "run.json").read_text())
    skipped = sum(
        int(p.get("ticks_skipped", 0)) for p in (meta.get("probes") or {}).values() if isinstance(p, dict)
    )
    latencies: list[float] = []
    if times:
        first_seq = times[0][1]  # the snapshot: events before it were logged before the page opened
        for line in (run_dir / "events.jsonl").read_text().splitlines():
            e = json.loads(line)
            if e["seq"] <= first_seq or e.get("wall_ns") is None:
                continue
            seen = next((t for t, seq in times if seq >= e["seq"]), None)
            if seen is not None:
                latencies.append((seen - e["wall_ns"]) / 1e9)
    return {
        "flagged": int(summary.get("flagged_rows") or 0),
        "skipped": skipped,
        "latencies": latencies,
        "messages": messages,
        "status": meta.get("status"),
    }


def p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(0.99 * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="runs with clients, and as many without")
    ap.add_argument("--clients", type=int, default=100)
    args = ap.parse_args()
    os.environ.setdefault("PYTHONPATH", str(REPO))
    without: list[dict[str, Any]] = []
    with_: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.rounds):
            for clients, into in ((0, without), (args.clients, with_)):
                where = Path(tmp) / f"{n}-{clients}"
                where.mkdir()
                r = one_round(where, clients)
                into.append(r)
                lat = r["latencies"]
                extra = (
                    f", latency median {statistics.median(lat):.3f} s p99 {p99(lat):.3f} s over {len(lat)} "
                    f"events, {r['messages']} messages read"
                    if lat
                    else ""
                )
                print(f"round {n + 1}, {clients:3d} clients: {r['status']}, flagged rows {r['flagged']}, "
                      f"skipped ticks {r['skipped']}{extra}", flush=True)  # fmt: skip
    latencies = [x for r in with_ for x in r["latencies"]]
    flagged_with = max(r["flagged"] for r in with_)
    skipped_with = statistics.median(r["skipped"] for r in with_)
    skipped_without = statistics.median(r["skipped"] for r in without)
    print(f"\nevent to page over {len(latencies)} events: median {statistics.median(latencies):.3f} s, "
          f"p99 {p99(latencies):.3f} s (goal <= 1 s; includes the run's 0.5 s log flush)")  # fmt: skip
    print(f"{args.clients} clients: flagged rows max {flagged_with} (without: "
          f"{max(r['flagged'] for r in without)}); skipped ticks median {skipped_with:g} "
          f"(without: {skipped_without:g}) over {args.rounds} round(s) each")  # fmt: skip
    # Each round with clients ran right after one without, on the machine as it was then: the per-round
    # difference is the comparison the machine's drift (no-client rounds alone vary by tens of ticks) blurs least.
    paired = [w["skipped"] - wo["skipped"] for wo, w in zip(without, with_, strict=True)]
    print(f"skipped ticks, with minus without clients, round by round: {paired}; median "
          f"{statistics.median(paired):g}")  # fmt: skip
    record("dashboard", "event to page latency, median", statistics.median(latencies), "s", goal="<= 1 s")
    record("dashboard", "event to page latency, p99", p99(latencies), "s", goal="<= 1 s")
    record("dashboard", f"flagged rows with {args.clients} SSE clients", flagged_with, "rows", goal="0")
    record("dashboard", f"skipped ticks with {args.clients} SSE clients, median", skipped_with, "ticks",
           peer="the same fast run with no page open", peer_value=skipped_without,
           goal="no more than without clients")  # fmt: skip
    record("dashboard", f"skipped ticks with {args.clients} SSE clients minus without, paired median",
           statistics.median(paired), "ticks", goal="<= 0")  # fmt: skip


if __name__ == "__main__":
    main()
