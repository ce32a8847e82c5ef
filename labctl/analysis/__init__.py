"""The analysis layer: everything computed from a run's `events.jsonl` alone, never from the lab.

The link-up breakdown (`breakdown`) and its statistics (`phase_stats`), runs pooled and compared (`compare`),
the run catalogue (`catalog`), the figures (`plots`), run directories on disk (`store`), the causality
invariants over a run's events (`invariants`).
"""
