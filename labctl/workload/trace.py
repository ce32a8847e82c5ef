"""The phase-table / trace format: what one training step asks of the network, operation by operation.

A trace (YAML or JSON, `format: labctl-trace/1`) names a job and lists its steps::

    format: labctl-trace/1
    name: opus-testbed
    job: {hosts: [h1, h2, h3, h4], gpus_per_host: 2, tp: 2, dp: 2, pp: 2}
    repeat: 3                 # steps to replay: the listed steps, cycled (default: as many as listed)
    steps:
      - step_ns: 2_000_000_000  # the step's length (default: its last operation's end)
        ops:                    # in start order; times from the step's start, integer ns
          - {name: ag-fwd, group: dp, type: allgather, bytes: 179_000_000, start_ns: 0,
             duration_ns: 3_600_000}
          - {name: fwd-act, group: pp, stages: [0, 1], type: sendrecv, bytes: 64_000_000,
             start_ns: 480_000_000, duration_ns: 2_600_000}

Each operation: `group` (dp, cp, pp or tp), which ranks take part (`ranks:`, global ranks; or `stages:`,
PP stage indices; default every stage, and for pp exactly two stages are needed), `type` (allreduce,
allgather, reducescatter, send, recv, sendrecv, alltoall, broadcast), `bytes`, `start_ns`, `duration_ns`,
and optionally `network` (rail or frontend). TP stays in the scale-up domain and small calls (under
`job.frontend_below_bytes`, default 1 MiB: barriers, loss all-reduces) go over the CPU front-end network, as
the Opus shim decides: neither touches the rail. The idle window before a rail operation is its start minus
the end of the rail operation before it (across step boundaries: a step's tail after its last operation is
part of the window before the next step's first).

Ranks are placed as Megatron does, tp fastest, then cp, then dp, then pp: rank r lives on host
`hosts[r // gpus_per_host]`, GPU `r % gpus_per_host`; TP fills a host (tp == gpus_per_host), and rail k
carries GPU k of every host.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from labctl.core.errors import InputError
from labctl.core.yamlio import SourcedYaml, format_loc, load_yaml, pydantic_error_line

FORMAT = "labctl-trace/1"
Group = Literal["dp", "cp", "pp", "tp"]
OpType = Literal[
    "allreduce", "allgather", "reducescatter", "send", "recv", "sendrecv", "alltoall", "broadcast"
]
MAX_NS = 10**15  # ~11.6 days: no step of a training job is longer
MAX_STEPS = 100_000


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class JobSpec(_Model):
    """Where the ranks are and how they are grouped."""

    hosts: list[str] = Field(min_length=1, max_length=4096, description="placement order: node n = hosts[n]")
    gpus_per_host: int = Field(ge=1, le=64)
    tp: int = Field(default=1, ge=1, le=64)
    dp: int = Field(default=1, ge=1, le=65536)
    pp: int = Field(default=1, ge=1, le=9, description="one topo_id digit per stage: at most 9 stages")
    cp: int = Field(default=1, ge=1, le=4096)
    frontend_below_bytes: int = Field(
        default=1 << 20, ge=0, le=1 << 40, description="smaller operations use the CPU front-end network"
    )

    @model_validator(mode="after")
    def _shape(self) -> JobSpec:
        if self.tp != self.gpus_per_host:
            raise ValueError(
                f"tp ({self.tp}) must equal gpus_per_host ({self.gpus_per_host}): TP fills the scale-up "
                "domain and each rail carries one GPU of every host"
            )
        nodes = self.dp * self.cp * self.pp
        if nodes != len(self.hosts):
            raise ValueError(
                f"dp x cp x pp = {nodes} nodes but {len(self.hosts)} hosts are listed (one TP group per host)"
            )
        if len(set(self.hosts)) != len(self.hosts):
            raise ValueError("a host is listed twice")
        return self

    @property
    def world(self) -> int:
        return len(self.hosts) * self.gpus_per_host

    def stage_of_rank(self, rank: int) -> int:
        return (rank // self.gpus_per_host) // (self.dp * self.cp)


class OpSpec(_Model):
    name: str = ""
    group: Group
    type: OpType
    bytes: int = Field(ge=0, le=1 << 50)
    start_ns: int = Field(ge=0, le=MAX_NS)
    duration_ns: int = Field(ge=0, le=MAX_NS)
    ranks: list[int] | None = Field(default=None, min_length=1)
    stages: list[int] | None = Field(default=None, min_length=1, max_length=9)
    network: Literal["rail", "frontend"] | None = None

    @model_validator(mode="after")
    def _kind(self) -> OpSpec:
        if self.ranks is not None and self.stages is not None:
            raise ValueError("give ranks or stages, not both")
        if self.group == "pp" and self.type not in ("send", "recv", "sendrecv"):
            raise ValueError(f"a pp operation is a send, recv or sendrecv, not {self.type}")
        return self

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.duration_ns


class StepSpec(_Model):
    step_ns: int | None = Field(default=None, ge=0, le=MAX_NS)
    ops: list[OpSpec] = Field(min_length=1, max_length=100_000)

    @model_validator(mode="after")
    def _length(self) -> StepSpec:
        last = max(op.end_ns for op in self.ops)
        if self.step_ns is not None and self.step_ns < last:
            raise ValueError(f"step_ns {self.step_ns} ends before its last operation ({last})")
        if self.length_ns <= 0:  # a step of no time: nothing to replay, and every ratio to it divides by 0
            raise ValueError("the step's length is 0 (give step_ns, or operations that take time)")
        return self

    @property
    def length_ns(self) -> int:
        return self.step_ns if self.step_ns is not None else max(op.end_ns for op in self.ops)


class TraceSpec(_Model):
    format: Literal["labctl-trace/1"] = "labctl-trace/1"
    name: str = Field(min_length=1, max_length=80)
    description: str = ""
    source: str = Field(default="", description="where the numbers come from")
    job: JobSpec
    steps: list[StepSpec] = Field(min_length=1, max_length=MAX_STEPS)
    repeat: int | None = Field(default=None, ge=1, le=MAX_STEPS)


@dataclass(frozen=True, slots=True)
class Op:
    """One operation resolved against the job: the PP stages whose circuits it uses (empty: off the rail)."""

    step: int
    index: int
    """Position in its step."""
    name: str
    group: Group
    type: OpType
    bytes: int
    start_ns: int
    """From the start of its step."""
    duration_ns: int
    stages: tuple[int, ...]
    on_rail: bool

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.duration_ns

    @property
    def label(self) -> str:
        return self.name or f"{self.group}-{self.type}-{self.index}"


@dataclass(frozen=True)
class Trace:
    spec: TraceSpec
    path: Path | None
    steps: tuple[tuple[Op, ...], ...]
    """Every step to replay (the listed steps cycled to `repeat`), each op resolved."""
    step_lengths_ns: tuple[int, ...]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def job(self) -> JobSpec:
        return self.spec.job

    def rail_ops(self) -> Iterator[tuple[int, Op]]:
        """(absolute start ns from the first step's start, op) for every rail operation, in order."""
        offset = 0
        for step, length in zip(self.steps, self.step_lengths_ns, strict=True):
            for op in step:
                if op.on_rail:
                    yield offset + op.start_ns, op
            offset += length

    def with_steps(self, n: int) -> Trace:
        """The same trace cut or cycled to `n` steps."""
        listed = len(self.spec.steps)
        steps = tuple(self._resolved[i % listed] for i in range(n))
        steps = tuple(tuple(_restep(op, k) for op in ops) for k, ops in enumerate(steps))
        lengths = tuple(self.spec.steps[i % listed].length_ns for i in range(n))
        return Trace(self.spec, self.path, steps, lengths)

    def scaled(self, factor: float) -> Trace:
        """Every time multiplied by `factor` (a shorter trace of the same shape, for CI). Absolute endpoints
        are scaled, so rail operations that did not overlap still do not and an operation never ends after
        its step; a trace the factor breaks (a step of length 0, a time too large) is an InputError."""
        data = self.spec.model_dump()
        for step in data["steps"]:
            last_end = 0
            for op in step["ops"]:
                start = round(op["start_ns"] * factor)
                end = round((op["start_ns"] + op["duration_ns"]) * factor)
                op["start_ns"], op["duration_ns"] = start, end - start
                last_end = max(last_end, end)
            if step["step_ns"] is not None:
                step["step_ns"] = max(round(step["step_ns"] * factor), last_end)
        data["name"] = f"{self.spec.name}-x{factor:g}"
        try:
            spec = TraceSpec.model_validate(data)
        except ValidationError as e:
            first = e.errors(include_url=False)[0]
            raise InputError(f"x{factor:g}: {format_loc(tuple(first['loc']))}: {first['msg']}") from None
        return resolve(spec, self.path).with_steps(len(self.steps))

    @property
    def _resolved(self) -> tuple[tuple[Op, ...], ...]:
        return tuple(_resolve_step(self.spec, i, None) for i in range(len(self.spec.steps)))


def _restep(op: Op, step: int) -> Op:
    return Op(
        step,
        op.index,
        op.name,
        op.group,
        op.type,
        op.bytes,
        op.start_ns,
        op.duration_ns,
        op.stages,
        op.on_rail,
    )


def _resolve_step(spec: TraceSpec, i: int, src: SourcedYaml | None) -> tuple[Op, ...]:
    job = spec.job

    def fail(loc: tuple[Any, ...], message: str) -> InputError:
        where = f"{src.where(loc)}: " if src is not None else ""
        return InputError(f"{where}{format_loc(loc)}: {message}")

    out: list[Op] = []
    prev_end: int | None = None
    prev_index = 0
    for k, op in enumerate(spec.steps[i].ops):
        loc = ("steps", i, "ops", k)
        if op.ranks is not None:
            bad = [r for r in op.ranks if not 0 <= r < job.world]
            if bad:
                raise fail((*loc, "ranks"), f"rank {bad[0]} is outside 0..{job.world - 1}")
            stages = tuple(sorted({job.stage_of_rank(r) for r in op.ranks}))
        elif op.stages is not None:
            bad = [s for s in op.stages if not 0 <= s < job.pp]
            if bad:
                raise fail((*loc, "stages"), f"stage {bad[0]} is outside 0..{job.pp - 1}")
            stages = tuple(sorted(set(op.stages)))
        elif op.group == "pp":
            raise fail(loc, "a pp operation names its two stages (stages: [s, t]) or its ranks")
        else:
            stages = tuple(range(job.pp))
        if op.group == "pp" and len(stages) != 2:
            raise fail(loc, f"a pp operation joins exactly two stages, got {list(stages)}")
        network = op.network or ("frontend" if op.bytes < job.frontend_below_bytes else "rail")
        on_rail = op.group != "tp" and network == "rail"
        if on_rail and ((op.group == "dp" and job.dp == 1) or (op.group == "cp" and job.cp == 1)):
            raise fail((*loc, "group"), f"the job has {op.group} = 1: no {op.group} group to connect")
        if on_rail and prev_end is not None and op.start_ns < prev_end:
            raise fail(
                (*loc, "start_ns"),
                f"starts at {op.start_ns} before ops[{prev_index}] ends ({prev_end}): rail operations of a "
                "step run one after another",
            )
        if on_rail:
            prev_end, prev_index = op.end_ns, k
        out.append(
            Op(i, k, op.name, op.group, op.type, op.bytes, op.start_ns, op.duration_ns, stages, on_rail)
        )
    return tuple(out)


def resolve(spec: TraceSpec, path: Path | None, src: SourcedYaml | None = None) -> Trace:
    listed = tuple(_resolve_step(spec, i, src) for i in range(len(spec.steps)))
    n = spec.repeat or len(listed)
    steps = tuple(tuple(_restep(op, k) for op in listed[k % len(listed)]) for k in range(n))
    lengths = tuple(spec.steps[k % len(listed)].length_ns for k in range(n))
    if not any(op.on_rail for step in steps for op in step):
        loc = ("steps",)
        where = f"{src.where(loc)}: " if src is not None else ""
        raise InputError(f"{where}steps: no operation uses the rail (all tp or front-end): nothing to switch")
    return Trace(spec, path, steps, lengths)


def load_trace(path: Path | str) -> Trace:
    """A trace file (YAML or JSON); a bad one is one InputError line with file:line and the field."""
    path = Path(path)
    src = load_yaml(path, "trace")
    try:
        spec = TraceSpec.model_validate(src.data)
    except ValidationError as e:
        raise InputError(pydantic_error_line(src, e)) from None
    return resolve(spec, path, src)


def trace_from_data(data: dict[str, Any], name: str = "trace") -> Trace:
    """A trace from parsed data (a built-in, an importer's output); errors name the field."""
    try:
        spec = TraceSpec.model_validate(data)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        raise InputError(f"{name}: {format_loc(tuple(first['loc']))}: {first['msg']}") from None
    return resolve(spec, None)


def get_trace(name_or_path: str, base: Path | None = None) -> Trace:
    """A built-in trace by name (labctl.workload.builtin.TRACES), else a trace file: a relative one is looked
    for in `base` (the experiment's directory) first, then from the working directory."""
    from labctl.workload.builtin import TRACES

    if name_or_path in TRACES:
        return trace_from_data(TRACES[name_or_path](), name_or_path)
    path = Path(name_or_path)
    if not path.is_absolute() and base is not None and (base / path).exists():
        path = base / path
    if not path.exists():
        raise InputError(
            f"{name_or_path}: no such trace file, and no built-in trace of that name "
            f"(built-in: {', '.join(TRACES)})"
        )
    return load_trace(path)
