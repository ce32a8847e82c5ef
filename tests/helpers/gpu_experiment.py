"""Shared by tests/integration/test_gpu_experiment.py and tests/unit/test_gpu_experiment.py."""

from __future__ import annotations

SHORT = """\
name: gpu-short
phases:
  dp: {pairs: [[h1, h2], [h3, h4]]}
  pp: {pairs: [[h1, h3], [h2, h4]]}
baseline: dp
cycle: [pp]
repeat: 1
hold_s: 0.05
recovery_timeout_s: 5
"""
