"""Tune runs pooled and compared by link setting (issue 40 part 2): `labctl report RUN RUN...` and `labctl
compare A vs B` group by the breakdown's `link_setting`, every interval resampling run × reconfiguration,
the reference taken from run.json (never from the order the settings were measured in)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

from labctl.analysis.breakdown_table import write_breakdown
from labctl.analysis.catalog_record import write_record
from labctl.analysis.compare import aggregate, compare
from labctl.analysis.phase_stats import POOLED_CLUSTER, summarize
from labctl.analysis.settings import by_setting, default_reference, reference_of
from labctl.cli import app
from labctl.cli.report import _run_summary
from tests.unit.test_catalog import breakdown_frame, make_run

MS = 1_000_000
SPEC: dict[str, Any] = {
    "name": "tune-x",
    "kind": "tune",
    "sweep": {
        "autoneg": [True, False],
        "speed_mbps": None,
        "duplex": None,
        "link_modes": None,
        "fec": ["rs", "off"],
        "priv_flags": {},
    },
    "reference": None,
}
ORDER = ["autoneg=off,fec=off", "autoneg=on,fec=rs", "autoneg=off,fec=rs", "autoneg=on,fec=off"]
"""As a seeded random order measures them: the reference (autoneg=on,fec=rs) is not the first."""
SLOWER = {"autoneg=on,fec=rs": 6000 * MS, "autoneg=on,fec=off": 5000 * MS, "autoneg=off,fec=rs": 1 * MS}


def tune_frame(seed: int, per_setting: int = 2) -> pd.DataFrame:
    """test_catalog's breakdown with a tune run's link_setting: the settings of ORDER in turn, each over
    `per_setting` reconfigurations, the autoneg=on ones seconds slower (as the seed: ≈6 s against ≈3 s) in firmware and total."""
    frame = breakdown_frame(seed, reconfigs=per_setting * len(ORDER))
    labels = [""] + [label for label in ORDER for _ in range(per_setting)]
    frame["link_setting"] = pd.array([labels[n] for n in frame["reconfig"]], dtype="string")
    extra = frame["link_setting"].map(lambda s: SLOWER.get(s, 0)).astype("Int64")
    frame["firmware_ns"] = frame["firmware_ns"] + extra
    frame["total_ns"] = frame["total_ns"] + extra
    return frame


def tune_run(runs: Path, name: str, seed: int, **meta: Any) -> Path:
    """A tune run as one crashed before its end leaves it (no link_settings record) unless `meta` adds one:
    run.json with the experiment's spec, breakdown.parquet, no summary.json."""
    run = make_run(runs, name, seed=seed, experiment="tune-x", analysed=False, record=False)
    record = json.loads((run / "run.json").read_text())
    record["experiment"] = SPEC | meta.pop("experiment", {})
    (run / "run.json").write_text(json.dumps(record | meta))
    write_breakdown(tune_frame(seed), run)
    write_record(run)
    return run


def _pandas(runs: list[Path], reference: str) -> dict[str, Any] | None:
    frames = []
    for run in runs:
        frame = pd.read_parquet(run / "breakdown.parquet")
        frame.insert(0, "run_id", run.name)
        frames.append(frame)
    return by_setting(pd.concat(frames, ignore_index=True), reference)


def test_pooled_by_setting_equals_the_pandas_pooling_and_takes_run_jsons_reference(tmp_path: Path) -> None:
    runs = [tune_run(tmp_path, f"t{i}", seed=i) for i in (1, 2, 3)]
    pooled = aggregate(runs)
    section = pooled["by_link_setting"]
    assert section == _pandas(runs, "autoneg=on,fec=rs")
    assert section["reference"] == "autoneg=on,fec=rs"  # from the spec, though measured second
    assert section["ci_resampling"] == POOLED_CLUSTER
    assert list(section["settings"]) == ORDER  # in the order first measured
    for entry in section["settings"].values():
        assert entry["reconfigurations"] == 3 * 2  # 3 runs × 2 reconfigurations each
        assert entry["total"]["median_ci_clusters"] == 6
        assert entry["total"]["unit"] == "circuit end" and entry["firmware"]["unit"] == "port"
    assert [r["setting"] for r in section["ranking"]][-1] == "autoneg=on,fec=rs"
    off_off = section["settings"]["autoneg=off,fec=off"]["total"]["vs_reference"]
    assert off_off["ci"][1] < 0 and not off_off["includes_0"]
    assert pooled["notes"] == []


def test_the_pooled_report_prints_the_ranking_and_json_carries_it(tmp_path: Path) -> None:
    runs = [tune_run(tmp_path, f"t{i}", seed=i) for i in (1, 2)]
    text = CliRunner().invoke(app, ["report", *map(str, runs)], terminal_width=400)
    assert text.exit_code == 0, text.output
    assert "link settings (reference autoneg=on,fec=rs; ms, 95% CI resampling run × reconfiguration)" in (
        text.output
    )
    assert "4 run × reconfigurations" in text.output and "recommendation: " in text.output
    as_json = CliRunner().invoke(app, ["report", *map(str, runs), "--json"])
    assert json.loads(as_json.output)["by_link_setting"]["reference"] == "autoneg=on,fec=rs"


def test_runs_naming_different_references_use_the_first_and_say_so(tmp_path: Path) -> None:
    a = tune_run(tmp_path, "t1", seed=1, link_settings={"reference": "autoneg=off,fec=rs"})
    b = tune_run(tmp_path, "t2", seed=2)
    pooled = aggregate([a, b])
    assert pooled["by_link_setting"]["reference"] == "autoneg=off,fec=rs"
    assert any("different reference settings" in note for note in pooled["notes"])


def test_no_reference_anywhere_is_the_first_measured_said_in_a_note(tmp_path: Path) -> None:
    # run.json without the sweep (and no recorded reference): nothing names the reference
    runs = [tune_run(tmp_path, f"t{i}", seed=i, experiment={"sweep": None}) for i in (1, 2)]
    pooled = aggregate(runs)
    assert pooled["by_link_setting"]["reference"] == ORDER[0]
    assert any("first measured" in note for note in pooled["notes"])


def test_runs_without_link_settings_have_no_section(tmp_path: Path) -> None:
    runs = [make_run(tmp_path, f"r{i}", seed=i) for i in (1, 2)]
    assert "by_link_setting" not in aggregate(runs)
    assert "by_link_setting" not in compare([runs[0]], [runs[1]])


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        ({"link_settings": {"reference": "fec=off"}, "experiment": SPEC}, "fec=off"),
        ({"experiment": SPEC | {"reference": "autoneg=off,fec=rs"}}, "autoneg=off,fec=rs"),
        ({"experiment": SPEC}, "autoneg=on,fec=rs"),
        ({"experiment": {"kind": "timeline", "cycle": ["pp"]}}, None),
        ({}, None),
    ],
)
def test_reference_of_a_run_json(meta: dict[str, Any], expected: str | None) -> None:
    assert reference_of(meta) == expected


def test_the_default_reference_is_the_label_compile_tune_gives_its_first_setting() -> None:
    """run.json's spec has lost the order the file wrote the sweep in; the first setting's label does not
    depend on it (labels list fields in a fixed order, link modes and flags sorted)."""
    from labctl.run.tune import TuneSpec, grid_points

    data = {
        "kind": "tune",
        "name": "x",
        "phases": {"dp": {"pairs": [["h1", "h2"]]}},
        "baseline": "dp",
        "cycle": ["dp"],
        "sweep": {
            "priv_flags": {"tx_port_ts": [True, False], "rx_cqe_compress": [False]},
            "fec": ["off", "rs"],
            "link_modes": [["100000baseSR4/Full", "100000baseCR4/Full"], ["50000baseSR2/Full"]],
            "speed_mbps": [100000],
            "autoneg": [False, True],
        },
    }
    spec = TuneSpec.model_validate(data)
    first = grid_points(spec, list(data["sweep"]))[0].label
    assert default_reference(spec.model_dump(mode="json")) == first
    assert first == (
        "autoneg=off,speed_mbps=100000,link_modes=100000baseCR4/Full+100000baseSR4/Full,fec=off,"
        "rx_cqe_compress=off,tx_port_ts=on"
    )


def test_a_single_run_report_from_parquet_alone_takes_the_reference_from_run_json(tmp_path: Path) -> None:
    run = tune_run(tmp_path, "t1", seed=1)
    meta = json.loads((run / "run.json").read_text())
    summary, _, notes = _run_summary(run, meta)
    assert notes == []
    assert summary["by_link_setting"]["reference"] == "autoneg=on,fec=rs"
    assert summary["by_link_setting"]["settings"]["autoneg=on,fec=rs"]["total"].get("vs_reference") is None
    as_json = CliRunner().invoke(app, ["report", str(run), "--json"])
    assert json.loads(as_json.output)["summary"]["by_link_setting"]["reference"] == "autoneg=on,fec=rs"


def test_compare_groups_by_setting_with_each_difference_and_ranking(tmp_path: Path) -> None:
    a = [tune_run(tmp_path, f"a{i}", seed=i) for i in (1, 2)]
    b = [tune_run(tmp_path, f"b{i}", seed=i + 10) for i in (1, 2)]
    result = compare(a, b)
    section = result["by_link_setting"]
    assert list(section["differences"]) == ORDER and section["only_in"] == {"a": [], "b": []}
    for side in ("a", "b"):
        assert section[side]["reference"] == "autoneg=on,fec=rs"
        assert section[side]["ci_resampling"] == POOLED_CLUSTER
    for label, entry in section["differences"].items():
        for phase in ("firmware", "total"):
            a_median = section["a"]["settings"][label][phase]["median"]
            b_median = section["b"]["settings"][label][phase]["median"]
            diff = entry[phase]
            assert abs(diff["median"] - (b_median - a_median)) <= 1  # rounding of each median
            assert diff["ci"][0] <= diff["ci"][1] and diff["includes_0"] == (
                diff["ci"][0] <= 0 <= diff["ci"][1]
            )
    shown = CliRunner().invoke(app, ["compare", *map(str, a), "vs", *map(str, b)], terminal_width=400)
    assert shown.exit_code == 0, shown.output
    assert "by link setting" in shown.output
    rows = [line for line in shown.output.splitlines() if line.startswith("│ autoneg=on,fec=rs ")]
    assert len(rows) == 2 and "firmware (port)" in rows[0] and "total (circ. end)" in rows[1]
    assert "set A recommendation: " in shown.output and "set B recommendation: " in shown.output


def test_compare_says_which_settings_one_set_measured_alone(tmp_path: Path) -> None:
    a = tune_run(tmp_path, "a1", seed=1)
    plain = make_run(tmp_path, "p1", seed=2)
    section = compare([a], [plain])["by_link_setting"]
    assert section["b"] is None and section["differences"] == {}
    assert section["only_in"]["a"] == ORDER
    assert "by_link_setting" not in summarize(pd.read_parquet(plain / "breakdown.parquet"))
