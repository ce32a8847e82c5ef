"""The main experiment through agents, as a new user runs it: a local mosquitto, one `labctl agent` process
per host, the default inventory with `kind: agents`, fast profile; beside it the same experiment in one
process (the peer). Prints, per run, what issue 23 holds the agents plane to:

- flagged rows in the baseline (reconfiguration 0) and after it;
- the optical median against the one-process run's (ratio);
- the t2 (optical) mark's resolution, median and worst;
- the world feed: light changes applied at their model time / late, and how far ahead of it they arrived;
- per host: the clock model's source, offset, drift and uncertainty, and the exchange-based uncertainty.

    python3 bench/agents.py [--runs 5] [--hosts 4 --ports-per-host 4] [--broker-nagle]

`--hosts 8 --ports-per-host 8` is the 64-port lab (8 agents). `--broker-nagle` leaves `set_tcp_nodelay`
out of the broker's configuration, as mosquitto's default is: the "before" of the issue.
Starts its own mosquitto on 127.0.0.1 (free port, temporary config) and stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

from labctl.run.lifecycle import run_experiment

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _table import record

REPO = Path(__file__).resolve().parent.parent


def lab_yaml(hosts: int, ports: int) -> str:
    """The default inventory for 4 hosts x 4 ports; otherwise the same shape, larger: `ports` per host,
    half on each rail, on one switch with an ingress and an egress port per NIC port."""
    if (hosts, ports) == (4, 4):
        return (REPO / "inventory.yaml").read_text()
    if ports % 2:
        sys.exit("--ports-per-host must be even (half on each rail)")
    n = hosts * ports
    lines = ["lab: bench-agents", "switches:", f"  ocs1: {{driver: sim, size: {n}x{n}}}", "hosts:"]
    for h in range(hosts):
        lines.append(f"  h{h + 1}:")
        lines.append("    nics:")
        for p in range(ports):
            k = h * ports + p + 1
            rail = p % 2
            lines.append(
                f"      - {{ifname: p{p}, rail: {rail}, switch: ocs1, tx: {k}, rx: {n + k}, gbps: 100}}"
            )
    return "\n".join(lines) + "\n"


def experiment_yaml(hosts: int) -> str:
    """reconfig-timeline.yaml's DP <-> PP swap, for any even number of hosts (pairs of 2 and of 4)."""
    names = [f"h{i + 1}" for i in range(hosts)]
    dp = [[names[i], names[i + 1]] for i in range(0, hosts, 2)]
    pp = [p for i in range(0, hosts, 4) for p in ([names[i], names[i + 2]], [names[i + 1], names[i + 3]])]
    text = (REPO / "experiments/reconfig-timeline.yaml").read_text()
    if hosts == 4:
        return text
    text = text.replace("dp: {pairs: [[h1, h2], [h3, h4]]}", f"dp: {{pairs: {json.dumps(dp)}}}")
    return text.replace("pp: {pairs: [[h1, h3], [h2, h4]]}", f"pp: {{pairs: {json.dumps(pp)}}}")


def start_broker(work: Path, nagle: bool) -> tuple[subprocess.Popen[bytes], int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = work / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        + ("" if nagle else "set_tcp_nodelay true\n")
    )
    proc = subprocess.Popen(["mosquitto", "-c", str(conf)], stderr=subprocess.DEVNULL)
    for _ in range(200):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        time.sleep(0.02)
    raise SystemExit("mosquitto did not start")


def rows_of(run_dir: Path) -> pd.DataFrame:
    return pd.read_csv(run_dir / "breakdown.csv")


def flagged(frame: pd.DataFrame) -> int:
    out = pd.Series(False, index=frame.index)
    for col in ("impossible", "unresolved"):
        if col in frame:
            out |= frame[col].astype("string").fillna("") != ""
    return int(out.sum())


def describe(run_dir: Path, local_optical_ns: float) -> dict[str, Any]:
    frame = rows_of(run_dir)
    base, after = frame[frame["reconfig"] == 0], frame[frame["reconfig"] > 0]
    meta = json.loads((run_dir / "run.json").read_text())
    worlds = [p.get("world", {}) for n, p in meta.get("probes", {}).items() if n.startswith("agent:")]
    on_time = sum(w.get("light_back_on_time", 0) + w.get("light_lost_on_time", 0) for w in worlds)
    late = sum(w.get("light_back_late", 0) + w.get("light_lost_late", 0) for w in worlds)
    leads = [w["lead_median_ns"] for w in worlds if "lead_median_ns" in w]
    lead_min = [w["lead_min_ns"] for w in worlds if "lead_min_ns" in w]
    clocks = meta.get("clock_offsets", {})
    optical = float(after["optical_ns"].median())
    return {
        "status": meta.get("status"),
        "flag_base": flagged(base),
        "flag_after": flagged(after),
        "optical_ms": optical / 1e6,
        "ratio": optical / local_optical_ns,
        "t2_res_ms": float(after["t2_resolution_ns"].median()) / 1e6,
        "t2_res_max_ms": float(after["t2_resolution_ns"].max()) / 1e6,
        "on_time": on_time,
        "late": late,
        "lead_ms": statistics.median(leads) / 1e6 if leads else float("nan"),
        "lead_min_ms": min(lead_min) / 1e6 if lead_min else float("nan"),
        "unc_ms": max((c.get("uncertainty_ns", 0) for c in clocks.values()), default=0) / 1e6,
        "xchg_unc_ms": max(
            (c.get("exchange_uncertainty_ns", c.get("uncertainty_ns", 0)) for c in clocks.values()), default=0
        )
        / 1e6,
        "sources": sorted({str(c.get("source", "exchange")) for c in clocks.values()}),
        "rtt_min_ms": max((c.get("rtt_min_ns", 0) for c in clocks.values()), default=0) / 1e6,
    }


def agent_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spawn_agents(hosts: int, work: Path) -> list[subprocess.Popen[bytes]]:
    """`labctl agent` per host, each its own process, as on a real lab."""
    procs = []
    for h in range(hosts):
        with open(work / f"agent-h{h + 1}.log", "wb") as log:
            argv = [
                sys.executable,
                "-m",
                "labctl.cli",
                "agent",
                "--host",
                f"h{h + 1}",
                "-i",
                str(work / "agents.yaml"),
            ]
            procs.append(subprocess.Popen(argv, stderr=log))
    return procs


async def main(args: argparse.Namespace) -> None:
    if shutil.which("mosquitto") is None:
        sys.exit("bench/agents.py needs mosquitto (apt-get install mosquitto)")
    work = Path(tempfile.mkdtemp(prefix="labctl-bench-agents-"))
    broker, port = start_broker(work, args.broker_nagle)
    agents: list[subprocess.Popen[bytes]] = []
    try:
        lab = lab_yaml(args.hosts, args.ports_per_host)
        (work / "one.yaml").write_text(lab)
        (work / "agents.yaml").write_text(lab + f"\nkind: agents\nbroker:\n  url: mqtt://127.0.0.1:{port}\n")
        exp = work / "experiment.yaml"
        exp.write_text(experiment_yaml(args.hosts))
        one = await run_experiment(
            exp, work / "one.yaml", profile="fast", out_dir=work / "one", plots=False, seed=1
        )
        agents.extend(spawn_agents(args.hosts, work))
        local = rows_of(one.run_dir)
        local_optical = float(local[local["reconfig"] > 0]["optical_ns"].median())
        local_res = float(local[local["reconfig"] > 0]["t2_resolution_ns"].median())
        print(
            f"{args.hosts} agents x {args.ports_per_host} ports, fast profile, mosquitto "
            f"{'without' if args.broker_nagle else 'with'} set_tcp_nodelay"
        )
        print(
            f"one process (peer): optical median {local_optical / 1e6:.2f} ms, t2 resolution median "
            f"{local_res / 1e6:.2f} ms, flagged {flagged(local)}"
        )
        header = (
            f"{'run':>3} {'status':>9} {'flag0':>5} {'flag':>4} {'optical':>8} {'x1proc':>6} {'t2res':>6} "
            f"{'t2max':>6} {'on time':>8} {'late':>4} {'lead':>6} {'leadmin':>7} {'unc':>6} {'xchg':>6} "
            f"{'rttmin':>6}  source"
        )
        print(header)
        results = []
        cpu_runs: list[list[float]] = []  # per run, each agent's share of a core (not its start-up)
        others: list[tuple[float, float]] = []  # per run, the controller's and the broker's
        for i in range(args.runs):
            cpu0 = [agent_cpu_s(p.pid) for p in agents] if i else []
            own0, broker0 = time.process_time(), agent_cpu_s(broker.pid)
            started = time.monotonic()
            run = await run_experiment(
                exp,
                work / "agents.yaml",
                profile="fast",
                out_dir=work / f"agents{i}",
                plots=False,
                seed=1 + i,
            )
            if i:  # run 0 also waits for the agents to start (imports): not what a run costs
                wall = time.monotonic() - started
                cpu_runs.append([(agent_cpu_s(p.pid) - c) / wall for p, c in zip(agents, cpu0, strict=True)])
                others.append(
                    ((time.process_time() - own0) / wall, (agent_cpu_s(broker.pid) - broker0) / wall)
                )
            d = describe(run.run_dir, local_optical)
            results.append(d)
            print(
                f"{i:>3} {d['status']:>9} {d['flag_base']:>5} {d['flag_after']:>4} {d['optical_ms']:>6.2f}ms "
                f"{d['ratio']:>6.2f} {d['t2_res_ms']:>4.2f}ms {d['t2_res_max_ms']:>4.1f}ms {d['on_time']:>8} "
                f"{d['late']:>4} {d['lead_ms']:>4.1f}ms {d['lead_min_ms']:>5.1f}ms {d['unc_ms']:>4.2f}ms "
                f"{d['xchg_unc_ms']:>4.2f}ms {d['rtt_min_ms']:>4.2f}ms  {','.join(d['sources'])}"
            )
            if args.keep:
                print(f"    {run.run_dir}")
        cpu = [agent_cpu_s(p.pid) for p in agents]
        print(f"agent processes' CPU over the runs: {', '.join(f'{c:.1f}' for c in cpu)} s")
        if cpu_runs:
            shares = [statistics.median(run[k] for run in cpu_runs) for k in range(len(agents))]
            print(
                f"each agent's share of a core during a run (median of runs 1-{len(cpu_runs)}): "
                f"{', '.join(f'{c:.2f}' for c in shares)}; all agents {sum(shares):.2f} cores of {os.cpu_count()}"
            )
            print(
                f"controller (this process) {statistics.median(o[0] for o in others):.2f}, "
                f"mosquitto {statistics.median(o[1] for o in others):.2f} of a core"
            )
        if results:
            print(
                f"median over {len(results)} runs: optical x{statistics.median(r['ratio'] for r in results):.2f} of "
                f"one process, t2 resolution {statistics.median(r['t2_res_ms'] for r in results):.2f} ms, "
                f"flagged {sum(r['flag_base'] + r['flag_after'] for r in results)}, late light changes "
                f"{sum(r['late'] for r in results)} of {sum(r['late'] + r['on_time'] for r in results)}, "
                f"worst per-host uncertainty {max(r['unc_ms'] for r in results):.3f} ms "
                f"(exchange {max(r['xchg_unc_ms'] for r in results):.3f} ms)"
            )
            n = len(results)
            record(
                "agents",
                f"optical median through {args.hosts} agents, median of {n} runs",
                statistics.median(r["optical_ms"] for r in results),
                "ms",
                peer="the same experiment in one process",
                peer_value=local_optical / 1e6,
            )
            record(
                "agents",
                f"t2 resolution median, median of {n} runs",
                statistics.median(r["t2_res_ms"] for r in results),
                "ms",
                peer="the same experiment in one process",
                peer_value=local_res / 1e6,
            )
            record(
                "agents",
                f"flagged rows over {n} runs",
                sum(r["flag_base"] + r["flag_after"] for r in results),
                "rows",
                goal="0",
            )
            record(
                "agents",
                "worst per-host clock uncertainty, exchange-based",
                max(r["xchg_unc_ms"] for r in results),
                "ms",
            )
    finally:
        for p in agents:
            p.terminate()
        for p in agents:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        broker.terminate()
        broker.wait(timeout=10)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--hosts", type=int, default=4, help="agents (an even number; pairs of hosts)")
    ap.add_argument("--ports-per-host", type=int, default=4)
    ap.add_argument("--broker-nagle", action="store_true", help="mosquitto without set_tcp_nodelay")
    ap.add_argument("--keep", action="store_true", help="keep the run directories and print them")
    asyncio.run(main(ap.parse_args()))
