"""`labctl run` as a real subprocess: exit codes, SIGINT restores the baseline, SIGKILL leaves a readable run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import labctl
from labctl.core.events import read_events
from labctl.inventory.schema import load_inventory
from labctl.run.experiment import build_plan, load_experiment

LABCTL = [sys.executable, "-m", "labctl.cli"]


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:  # never leave a process (or its pipes) behind, even when the test failed
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=30)


def start_run(procs: list[subprocess.Popen[str]], repo: Path, out: Path) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [
            *LABCTL,
            "run",
            str(repo / "experiments" / "reconfig-timeline.yaml"),
            "--inventory",
            str(repo / "inventory.yaml"),
            "--profile",
            "fast",
            "--out",
            str(out),
            "--seed",
            "5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    procs.append(p)
    return p


def wait_for_line(p: subprocess.Popen[str], needle: str, timeout: float = 60) -> list[str]:
    assert p.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"never saw {needle!r}; stderr so far: {''.join(lines)}")


def baseline_patches(repo: Path) -> set[tuple[int, int]]:
    spec, src = load_experiment(repo / "experiments" / "reconfig-timeline.yaml")
    plan = build_plan(spec, load_inventory(repo / "inventory.yaml"), src)
    return set().union(*(rp.mapping for rp in plan.phases[spec.baseline].values()))


def test_sigint_restores_baseline_and_leaves_an_aborted_run(
    procs: list[subprocess.Popen[str]], repo: Path, tmp_path: Path
) -> None:
    p = start_run(procs, repo, tmp_path)
    before = wait_for_line(p, "reconfig 1/8 → pp done")  # the switch now holds PP circuits
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "status: aborted" in stdout
    # Progress names the baseline, counts the 8 steps from 1, and shows the restore as what it is.
    progress = [line.strip() for line in [*before, *stderr.splitlines()] if " done" in line]
    assert progress[:2] == ["baseline → dp done", "reconfig 1/8 → pp done"], progress
    assert progress[-1] == "restoring baseline → dp done", progress
    assert not any("reconfig 0/" in line or "/8 → dp done" in line for line in progress), progress
    assert "".join(before).count("run directory:") + stdout.count("run directory:") == 1
    (run_dir,) = tmp_path.iterdir()
    run = labctl.load_run(run_dir)
    assert run.status == "aborted"
    events = list(read_events(run_dir / "events.jsonl"))
    kinds = [e.kind for e in events]
    assert "run.abort" in kinds and kinds[-1] == "run.end"
    restore = [e for e in events if e.kind == "phase"][-1]
    assert restore.value == "dp" and restore.meta["measured"] is False
    final = [e for e in events if e.kind == "ocs.read"][-1]
    assert {tuple(x) for x in final.meta["patches"]} == baseline_patches(repo)
    assert (run_dir / "breakdown.csv").exists() and (run_dir / "summary.json").exists()
    assert not run.breakdown.empty
    # It stops now: no figure is drawn on the way out, and the user is told how to draw them.
    assert not list(run_dir.glob("*.png")) and f"labctl plot {run_dir}" in stdout.replace("\n", "")
    drawn = subprocess.run(
        [*LABCTL, "plot", str(run_dir), "--format", "png,svg"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert drawn.returncode == 0, drawn.stderr
    assert {p.name for p in run_dir.glob("timeline.*")} == {"timeline.png", "timeline.svg"}
    bad = subprocess.run(
        [*LABCTL, "plot", str(run_dir), "--format", "png,tiff"], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert "--format 'png,tiff': use a comma-separated list of png, svg, pdf, or all" in bad.stderr
    report = subprocess.run(
        [*LABCTL, "report", str(run_dir)], capture_output=True, text=True, timeout=60, check=False
    )
    assert report.returncode == 0 and "status: aborted" in report.stdout
    assert "probe rx-power: samples" in report.stdout  # what the sampler achieved, from run.json


def test_a_burst_of_signals_still_finishes_the_run_directory(
    procs: list[subprocess.Popen[str]], repo: Path, tmp_path: Path
) -> None:
    """Ctrl-C hammered: the restore is abandoned, but the run is still marked aborted and fully written."""
    p = start_run(procs, repo, tmp_path)
    wait_for_line(p, "reconfig 1/8 → pp done")
    for sig in (signal.SIGINT, signal.SIGINT, signal.SIGTERM, signal.SIGINT):
        p.send_signal(sig)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 130, stderr
    assert "Traceback" not in stderr and "status: aborted" in stdout
    (run_dir,) = tmp_path.iterdir()
    assert labctl.load_run(run_dir).status == "aborted"
    events = list(read_events(run_dir / "events.jsonl"))
    assert events[-1].kind == "run.end" and events[-1].value == "aborted"
    assert [e for e in events if e.kind == "ocs.read"], "the switches' final state is still read back"
    assert (run_dir / "breakdown.csv").exists() and (run_dir / "summary.json").exists()


def test_sigkill_leaves_events_readable_up_to_the_last_flush(
    procs: list[subprocess.Popen[str]], repo: Path, tmp_path: Path
) -> None:
    p = start_run(procs, repo, tmp_path)
    wait_for_line(p, "reconfig 2/8 → dp done")
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    (run_dir,) = tmp_path.iterdir()
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "running" and meta["pid"] == p.pid
    events = list(read_events(run_dir / "events.jsonl"))  # a torn last line is tolerated
    assert [e.seq for e in events] == list(range(len(events)))
    reconfigs_flushed = {e.reconfig for e in events if e.kind == "phase"}
    assert {0, 1, 2} <= reconfigs_flushed  # flushed at every reconfiguration boundary
    run = labctl.load_run(run_dir)  # breakdown computed from the events on disk
    assert set(run.breakdown["reconfig"].dropna()) >= {0, 1, 2}
    report = subprocess.run(
        [*LABCTL, "report", str(run_dir)], capture_output=True, text=True, timeout=60, check=False
    )
    assert report.returncode == 0, report.stderr
    assert "still says running" in report.stdout


def test_bad_experiment_is_exit_2_one_line(tmp_path: Path, repo: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nphases: {dp: {pairs: [[h1, h2]]}}\nbaseline: dp\ncycle: [dp]\nspeed: 11\n")
    proc = subprocess.run(
        [
            *LABCTL,
            "run",
            str(bad),
            "--inventory",
            str(repo / "inventory.yaml"),
            "--out",
            str(tmp_path / "runs"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {bad}:5: speed: unknown field"]
    assert not (tmp_path / "runs").exists()  # nothing is created before the input is valid


def test_unknown_profile_is_exit_2(tmp_path: Path, repo: Path) -> None:
    proc = subprocess.run(
        [
            *LABCTL,
            "run",
            str(repo / "experiments" / "reconfig-timeline.yaml"),
            "--profile",
            "warp",
            "--inventory",
            str(repo / "inventory.yaml"),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "unknown profile 'warp'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--bogus", "x.yaml"],
        ["run"],
        ["report"],
        ["ocs", "connect", "x", "5"],
        ["inventory", "check", "a.yaml", "b.yaml"],
        ["probe", "carrier", "--iface", "lo", "--duration", "nan"],
        ["probe", "carrier", "--iface", "lo", "--poll-hz", "5"],
        ["dom", "read", "lo", "--netns", ".."],
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args: list[str], tmp_path: Path) -> None:
    # in an empty directory: `labctl report` reports runs/'s newest run where there is one
    proc = subprocess.run(
        [*LABCTL, *args], capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr


def test_dry_run_prints_the_plan_and_touches_nothing(
    tmp_path: Path, experiment_path: Path, inventory_path: Path
) -> None:
    out = subprocess.run(
        [
            *LABCTL,
            "run",
            str(experiment_path),
            "-i",
            str(inventory_path),
            "--dry-run",
            "--out",
            str(tmp_path / "runs"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "9 reconfigurations" in out.stdout and "nothing is sent" in out.stdout
    assert out.stdout.count("reconfig ") == 9
    # reconfig 1 (dp → pp) re-patches every one of the 16 ports of the two rails
    assert "reconfig 1 → pp  step 0: 16 ports get a new peer" in out.stdout
    assert "nic:h1/ens1f0np0: nic:h2/ens1f0np0 → nic:h3/ens1f0np0" in out.stdout
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("command", "experiment", "options"),
    [
        ("run", "reconfig-timeline", ["--no-plots"]),
        ("run", "reconfig-timeline", ["--dry-run"]),
        ("tune", "tune-autoneg-fec", ["--dry-run"]),
    ],
)
def test_one_run_reads_its_experiment_file_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, command: str, experiment: str, options: list[str]
) -> None:
    """A whole `labctl run` (the built-in experiment on the built-in simulated lab) reads and compiles the
    experiment file once: the CLI reads both input files and hands them down to the run, which reads
    neither again; the experiment's kind comes from the same read as its plan. So do a dry run and
    `labctl tune`, which checks the kind on the inputs it hands down."""
    from collections import Counter

    from typer.testing import CliRunner

    import labctl.core.yamlio as yamlio
    from labctl.cli import app
    from labctl.core.shipped import builtin_inventory, resolve_experiment

    reads: Counter[Path] = Counter()
    real = yamlio.load_yaml

    def counting(path: Path, what: str) -> yamlio.SourcedYaml:
        reads[Path(path).resolve()] += 1
        return real(path, what)

    # Every module's own name for the loader, and the module's, for those imported during the run.
    for module in [m for name, m in sys.modules.items() if name.startswith("labctl")]:
        if getattr(module, "load_yaml", None) is real:
            monkeypatch.setattr(module, "load_yaml", counting)
    monkeypatch.chdir(tmp_path)  # no inventory.yaml here: the built-in simulated lab
    result = CliRunner().invoke(
        app, [command, experiment, "--profile", "fast", *options, "--out", str(tmp_path / "runs")]
    )
    assert result.exit_code == 0, result.output
    assert reads[resolve_experiment(experiment).resolve()] == 1, reads
    assert reads[builtin_inventory().resolve()] == 1, reads
