"""The workload behind the switching (issue 16): what a training job asks of each rail, and its replay.

- `trace`: the phase-table/trace format (per step, ordered collective operations with their group, type,
  bytes, start and duration; the idle windows between them follow), its loader, the built-in traces;
- `stall`: the stall model, Σ max(0, T − Wᵢ) with provisioning and N·T on demand;
- `circuits`: parallelism → circuits per rail, `topo_id` (one digit per PP stage), per-stage sub-mappings;
- `orchestrator`: per-rail orchestrators (minimal diffs, G1/G2 locks, retry, giant-ring fallback);
- `replay`: runs a trace against a lab in real time; `steps`: typed plan steps the controller executes;
- `kineto`: a PyTorch profiler (Kineto) trace's NCCL kernels to the trace format; `sweep`: Figure 10.

This package file imports nothing, so `labctl.run.experiment` can import `labctl.run.steps` without
pulling
the replay machinery (or closing an import cycle through the controller).
"""
