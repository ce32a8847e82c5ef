"""The `gpu:` section of a reconfiguration experiment: optional and validated. The GPU step in a run and
`labctl bench gpu` are tests/integration/test_gpu_experiment.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.core.errors import InputError
from labctl.run.experiment import load_experiment
from tests.helpers.gpu_experiment import SHORT


def test_gpu_section_is_optional_and_validated(tmp_path: Path, repo: Path) -> None:
    plain = tmp_path / "plain.yaml"
    plain.write_text(SHORT)
    assert load_experiment(plain)[0].gpu is None
    spec, _ = load_experiment(repo / "experiments" / "gpu-pingpong.yaml")
    assert spec.gpu is not None and spec.gpu.stages == ["before", "after"] and spec.gpu.device == 0
    assert len(spec.gpu.variants) == 4 and spec.gpu.pointer_chase
    for bad, where in (
        ("gpu: {iterations: 100, colour: red}\n", "gpu.colour"),
        ("gpu: {stages: [during]}\n", "gpu.stages"),
        ("gpu: {variants: [flip-sideways]}\n", "gpu.variants"),
        ("gpu: {iterations: 1}\n", "gpu.iterations"),
        ("gpu: {device: -1}\n", "gpu.device"),
    ):
        path = tmp_path / "bad.yaml"
        path.write_text(SHORT + bad)
        with pytest.raises(InputError) as info:
            load_experiment(path)
        text = str(info.value)
        assert "\n" not in text and where in text, text
