"""`labctl schema experiment` covers `kind: tune` (issue 40): the shipped tune experiment (the repository's
and the packaged copy `labctl tune tune-autoneg-fec` runs) is valid against it, and the schema rejects the
tune specs the model rejects (wrong types, ranges, unknown keys)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from labctl.cli.schema import experiment_schema, experiment_specs
from labctl.run.tune import TuneSpec
from tests.unit.test_reference import EXPERIMENTS, REPO, _as_json, _errors

SHIPPED = [
    REPO / "experiments" / "tune-autoneg-fec.yaml",
    REPO / "labctl" / "data" / "experiments" / "tune-autoneg-fec.yaml",
]


def test_the_shipped_experiments_include_a_tune_one_and_every_kind_is_shipped() -> None:
    kinds = {_as_json(path).get("kind", "timeline") for path in EXPERIMENTS}
    assert "tune" in kinds and kinds == set(experiment_specs())


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_the_shipped_tune_experiment_is_valid_against_the_schema(path: Path) -> None:
    data = _as_json(path)
    assert data["kind"] == "tune"
    assert _errors(experiment_schema(), data) == []
    TuneSpec.model_validate(data)


@pytest.mark.parametrize(
    "change",
    [
        {"sweep": {"mtu": [1500]}},
        {"sweep": {"fec": ["maybe"]}},
        {"sweep": {"autoneg": [True, False, True]}},
        {"sweep": {"speed_mbps": [0]}},
        {"sweep": {"priv_flags": {"x": "on"}}},
        {"reconfigurations": 0},
        {"grid": {"fraction": 2}},
        {"grid": "half"},
        {"order": "sorted"},
        {"ports": ["no-slash"]},
        {"settle_s": -1},
        {"unknown_key": 1},
    ],
)
def test_the_schema_rejects_what_the_tune_model_rejects(change: dict[str, Any]) -> None:
    data = copy.deepcopy(_as_json(SHIPPED[0]))
    for key, value in change.items():
        data[key] = {**data[key], **value} if key == "sweep" else value
    assert _errors(experiment_schema(), data)
    with pytest.raises(ValidationError):
        TuneSpec.model_validate(data)
