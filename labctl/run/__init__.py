"""The run layer: an experiment compiled to a plan of typed steps, and the one engine that executes it.

`experiment` (experiment files, the kind registry's entries, plans), `engine` (the run engine: the one
switch-apply path, recovery waits, abort and baseline restore, the event log, `run_experiment`),
`preflight` (`labctl lab check`). The workload kinds (trace replay, the sweep) live in `labctl.workload`.
"""
