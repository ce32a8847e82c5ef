"""Fuzzed tune specs (issue 40): random mutations of the shipped tune experiment (wrong types, out-of-range
numbers, unknown keys, huge lists, auto-negotiation on one end of a circuit only, keys left out) given to
`labctl tune --dry-run` are either a valid plan (exit 0) or one line on stderr and exit 2: never a
traceback, never a second line. Through the console entry point itself (labctl.cli.main), in process."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labctl.cli import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "experiments" / "tune-autoneg-fec.yaml"
VALID: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
TOP = [*VALID, "ports", "reference", "allow_mismatched_ends", "settle_s", "grid", "unknown_key", "kind"]
SWEEP = ["autoneg", "speed_mbps", "duplex", "link_modes", "fec", "priv_flags", "mtu"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["on", "off", "rs", "auto", "full", "half", "dp", "pp", "h1/ens1f0np0", "random"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
huge = st.sampled_from(
    [
        {"sweep": {"speed_mbps": list(range(1, 5001))}},
        {"sweep": {"fec": ["rs", "off"] * 2000}},
        {"sweep": {"priv_flags": {f"flag{i}": [True, False] for i in range(40)}}},
        {"sweep": {"priv_flags": {f"flag{i}": [True, False] for i in range(14)}}},  # 2**14 × 4 settings
        {"sweep": {"link_modes": [[f"mode{i}"] for i in range(200)]}},
        {"ports": [f"h{i}/eth{i}" for i in range(5000)]},
        {"ports": ["h1/ens1f0np0"] * 3},
        {"reconfigurations": 100_000},
        {"cycle": ["pp", "dp"] * 5000},
        {"grid": {"fraction": 1e-300, "seed": 2**64}},
    ]
)
one_end = st.sampled_from(
    [
        {"ports": ["h1/ens1f0np0"]},  # its peers in either phase are not swept
        {"ports": ["h1/ens1f0np0", "h2/ens1f0np0"]},  # peers in dp, not in pp
        {"ports": ["h1/ens1f0np0"], "sweep": {"fec": ["rs", "off"]}},  # no autoneg swept: allowed
        {"ports": ["h1/ens1f0np0"], "allow_mismatched_ends": True},
        {"ports": ["h9/ens1f0np0"]},
        {"ports": ["not a port"]},
    ]
)


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    spec = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["top", "sweep", "drop", "huge", "one_end", "reference"]))
        if how == "top":
            spec[draw(st.sampled_from(TOP))] = draw(values)
        elif how == "sweep":
            sweep = spec["sweep"] if isinstance(spec.get("sweep"), dict) else {}
            sweep[draw(st.sampled_from(SWEEP))] = draw(values)
            spec["sweep"] = sweep
        elif how == "drop":
            spec.pop(draw(st.sampled_from(TOP)), None)
        elif how == "reference":
            spec["reference"] = draw(
                st.sampled_from(["autoneg=off,fec=off", "autoneg=on", "fec=rs,autoneg=on"])
            )
        else:
            change = draw(huge if how == "huge" else one_end)
            for key, value in change.items():
                if key == "sweep" and isinstance(spec.get("sweep"), dict):
                    spec["sweep"] = {**spec["sweep"], **value}
                else:
                    spec[key] = value
    return spec


def _dry_run(
    path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    monkeypatch.setattr(
        sys, "argv", ["labctl", "tune", str(path), "--dry-run", "-i", str(REPO / "inventory.yaml")]
    )
    try:
        main()
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    return code, capsys.readouterr().err


@settings(
    max_examples=40,  # the quick tier: ~5 s on 2 cores
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
    derandomize=True,
)
@given(spec=mutated())
def test_a_mutated_tune_spec_is_a_plan_or_one_line_and_exit_2(
    spec: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True))
    code, stderr = _dry_run(path, monkeypatch, capsys)  # any other exception fails the test: a traceback
    assert code in (0, 2), stderr
    if code == 2:
        assert stderr.startswith("error: ") and stderr.count("\n") == 1 and stderr.endswith("\n"), stderr
        assert "Traceback" not in stderr
    else:
        assert stderr == ""


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"ports": ["h1/ens1f0np0"]}, "the ends of a circuit must agree"),
        ({"sweep": {"speed_mbps": list(range(1, 5001))}}, "speed_mbps"),
        ({"priv_flags_typo": 1}, "priv_flags_typo"),
        ({"reconfigurations": -1}, "reconfigurations"),
        ({"sweep": {"autoneg": ["maybe"]}}, "autoneg"),
    ],
)
def test_known_bad_specs_are_one_line_naming_what(
    change: dict[str, Any],
    says: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump(copy.deepcopy(VALID) | change, sort_keys=False))
    code, stderr = _dry_run(path, monkeypatch, capsys)
    assert code == 2 and stderr.count("\n") == 1 and says in stderr, stderr
