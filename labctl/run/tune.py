"""`kind: tune`: sweep NIC link settings (auto-negotiation, forced speed/duplex/link modes, FEC, driver
private flags) and measure each setting's link-up over a number of reconfigurations (issue 40).

A tune experiment is a timeline's phases, baseline and cycle, plus `sweep:` (the values of each setting),
`grid:` (every combination, or a seeded fraction of them), `reconfigurations:` per setting, a seeded random
`order:` of the settings (so that drift does not pose as an effect), `ports:` (default: every port the plan
moves) and a `reference:` setting (default: the first the spec writes). It compiles to: read every port's
settings (and refuse, before anything changes, a setting a port does not support or a port that carries
the host's management route: the lab's `LinkControl.support` says so), the baseline, then per setting
an apply on every port (verified by read-back, a `link.settings` event per port) and its reconfigurations.
Every port is put back as it was found when the run ends, however it ends (`RunContext.add_restore`); a
restore that fails fails the run and run.json `link_settings` says which port holds what. The settings read
first are in the run directory (`link-settings-before.json`) before anything changes, for a restore from
another process (`restore_saved`).
"""

from __future__ import annotations

import contextlib
import itertools
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from labctl.core.clock import Timebase, now_ns
from labctl.core.errors import InputError, LabctlError
from labctl.core.events import EventLog, Kind
from labctl.core.fileio import write_json_atomic
from labctl.core.yamlio import SourcedYaml, format_loc, load_yaml, pydantic_error_line
from labctl.inventory.profiles import Profile
from labctl.inventory.schema import Inventory, NicPort
from labctl.nic.settings import (
    Duplex,
    FecMode,
    LinkControl,
    LinkSettings,
    PortRef,
    settings_from_json,
    settings_to_json,
)
from labctl.run.experiment import (
    MAX_RECONFIGURATIONS,
    ExperimentKind,
    ExperimentSpec,
    PhaseSpec,
    Plan,
    SpecBase,
    build_plan,
)
from labctl.run.steps import Hold, Reconfigure, RunContext, Step, StepBase

__all__ = [
    "BEFORE_FILE",
    "ApplyLinkSettings",
    "GridFraction",
    "NotRestored",
    "ReadLinkSettings",
    "SweepSpec",
    "TuneSpec",
    "TuneState",
    "compile_tune",
    "grid_points",
    "restore_run_link_settings",
    "restore_saved",
    "saved_ports",
    "settings_from_json",
    "settings_to_json",
]

BEFORE_FILE = "link-settings-before.json"
"""In the run directory: every swept port's settings as read before the sweep changed any."""
MAX_GRID = 10_000


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class GridFraction(_Model):
    """A seeded random fraction of the full grid (the reference setting is always in it)."""

    fraction: float = Field(gt=0, le=1, description="share of the full grid's settings to run")
    seed: int = Field(default=0, ge=0, le=2**63 - 1, description="which settings the fraction picks")


class SweepSpec(_Model):
    """The values each setting takes; the grid is their combinations, in the order the file writes them."""

    autoneg: list[bool] | None = Field(default=None, min_length=1, max_length=2, description="on, off")
    speed_mbps: list[Annotated[int, Field(ge=1, le=1_600_000)]] | None = Field(
        default=None, min_length=1, max_length=64, description="forced speeds, Mb/s"
    )
    duplex: list[Duplex] | None = Field(default=None, min_length=1, max_length=2, description="full, half")
    link_modes: list[list[Annotated[str, Field(min_length=1, max_length=64)]]] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="link modes to advertise (ethtool names), one list per setting",
    )
    fec: list[FecMode] | None = Field(
        default=None, min_length=1, max_length=5, description="FEC modes: off, rs, baser, llrs, auto"
    )
    priv_flags: dict[Annotated[str, Field(min_length=1, max_length=64)], list[bool]] = Field(
        default={}, max_length=32, description="driver private flags: name → the values to try"
    )

    @model_validator(mode="after")
    def _something_swept(self) -> SweepSpec:
        for name in ("autoneg", "speed_mbps", "duplex", "link_modes", "fec"):
            values = getattr(self, name)
            if values is not None and len({repr(v) for v in values}) != len(values):
                raise ValueError(f"{name}: a value is written twice")
        for flag, values in self.priv_flags.items():
            if not values or len(set(values)) != len(values):
                raise ValueError(f"priv_flags.{flag}: give on and/or off, each once")
        swept = (getattr(self, n) for n in ("autoneg", "speed_mbps", "duplex", "link_modes", "fec"))
        if not self.priv_flags and all(values is None for values in swept):
            raise ValueError(
                "sweep nothing: name at least one of autoneg, speed_mbps, duplex, link_modes, fec, priv_flags"
            )
        return self


class TuneSpec(SpecBase):
    """A tune experiment: a timeline's phases, baseline and cycle, and the link settings swept over them."""

    kind: Literal["tune"] = Field(description="the experiment kind: tune")
    phases: dict[str, PhaseSpec] = Field(min_length=1, description="circuit phases by name")
    baseline: str = Field(description="the phase set up first (and restored at the end)")
    cycle: list[str] = Field(
        min_length=1, description="the phases reconfigured to in turn, continuing across settings"
    )
    sweep: SweepSpec = Field(description="the values of each link setting to sweep")
    grid: Literal["full"] | GridFraction = Field(
        default="full", description="every combination of the sweep's values, or {fraction: F, seed: N}"
    )
    reconfigurations: int = Field(default=4, ge=1, le=100_000, description="reconfigurations per setting")
    order: Literal["random", "as-written"] = Field(
        default="random",
        description="the settings in a seeded random order (drift is not an effect), or as written",
    )
    order_seed: int = Field(default=0, ge=0, le=2**63 - 1, description="the random order's seed")
    ports: list[Annotated[str, Field(pattern=r"^[^/\s]+/[^/\s]+$")]] | None = Field(
        default=None,
        max_length=4096,
        description="host/ifname of each port to set; default: every port the plan moves",
    )
    reference: str | None = Field(
        default=None,
        description="the setting (its label, e.g. autoneg=on,fec=rs) the others are compared "
        "to; default: the first the sweep writes",
    )
    allow_mismatched_ends: bool = Field(
        default=False, description="allow a sweep that sets auto-negotiation on one end of a circuit only"
    )
    settle_s: float = Field(
        default=0.0,
        ge=0,
        le=3600,
        description="wait after applying each setting, before its first "
        "reconfiguration (a real NIC retrains its link when its settings change)",
    )

    @field_validator("ports")
    @classmethod
    def _unique_ports(cls, ports: list[str] | None) -> list[str] | None:
        if ports is not None and len(set(ports)) != len(ports):
            raise ValueError("a port is named twice")
        return ports

    @model_validator(mode="after")
    def _bounded(self) -> TuneSpec:
        threshold = self.analysis.rx_power_threshold_dbm
        if self.probes.rx_power_threshold_dbm not in (None, threshold):
            raise ValueError(
                "probes.rx_power_threshold_dbm: set analysis.rx_power_threshold_dbm instead (probes use it)"
            )
        object.__setattr__(
            self, "probes", self.probes.model_copy(update={"rx_power_threshold_dbm": threshold})
        )
        return self


def grid_points(spec: TuneSpec, written: Sequence[str]) -> list[LinkSettings]:
    """The sweep's settings: every combination of its values, fields in the order `written` (the file's
    keys under `sweep:`), the first field varying slowest; with a fraction, a seeded sample of them that
    always keeps the first (the default reference). As written: `order` shuffles them afterwards."""
    sweep = spec.sweep
    names = [
        n for n in written if n in ("autoneg", "speed_mbps", "duplex", "link_modes", "fec", "priv_flags")
    ]
    names += [
        n for n in ("autoneg", "speed_mbps", "duplex", "link_modes", "fec", "priv_flags") if n not in names
    ]
    axes: list[list[tuple[str, Any]]] = []
    for name in names:
        if name == "priv_flags":
            axes += [[(f"flag:{flag}", v) for v in values] for flag, values in sweep.priv_flags.items()]
            continue
        values = getattr(sweep, name)
        if values is not None:
            axes.append([(name, tuple(v) if name == "link_modes" else v) for v in values])
    points: list[LinkSettings] = []
    for combo in itertools.product(*axes):
        plain = {k: v for k, v in combo if not k.startswith("flag:")}
        flags = tuple((k.removeprefix("flag:"), bool(v)) for k, v in combo if k.startswith("flag:"))
        points.append(LinkSettings(**plain, priv_flags=flags))
    return points


def _ports_of(spec: TuneSpec, plan: Plan, inventory: Inventory, where: Any) -> list[NicPort]:
    by_name = {f"{p.host}/{p.ifname}": p for p in inventory.ports}
    if spec.ports is not None:
        out = []
        for i, name in enumerate(spec.ports):
            if name not in by_name:
                raise InputError(f"{where('ports', i)}: no port {name!r} in the inventory (host/ifname)")
            out.append(by_name[name])
        return out
    moved = {source for r in plan.planned(inventory) for source, _, _ in r.moved}
    return [p for p in inventory.ports if p.source in moved]


def _check_ends(
    spec: TuneSpec, plan: Plan, ports: list[NicPort], points: list[LinkSettings], where: Any
) -> None:
    """Refuse auto-negotiation set on one end of a circuit only (the ends could not agree on a link)."""
    if spec.allow_mismatched_ends or not any(p.autoneg is not None for p in points):
        return
    swept = {p.source for p in ports}
    for phase, by_rail in plan.phases.items():
        for rp in by_rail.values():
            for link in rp.links:
                a, b = link.a.source, link.b.source
                if (a in swept) != (b in swept):
                    inside, outside = (a, b) if a in swept else (b, a)
                    raise InputError(
                        f"{where('ports')}: {inside.removeprefix('nic:')} gets auto-negotiation set but its "
                        f"peer {outside.removeprefix('nic:')} (phase {phase}) does not: the ends of a "
                        "circuit must agree (add the peer to ports, or allow_mismatched_ends: true)"
                    )


def compile_tune(path: Path, inventory: Inventory) -> Plan:
    return compile_tune_read(path, load_yaml(path, "experiment"), inventory)


def compile_tune_read(path: Path, src: SourcedYaml, inventory: Inventory) -> Plan:
    """`compile_tune` of the file as already read."""
    try:
        spec = TuneSpec.model_validate(src.data)
    except ValidationError as e:
        raise InputError(pydantic_error_line(src, e)) from None

    def where(*loc: Any) -> str:
        return f"{src.where(loc)}: {format_loc(loc)}"

    from labctl.labs import lab_kinds

    refused = lab_kinds.get(inventory.kind).no_link_control
    if refused is not None:
        raise InputError(f"{where('kind')}: tune on lab kind {inventory.kind}: {refused}")
    for field_name, names in (("baseline", [spec.baseline]), ("cycle", spec.cycle)):
        for i, name in enumerate(names):
            if name not in spec.phases:
                loc = (field_name,) if field_name == "baseline" else (field_name, i)
                raise InputError(f"{where(*loc)}: unknown phase {name!r} (defined: {', '.join(spec.phases)})")
    timeline = ExperimentSpec.model_validate(
        {
            **{k: v for k, v in src.data.items() if k in SpecBase.model_fields},
            "phases": src.data["phases"],
            "baseline": spec.baseline,
            "cycle": spec.cycle,
        }
    )
    base = build_plan(timeline, inventory, src)
    written = list(src.data["sweep"]) if isinstance(src.data.get("sweep"), dict) else []
    points = grid_points(spec, written)
    if len(points) > MAX_GRID:
        raise InputError(f"{where('sweep')}: {len(points)} settings in the grid; at most {MAX_GRID}")
    reference = spec.reference if spec.reference is not None else points[0].label
    labels = [p.label for p in points]
    if reference not in labels:
        raise InputError(
            f"{where('reference')}: {reference!r} is not a setting of the sweep ({', '.join(labels)})"
        )
    if isinstance(spec.grid, GridFraction):
        keep = max(1, round(spec.grid.fraction * len(points)))
        must = {0, labels.index(reference)}
        rest = [i for i in range(len(points)) if i not in must]
        chosen = must | set(
            random.Random(spec.grid.seed).sample(rest, max(0, min(len(rest), keep - len(must))))
        )
        points = [p for i, p in enumerate(points) if i in chosen]
    if spec.order == "random":
        random.Random(spec.order_seed).shuffle(points)
    total = len(points) * spec.reconfigurations
    if total > MAX_RECONFIGURATIONS:
        raise InputError(
            f"{where('reconfigurations')}: {total} reconfigurations; at most {MAX_RECONFIGURATIONS}"
        )
    ports = _ports_of(spec, base, inventory, where)
    if not ports:
        raise InputError(f"{where('cycle')}: the plan moves no port: nothing to tune")
    _check_ends(spec, base, ports, points, where)
    refs = tuple((PortRef(p.host, p.ifname), p.source) for p in ports)
    program: list[Step] = [
        ReadLinkSettings(refs, tuple(points), reference, BEFORE_FILE),
        Reconfigure(spec.baseline, None, baseline=True),
        Hold(spec.hold_s),
    ]
    i = 0
    for k, point in enumerate(points):
        program.append(ApplyLinkSettings(refs, point, k, len(points)))
        if spec.settle_s:
            program.append(Hold(spec.settle_s))
        for _ in range(spec.reconfigurations):
            phase = spec.cycle[i % len(spec.cycle)]
            i += 1
            program += [Reconfigure(phase, k, index=i, of=total), Hold(spec.hold_s)]
    return Plan(spec, base.path, base.rails, base.phases, tuple(program))


# -- the steps ------------------------------------------------------------------------------------------


@dataclass
class TuneState:
    """What the sweep did to each port (run.results; the kind's `record` writes it to run.json)."""

    reference: str
    order: list[str]
    before: dict[PortRef, LinkSettings] = field(default_factory=dict)
    held: dict[PortRef, LinkSettings] = field(default_factory=dict)
    """Each port's settings as last read back (before, after each apply, after the restore)."""
    touched: set[PortRef] = field(default_factory=set)
    """Ports an apply was sent to (the restore puts these back)."""
    restored: bool | None = None
    unrestored: dict[PortRef, str] = field(default_factory=dict)
    """Port → why its restore failed."""

    def section(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "order": self.order,
            "restored": self.restored,
            "ports": {
                port.label: {
                    "before": settings_to_json(self.before[port]),
                    "holds": settings_to_json(self.held[port]) if port in self.held else None,
                    "on_before": self.held.get(port) == self.before[port],
                    **({"restore_failed": self.unrestored[port]} if port in self.unrestored else {}),
                }
                for port in self.before
            },
        }


def _control(run: RunContext) -> LinkControl:
    control = run.lab.link_control
    if control is None:
        raise LabctlError("this lab offers no link settings control: a tune experiment cannot run on it")
    return control


def _emit(
    run: RunContext, source: str, port: PortRef, stage: str, settings: LinkSettings, **meta: Any
) -> None:
    run.events.emit(
        now_ns(),
        Kind.LINK_SETTINGS,
        source,
        settings.label,
        host=port.host,
        meta={"stage": stage, **meta},
    )


async def _restore(run: RunContext, state: TuneState, ports: Sequence[tuple[PortRef, str]]) -> None:
    control = _control(run)
    failed: list[str] = []
    for port, source in ports:
        if port not in state.touched:
            continue
        want = state.before[port]
        try:
            read = await control.apply(port, want)
        except LabctlError as e:
            state.unrestored[port] = str(e)
            with contextlib.suppress(LabctlError):
                state.held[port] = await control.read(port)
            held = state.held.get(port)
            failed.append(f"{port.label} holds {held.label if held else 'unknown settings'} ({e})")
            continue
        state.held[port] = read
        _emit(run, source, port, "restore", read, asked=settings_to_json(want), read=settings_to_json(read))
    state.restored = not failed
    if failed:
        raise LabctlError(f"{len(failed)} port(s) not back as found: {'; '.join(failed)}")


@dataclass(frozen=True, slots=True)
class ReadLinkSettings(StepBase):
    """Before anything changes: every port supports every setting and carries no management route (the
    lab's `LinkControl.support`), then each port's settings are read, saved in the run directory, and a
    restore to them is registered with the run."""

    ports: tuple[tuple[PortRef, str], ...]
    points: tuple[LinkSettings, ...]
    reference: str
    save_as: str = BEFORE_FILE

    async def execute(self, run: RunContext) -> None:
        control = _control(run)
        for port, _ in self.ports:
            support = await control.support(port)
            for point in self.points:
                why = support.refusal(point)
                if why is not None:
                    raise InputError(f"{port.label}: cannot set {point.label}: {why}; nothing was changed")
        state = TuneState(self.reference, [p.label for p in self.points])
        for port, source in self.ports:
            read = await control.read(port)
            state.before[port] = state.held[port] = read
            _emit(run, source, port, "before", read, read=settings_to_json(read))
        run.results.append(state)
        if run.events.path is not None:
            write_json_atomic(
                run.events.path.parent / self.save_as,
                {"ports": {port.label: settings_to_json(state.before[port]) for port, _ in self.ports}},
            )
        run.add_restore("link settings", lambda: _restore(run, state, self.ports))
        run.progress.message(
            f"link settings of {len(self.ports)} ports read; {len(self.points)} settings to sweep"
        )


@dataclass(frozen=True, slots=True)
class ApplyLinkSettings(StepBase):
    """One setting on every swept port, each verified by read-back (a `link.settings` event per port)."""

    ports: tuple[tuple[PortRef, str], ...]
    settings: LinkSettings
    index: int
    of: int
    needs_baseline: ClassVar[bool] = True

    async def execute(self, run: RunContext) -> None:
        control = _control(run)
        state = next(r for r in run.results if isinstance(r, TuneState))
        for port, source in self.ports:
            state.touched.add(port)
            read = await control.apply(port, self.settings)
            state.held[port] = read
            _emit(
                run,
                source,
                port,
                "apply",
                self.settings,
                index=self.index,
                reference=self.settings.label == state.reference,
                asked=settings_to_json(self.settings),
                read=settings_to_json(read),
            )
        run.progress.message(f"setting {self.index + 1}/{self.of}: {self.settings.label}")


class NotRestored(LabctlError):
    """Some ports of a saved run could not be put back: `failed` says which and what each holds, `restored`
    the lines of those that were."""

    def __init__(self, restored: list[str], failed: list[str], of: int) -> None:
        self.restored, self.failed = restored, failed
        super().__init__(f"{len(failed)} of {of} port(s) not restored: {'; '.join(failed)}")


def saved_ports(run_dir: Path) -> dict[str, LinkSettings] | None:
    """The ports of a run's `link-settings-before.json` and what each held before the sweep (host/ifname →
    settings); None where the run saved none (not a tune run, or it failed before reading any port)."""
    import json

    path = run_dir / BEFORE_FILE
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))["ports"]
        return {str(label): settings_from_json(data) for label, data in saved.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise InputError(f"{path}: not the link settings a tune run saves ({e})") from None


async def restore_saved(run_dir: Path, control: LinkControl) -> list[str]:
    """Put every port of a run's `link-settings-before.json` back (a crashed run's, from another process):
    one line per port, what it holds now; raises LabctlError naming each port that could not be put back
    and what it holds, where that could be read."""
    saved = saved_ports(run_dir)
    if saved is None:
        raise InputError(f"{run_dir / BEFORE_FILE}: no saved link settings (not a tune run's directory?)")
    lines, failed = [], []
    for label, want in saved.items():
        host, _, ifname = label.partition("/")
        port = PortRef(host, ifname)
        try:
            read = await control.apply(port, want)
        except LabctlError as e:
            held = "unknown settings"
            with contextlib.suppress(LabctlError):
                held = (await control.read(port)).label
            failed.append(f"{label} holds {held} ({e})")
            continue
        lines.append(f"{label}: {read.label} (as before the run)")
    if failed:
        raise NotRestored(lines, failed, len(saved))
    return lines


@contextlib.asynccontextmanager
async def _link_control_of(
    inventory: Inventory, profile: Profile, emit: Any, purpose: str
) -> AsyncIterator[LinkControl]:
    """The LinkControl of a lab built from `inventory` for one purpose outside a run (a crashed run's
    recovery, `labctl lab restore`, a dry run's support check): started (an agents' hub connects), then
    closed. Raises LabctlError where the lab offers none (`purpose` says what could not be done)."""
    from labctl.labs import build_lab
    from labctl.labs.base import LabContext
    from labctl.probes.sampling import ProbeSettings

    lab = build_lab(LabContext(inventory, profile, random.Random(), emit, ProbeSettings()))
    try:
        if lab.link_control is None:
            raise LabctlError(
                f"lab {inventory.lab} ({inventory.kind}) offers no link settings control: {purpose}"
            )
        await lab.start()
        yield lab.link_control
    finally:
        lab.close()
        await lab.aclose()


async def restore_run_link_settings(
    run_dir: Path, inventory: Inventory, profile: Profile, emit: Any
) -> list[str]:
    """`restore_saved` through the LinkControl of a lab built from `inventory` for the purpose (a crashed
    run's recovery, `labctl lab restore`): every saved port put back. Raises LabctlError where the lab
    offers no LinkControl."""
    purpose = f"{run_dir / BEFORE_FILE} cannot be restored from here"
    async with _link_control_of(inventory, profile, emit, purpose) as control:
        return await restore_saved(run_dir, control)


async def preview_tune(plan: Plan, inventory: Inventory, profile: Profile) -> tuple[list[str], bool]:
    """What `--dry-run` reads from the lab after listing the sweep: each swept port's support for every
    setting, as the run's first step checks it (`LinkControl.support`: reads only, nothing is set). One line
    where every port supports every setting, else a line per refusal (the run would stop at its first step,
    before changing anything), and whether there were none."""
    read = next(s for s in plan.program if isinstance(s, ReadLinkSettings))
    refusals = []
    events = EventLog(None, Timebase.capture())
    try:
        purpose = "its ports' support cannot be read"
        async with _link_control_of(inventory, profile, events.record, purpose) as control:
            for port, _ in read.ports:
                support = await control.support(port)
                refusals += [
                    f"{port.label}: cannot set {point.label}: {why}"
                    for point in read.points
                    if (why := support.refusal(point)) is not None
                ]
    finally:
        events.close()
    if not refusals:
        return [
            "",
            f"support read from the lab: all {len(read.ports)} swept ports support the {len(read.points)} "
            "settings (nothing was set)",
        ], True
    head = (
        f"support read from the lab: {len(refusals)} refusal(s); the run would stop before changing anything:"
    )
    return ["", head, *(f"  {line}" for line in refusals)], False


# -- around the run -------------------------------------------------------------------------------------


def _changes(before: LinkSettings | None, after: LinkSettings) -> str:
    """`autoneg (as found) → off, fec rs → off`: each field `after` sets, from what `before` set."""
    parts = []
    for name in ("autoneg", "speed_mbps", "duplex", "link_modes", "fec"):
        value = getattr(after, name)
        if value is None:
            continue
        was = getattr(before, name) if before is not None else None
        if was == value:
            continue
        parts.append(f"{name} {_show(was) if was is not None else '(as found)'} → {_show(value)}")
    flags_before = dict(before.priv_flags) if before is not None else {}
    for flag, on in after.priv_flags:
        if flags_before.get(flag) != on:
            was_flag = flags_before.get(flag)
            parts.append(f"{flag} {_show(was_flag) if was_flag is not None else '(as found)'} → {_show(on)}")
    return ", ".join(parts) or "no change"


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return "+".join(value)
    return str(value)


def describe_tune(plan: Plan, inventory: Inventory) -> list[str]:
    spec = plan.spec
    assert isinstance(spec, TuneSpec)
    read = next(s for s in plan.program if isinstance(s, ReadLinkSettings))
    applies = [s for s in plan.program if isinstance(s, ApplyLinkSettings)]
    total = sum(isinstance(s, Reconfigure) and not s.baseline for s in plan.program)
    lines = [
        f"{spec.name} on {inventory.lab} ({inventory.kind}): {len(applies)} link settings × "
        f"{spec.reconfigurations} reconfigurations ({total} after the baseline {spec.baseline}), "
        f"{len(read.ports)} ports, reference {read.reference}, order {spec.order}"
        + (f" (seed {spec.order_seed})" if spec.order == "random" else "")
        + "; nothing is set",
        "",
        f"read every port's settings (saved as {BEFORE_FILE}); set up the baseline {spec.baseline}",
    ]
    before: LinkSettings | None = None
    for step in applies:
        first = step.index * spec.reconfigurations + 1
        last = first + spec.reconfigurations - 1
        lines.append(f"setting {step.index + 1}/{step.of}: {step.settings.label} (reconfigs {first}-{last})")
        lines += [f"  {port.label}: {_changes(before, step.settings)}" for port, _ in step.ports]
        before = step.settings if before is None else step.settings.over(before)
    lines.append("at the end (and on abort or failure): every port set back as found")
    return lines


def record_tune(run_dir: Path, results: Sequence[Any]) -> dict[str, Any]:
    state = next((r for r in results if isinstance(r, TuneState)), None)
    return {} if state is None else {"link_settings": state.section()}


def tune_lines(summary: dict[str, Any]) -> list[str]:
    from labctl.analysis.settings import recommendation_lines

    lines = recommendation_lines(summary.get("by_link_setting"))
    state = summary.get("link_settings") or {}
    if state.get("restored") is False:
        held = [
            f"{p} holds {v['holds']['label'] if v.get('holds') else '?'}"
            for p, v in state["ports"].items()
            if not v.get("on_before")
        ]
        lines.append(f"[red]link settings NOT restored: {'; '.join(held)}[/]")
    return lines


KIND = ExperimentKind(
    "tune",
    "sweep NIC link settings (auto-negotiation, FEC, link modes, private flags) and time each one's link-up",
    compile_tune,
    describe_tune,
    record=record_tune,
    summary_lines=tune_lines,
    compile_read=compile_tune_read,
    preview=preview_tune,
)
