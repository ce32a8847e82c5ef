"""The run engine: executes a plan's steps on a lab, for every experiment kind and every lab kind.

It owns what every run shares: the one switch-apply path (`labctl.run.rails.RailWriter`), recovery waits
and their timeouts, abort and baseline restore, the event log, and the probes' lifecycle. The steps
(labctl.run.steps) execute themselves against it (`RunContext`), so it has no branch per step or per kind.
One reconfiguration = one phase applied on all rails concurrently, tagged with a number; the engine waits
until every port that got a new peer carries traffic again, or until the recovery timeout (recorded as a
`run.timeout` event naming the ports still down, never hidden). On cancellation (Ctrl-C, SIGTERM) it
restores the baseline, marks the run aborted and keeps every event. `labctl.run.lifecycle.run_experiment`
is a whole `labctl run` around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from labctl.core.clock import now_ns
from labctl.core.errors import LabctlError, LabFault
from labctl.core.events import EventLog, EventQueue, Kind
from labctl.inventory.mapping import Mapping, validate_mapping
from labctl.inventory.schema import Inventory, NicPort
from labctl.inventory.topology import peers_of, rail_scope
from labctl.labs.base import Lab
from labctl.linux.looplag import LoopLagMonitor, frozen_heap, middle_generation_deferred, slice_deadline
from labctl.ocs.protocol import YIELD_ABOVE_PORTS
from labctl.probes.base import ProbeContext, probe_kinds
from labctl.probes.sampling import Probe, TickCount, tick_counts
from labctl.run.experiment import Plan, RailPhase
from labctl.run.rails import RailWrite, RailWriter, moved_ports
from labctl.run.recovery import LinkWatch, RecoveryTracker
from labctl.run.steps import ProgressSink, Stage

log = logging.getLogger("labctl.run.engine")

FLUSH_INTERVAL_S = 0.5
PUMP_BATCH = 16
"""Events a pump takes from a probe's queue between looks at the clock (a few µs of recording)."""


class NullProgress:
    """A `ProgressSink` that shows nothing (the scheduler's workers, tests)."""

    def started(self, run_dir: Path, steps: int) -> None: ...
    def reconfig_started(self, stage: Stage, expected: int) -> None: ...
    def port_recovered(self, stage: Stage, recovered: int, expected: int) -> None: ...
    def reconfig_done(self, stage: Stage, timed_out: list[str]) -> None: ...
    def message(self, text: str) -> None: ...


class RunEngine:
    """Runs one plan on one lab, writing every event to `events` (a `labctl.run.steps.RunContext`)."""

    def __init__(
        self, plan: Plan, inventory: Inventory, lab: Lab, events: EventLog, progress: ProgressSink
    ) -> None:
        self.plan = plan
        self.inventory = inventory
        self.lab = lab
        self.events = events
        self.progress = progress
        self.rails = RailWriter(
            {rail: lab.switches[inventory.rail_switch(rail)] for rail in plan.rails}, on_change=self._retarget
        )
        self.results: list[Any] = []
        self.attenuated: dict[str, set[int]] = {}
        """Switch → ports a `voa:` step left attenuated: set back to 0 dB with the baseline on any exit."""
        """What the steps produced for the experiment kind to record (a replay's ReplayResult)."""
        self.reconfig = 0
        self.drops: dict[str, int] = {}
        """Each probe's dropped events, as last recorded (run.json `drops`)."""
        self.skipped: dict[str, int] = {}
        """Each sampler's skipped ticks, as last recorded (`sampler.skip`)."""
        self.loop_lag = LoopLagMonitor()
        self._moved_cache: dict[tuple[int, Mapping, Mapping], list[tuple[NicPort, NicPort | None]]] = {}
        self._affected_cache: dict[tuple[tuple[int, Mapping, Mapping], ...], list[dict[str, Any]]] = {}
        self._circuits_cache: dict[tuple[int, Mapping], dict[str, str | None]] = {}
        self._scopes: dict[int, frozenset[int]] = {}
        self._sources_of: dict[tuple[tuple[int, Mapping, Mapping], ...], list[str]] = {}
        self._sources_cache: dict[tuple[int, Mapping, Mapping], list[str]] = {}
        self._restoring = False
        self._abandon_restore = False
        self._connected: list[Any] = []
        self.final_state: dict[str, frozenset[tuple[int, int]] | str] = {}
        """Switch → the patches it held at the end (read back), or why that is not known."""
        self._force_restore = False  # a write was cut short: what the switches hold is not known here
        self._restores: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        """What steps changed outside the switches, with how to put it back (`add_restore`)."""
        self._gpu: Any = None
        self._roles: _ProbeRoles | None = None
        """The lab's probes by role, once they have started (each role is an isinstance check against a
        runtime Protocol, tens of µs a probe: not at every reconfiguration)."""

    @property
    def current(self) -> dict[int, Mapping]:
        """What each rail of the plan holds now (as far as this run wrote it)."""
        return self.rails.current

    # -- one reconfiguration ---------------------------------------------------------------------------------
    def _affected(
        self, target: dict[int, RailPhase], current: dict[int, Mapping] | None = None
    ) -> list[dict[str, Any]]:
        """The ports a change of every rail from `current` (default: as now) to `target` moves, each with
        its new peer (remembered: the same list each time, read only)."""
        current = self.current if current is None else current
        key = tuple((rail, current[rail], rp.mapping) for rail, rp in target.items())
        affected = self._affected_cache.get(key)
        if affected is None:
            affected = self._affected_cache[key] = [
                {
                    "source": port.source,
                    "host": port.host,
                    "port": port.ifname,
                    "rail": rail,
                    "peer": peer.source if peer else None,
                }
                for rail, rp in target.items()
                for port, peer in self._moved(rail, current[rail], rp.mapping)
            ]
        return affected

    def _affected_sources(self, target: dict[int, RailPhase]) -> list[str]:
        """The sources of `_affected(target)` (remembered likewise)."""
        key = tuple((rail, self.current[rail], rp.mapping) for rail, rp in target.items())
        sources = self._sources_of.get(key)
        if sources is None:
            sources = self._sources_of[key] = [p["source"] for p in self._affected(target)]
        return sources

    def _work_out_plan(self) -> None:
        """Work out every change the plan makes (moved ports, circuits) before anything samples: at
        hundreds of ports each is milliseconds of loop time that would otherwise land on a sampler's tick
        at the start of its reconfiguration."""
        current = dict(self.current)
        phases = [self.plan.baseline] + [phase for _, phase in self.plan.steps]
        for phase in phases:
            target = self.plan.phases[phase]
            self._affected(target, current)
            for rail, rp in target.items():
                self._circuits(rail, rp.mapping)
                validate_mapping(rp.mapping, self.inventory.switches[rp.switch].space, switch=rp.switch)
                current[rail] = rp.mapping

    def _moved(self, rail: int, before: Mapping, after: Mapping) -> list[tuple[NicPort, NicPort | None]]:
        """moved_ports, remembered: a cycle repeats the same few changes, and at hundreds of ports working
        one out is a millisecond of loop time at the start of every reconfiguration."""
        key = (rail, before, after)
        moved = self._moved_cache.get(key)
        if moved is None:
            moved = self._moved_cache[key] = moved_ports(self.inventory, rail, before, after)
        return moved

    def _circuits(self, rail: int, mapping: Mapping) -> dict[str, str | None]:
        """Port source → the source of its peer under `mapping` (None: dark), remembered likewise."""
        key = (rail, mapping)
        circuits = self._circuits_cache.get(key)
        if circuits is None:
            peers = peers_of(self.inventory, rail, mapping)
            circuits = self._circuits_cache[key] = {
                p.source: (q.source if q else None) for p, q in peers.items()
            }
        return circuits

    def _rail_write(self, rp: RailPhase) -> RailWrite:
        scope = self._scopes.get(rp.rail)
        if scope is None:  # the rail's switch ports: worked out once (hundreds of ports, each time the same)
            scope = self._scopes[rp.rail] = frozenset(rail_scope(self.inventory, rp.rail))
        return RailWrite(rp.rail, rp.mapping, scope)

    async def _apply_rails(self, target: dict[int, RailPhase]) -> None:
        """Every rail of a phase at once (the rails of one switch as one command); the first rail's error,
        once every switch has answered."""
        outcomes = await self.rails.write_rails([self._rail_write(rp) for rp in target.values()])
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome

    async def _retarget(self, rail: int, before: Mapping, after: Mapping) -> None:
        """A rail changed (the switch acknowledged): tell the probes what moved, and re-target traffic
        only now, so the old circuit is probed until it is gone and the moment its traffic stops is
        measured too."""
        key = (rail, before, after)
        moved = self._sources_cache.get(key)
        if moved is None:
            moved = self._sources_cache[key] = [port.source for port, _ in self._moved(rail, before, after)]
        roles = self._probe_roles()
        for aware in roles.switch_aware:
            aware.switched(moved)
        if len(moved) > YIELD_ABOVE_PORTS:  # hundreds: the other rail's acknowledgement and samplers between
            await asyncio.sleep(0)
        circuits = self._circuits(rail, after)
        for probe in roles.circuit:
            probe.set_circuits(dict(circuits))  # a copy: the remembered one stays as it is

    async def reconfigure(
        self,
        phase: str,
        step: int | None,
        *,
        measured: bool = True,
        wait: bool = True,
        stage: Stage | None = None,
    ) -> list[str]:
        """Apply `phase` on every rail; returns the ports that did not recover in time."""
        n = self.reconfig
        stage = stage or Stage("baseline", phase)
        target = self.plan.phases[phase]
        ports = self._affected(target)
        expected = {p["source"]: p["peer"] for p in ports if p["peer"] is not None}
        self.events.reconfig = n
        t0 = now_ns()
        self.events.emit(
            t0,
            Kind.PHASE,
            "controller",
            phase,
            meta={
                "step": step,
                "measured": measured,
                "rails": list(target),
                "ports": ports,
            },
        )
        self.progress.reconfig_started(stage, len(expected) if wait else 0)
        timeout_ns = round(self.plan.spec.recovery_timeout_s * 1e9)
        tracker = RecoveryTracker(
            expected,
            t0,
            lambda k: self.progress.port_recovered(stage, k, len(expected)),
            deadline_ns=t0 + timeout_ns if wait else None,
        )
        unsubscribe = self.events.subscribe(tracker)
        pending: list[str] = []
        roles = self._probe_roles()
        if roles.window:
            sources = self._affected_sources(target)
            for probe in roles.window:
                probe.open_window(sources)
        self.loop_lag.open_window()
        await asyncio.sleep(0)  # let samplers due now run before the rails' commands are worked out
        try:
            with middle_generation_deferred():
                await self._apply_rails(target)
                if wait:
                    try:
                        await asyncio.wait_for(tracker.done.wait(), max(t0 + timeout_ns - now_ns(), 0) / 1e9)
                    except TimeoutError:
                        pending = sorted(tracker.pending)
                        self.events.emit(
                            now_ns(),
                            Kind.RUN_TIMEOUT,
                            "controller",
                            len(pending),
                            meta={
                                "pending": pending,
                                "timeout_s": self.plan.spec.recovery_timeout_s,
                            },
                        )

        finally:
            for probe in roles.window:
                probe.close_window()
            unsubscribe()
            # How late the loop ran in this window: context for every mark observed in it.
            self.events.emit(now_ns(), Kind.LOOP_LAG, "controller", self.loop_lag.window_max_ns)
            # An interrupted reconfiguration keeps its number too: the baseline restore that follows an
            # abort must not be filed under it (its acknowledgement would become this one's t1).
            self.reconfig += 1
            await self.events.flush_durably()
        self.progress.reconfig_done(stage, pending)
        return pending

    def _probe_roles(self) -> _ProbeRoles:
        return self._roles if self._roles is not None else _ProbeRoles(self.lab)

    # -- the whole run ---------------------------------------------------------------------------------
    async def _pump(self, probe: Any) -> None:
        """Record a probe's events as they come. A burst (hundreds of ports reporting at once) is recorded
        a time slice per loop turn, taken from the queue a few events at a time (per event, an async
        iterator's step and a clock read cost as much as recording it)."""
        queue, record = getattr(probe, "queue", None), self.events.record
        if not isinstance(queue, EventQueue):
            deadline = 0
            async for event in probe.events():
                deadline = deadline or slice_deadline()
                record(event)
                if now_ns() >= deadline:
                    await asyncio.sleep(0)
                    deadline = 0
        else:
            while await queue.wait():
                deadline = slice_deadline()  # the first event after the queue ran dry starts a slice
                while batch := queue.pop(PUMP_BATCH):
                    for event in batch:
                        record(event)
                    if now_ns() >= deadline:
                        await asyncio.sleep(0)
                        deadline = slice_deadline()
        # The stream ended while the run goes on: a probe that died (its sampler raised, its thread
        # stopped) fails the run naming it, rather than the run finishing without its data.
        failure = getattr(probe, "failure", lambda: None)()
        if failure is not None:
            self._probe_failed(probe, failure)

    def _probe_exit(self, probe: Any) -> Callable[..., Awaitable[bool]]:
        """Stop a probe; one that died re-raises its failure on the way out, which is the lab's fault by now
        (or made so here, if it died as the run ended) and must not cut the rest of the shutdown short."""

        async def exit_(*exc_details: Any) -> bool:
            failure = getattr(probe, "failure", lambda: None)()
            try:
                await probe.__aexit__(*exc_details)
            except Exception as e:
                if e is not failure:
                    raise
                self._probe_failed(probe, e)
            return False

        return exit_

    def _probe_failed(self, probe: Any, failure: BaseException) -> None:
        cause = str(failure) if isinstance(failure, LabctlError) else f"{type(failure).__name__}: {failure}"
        self.lab.fault.raise_(f"probe {probe.name} stopped: {cause}")

    def _record_drops(self, *, final: bool = False) -> None:
        """Dropped events and skipped ticks, each time they grow: a live reader (the dashboard) sees a thinned
        sampler while the run goes on, not only in run.json at its end. While it goes on, only a sampler's
        own tick count is read (a probe's whole `stats()` can take milliseconds of loop time at hundreds of
        ports); once the probes have stopped (`final`), their stats, an agent's samplers' with them."""
        for probe in self.lab.probes:
            dropped = probe.dropped
            if dropped > self.drops.get(probe.name, 0):
                self.drops[probe.name] = dropped
                self.events.emit(now_ns(), Kind.SAMPLER_DROP, f"probe:{probe.name}", dropped)
            count = getattr(probe, "tick_count", None)
            stats = getattr(probe, "stats", None)
            if isinstance(count, TickCount):
                counted = tick_counts(probe.name, count.stats())
            elif final and stats is not None:
                counted = tick_counts(probe.name, stats())
            else:
                continue
            for name, counts in counted.items():
                skipped = counts["ticks_skipped"]
                if skipped > self.skipped.get(name, 0):
                    self.skipped[name] = skipped
                    meta = {"stalls": counts["stalls"], "stall_longest_ns": counts["stall_longest_ns"]}
                    self.events.emit(now_ns(), Kind.SAMPLER_SKIP, f"probe:{name}", skipped, meta=meta)

    async def _flusher(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            self._record_drops()
            self.events.flush()

    async def sequence(self) -> None:
        """Execute the plan's program, step by step: each step executes itself against this engine
        (labctl.run.steps; decision 0037)."""
        for step in self.plan.program:
            await step.execute(self)

    async def baseline(self, phase: str) -> None:
        spec = self.plan.spec
        expected = sum(
            peer is not None
            for rail, rp in self.plan.phases[phase].items()
            for _, peer in self._moved(rail, self.current[rail], rp.mapping)
        )
        pending = await self.reconfigure(phase, None, measured=True)
        if pending:
            # Every later measurement would start from a broken lab: say so and stop, not "completed".
            shown = ", ".join(pending[:8]) + (" ..." if len(pending) > 8 else "")
            raise LabctlError(
                f"baseline '{phase}' did not come up: {len(pending)} of {expected} ports not "
                f"recovered within {spec.recovery_timeout_s:g} s ({shown})"
            )

    def links_up(self, changes: list[tuple[int, Mapping, Mapping]], t0_ns: int) -> LinkWatch:
        """Start watching, now, for every port the planned changes move to carry traffic to its new peer (a
        replay's `ready: link`); its `wait` ends then, or at the recovery timeout (recorded as `run.timeout`,
        like a reconfiguration's). Subscribed before the write is sent: nothing recorded during it (another
        rail's retry) is missed."""
        expected = {
            port.source: peer.source
            for rail, before, after in changes
            for port, peer in self._moved(rail, before, after)
            if peer is not None
        }
        timeout_s = self.plan.spec.recovery_timeout_s
        deadline = t0_ns + round(timeout_s * 1e9)
        tracker = RecoveryTracker(expected, t0_ns, lambda k: None, deadline_ns=deadline)
        return LinkWatch(tracker, self.events.subscribe(tracker), deadline, self.events, timeout_s)

    def add_restore(self, what: str, restore: Callable[[], Awaitable[None]]) -> None:
        """A step changed the lab outside the switches (a port's link settings): `restore` puts it back when
        the run ends, however it ends (completed, failed, aborted), before the baseline is restored; the
        latest first. A restore that raises fails the run with its message; a second signal abandons it as it
        abandons the baseline's."""
        self._restores.append((what, restore))

    async def _run_restores(self) -> tuple[list[str], bool]:
        """Every `add_restore`, latest first: (what failed, as `what NOT restored: why`; abandoned)."""
        failed: list[str] = []
        self._restoring = True
        try:
            while self._restores:
                what, restore = self._restores.pop()
                try:
                    await restore()
                except asyncio.CancelledError:
                    _absorb_cancel()
                    failed.append(f"{what} NOT restored (abandoned)")
                    return failed, True
                except Exception as e:
                    failed.append(f"{what} NOT restored: {e}")
        finally:
            self._restoring = False
        return failed, False

    def unclean(self) -> None:
        """A write was cut short (cancelled, timed out, failed): it may have moved part of a rail that
        `current` still calls the baseline, so the restore must not be skipped as "nothing moved"."""
        self._force_restore = True

    async def gpu_bench(self, stage: Literal["before", "after"]) -> None:
        """The experiment's `gpu:` microbenchmarks at one stage (skipped, with an event, without a GPU)."""
        if self.plan.spec.gpu is None:
            return
        if self._gpu is None:
            from labctl.probes.gpu.step import GpuStep

            self._gpu = GpuStep.from_settings(self.plan.spec.gpu, self.events, self.progress.message)
        await self._gpu.run(stage)

    async def _sequence_unless_faulted(self) -> None:
        """The sequence, stopped early by a fault the lab reports (`lab.fault`, a FaultLatch), or by our own
        cancellation."""
        work = asyncio.create_task(self.sequence(), name="sequence")
        fault = asyncio.create_task(self.lab.fault.wait(), name="lab-fault")
        try:
            await asyncio.wait({work, fault}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            fault.cancel()
            if not work.done():  # a fault, or we are being cancelled: stop the sequence where it is
                work.cancel()
            await asyncio.gather(work, fault, return_exceptions=True)
        # The lab's fault decides the outcome whatever the sequence ended with (cancelled, or an error raised
        # while it was being stopped): the agent's reason is the run's cause.
        reason = self.lab.fault.reason
        if reason is not None:
            self.events.emit(now_ns(), Kind.RUN_FAULT, "controller", reason)
            raise LabFault(reason)
        work.result()

    async def restore_baseline(self) -> None:
        await self._clear_attenuation()
        baseline = self.plan.phases[self.plan.baseline]
        unsure = (
            self._force_restore or self.rails.unsure
        )  # a write cut short: what the switches hold is unknown
        if unsure or any(self.current[rail] != rp.mapping for rail, rp in baseline.items()):
            phase = self.plan.baseline
            await self.reconfigure(phase, None, measured=False, wait=False, stage=Stage("restore", phase))

    async def _clear_attenuation(self) -> None:
        """A run stopped mid-sweep leaves no attenuator set: the light the next run sees is the patch's."""
        from labctl.ocs.protocol import attenuator_of

        for switch, ports in list(self.attenuated.items()):
            attenuator = attenuator_of(self.lab.switches.get(switch))
            if ports and attenuator is not None:
                await attenuator.set_attenuation(tuple(sorted(ports)), 0.0)
            del self.attenuated[switch]

    def _switch_power_probes(self) -> list[Probe]:
        """The switches' own power monitors on the rails' ports, when the experiment asks for them."""
        if not self.plan.spec.probes.switch_power_hz:
            return []
        ports: dict[str, set[int]] = {}
        for rail in self.plan.rails:
            ports.setdefault(self.inventory.rail_switch(rail), set()).update(rail_scope(self.inventory, rail))
        watched = [(self.lab.switches[sw], sorted(p)) for sw, p in ports.items()]
        ctx = ProbeContext(self.plan.spec.probes, switches=watched)
        return [probe_kinds.get("switch-power").build(ctx)]

    async def _read_final_state(self) -> None:
        """Record what every switch holds at the end (an `ocs.read` event per switch)."""
        for sw in self._connected:
            try:
                got = await sw.get_mapping()
            except (Exception, asyncio.CancelledError) as e:
                self.final_state[sw.name] = f"final read-back failed: {e!r}"
                self.events.emit(now_ns(), Kind.OCS_ERROR, f"ocs:{sw.name}", f"final read-back failed: {e!r}")
            else:
                self.final_state[sw.name] = frozenset((int(a), int(b)) for a, b in got.value)

    def switch_state(self) -> dict[str, dict[str, Any]]:
        """Per switch of the plan's rails, what it holds on the run's ports at the end against the baseline
        (run.json `switch_state`): `on_baseline` true, false, or None where not known (never connected, the
        read-back failed: `read` says why); where not true, the baseline's patches and scope, which `labctl
        ocs apply` takes as a mapping file. `written`: whether this run sent the switches anything;
        `in_process`: a switch that lived in this process (a model), whose state ends with it."""
        wanted: dict[str, tuple[set[tuple[int, int]], set[int]]] = {}
        for rail, rp in self.plan.phases[self.plan.baseline].items():
            patches, scope = wanted.setdefault(rp.switch, (set(), set()))
            patches.update(rp.mapping)
            scope.update(rail_scope(self.inventory, rail))
        state: dict[str, dict[str, Any]] = {}
        for name, (patches, scope) in sorted(wanted.items()):
            spec = self.inventory.switches.get(name)
            entry: dict[str, Any] = {
                "baseline": self.plan.baseline,
                "written": self.rails.touched,
                # the lab's own model (the sim driver, or an emulator the lab served): it ends with the run
                "in_process": bool(spec is not None and spec.over_model),
            }
            held = self.final_state.get(name)
            if held is None:
                entry.update(
                    on_baseline=None, holds=None, read="never connected: it holds what it held before"
                )
            elif isinstance(held, str):
                entry.update(on_baseline=None, holds=None, read=held)
            else:
                mine = sorted(p for p in held if p[0] in scope or p[1] in scope)
                entry.update(on_baseline=set(mine) == patches, holds=[list(p) for p in mine], read="ocs.read")
            if not entry["on_baseline"]:
                entry.update(
                    baseline_patches=[list(p) for p in sorted(patches)], baseline_scope=sorted(scope)
                )
            state[name] = entry
        return state

    async def run(self) -> tuple[str, str | None]:
        """Returns (status, error), whatever happens to the caller.

        The caller's first cancellation (Ctrl-C) stops the sequence and restores the baseline; a second one
        abandons the restore; later ones are ignored, so the switches are closed, the probes stopped and the
        run directory finished in every case. The work runs in its own task: a burst of signals lands here,
        never at an arbitrary await inside clean-up code.
        """
        work = asyncio.create_task(self._run(), name="controller")
        current = asyncio.current_task()
        cancels = 0
        while True:
            try:
                return await asyncio.shield(work)
            except Exception as e:  # raised while closing switches or the lab: the run still gets its cause
                log.exception("run clean-up failed")
                return "failed", f"clean-up failed: {type(e).__name__}: {e}"
            except asyncio.CancelledError:
                if current is None:
                    raise
                current.uncancel()
                if work.cancelled():  # stopped before it began: nothing was started, nothing to undo
                    error = "interrupted by signal"
                    self.events.emit(now_ns(), Kind.RUN_ABORT, "controller", error)
                    self.lab.close()
                    return "aborted", error
                if work.done():  # finished as the signal came: its outcome stands
                    return work.result()
                cancels += 1
                if cancels == 1:
                    work.cancel()
                elif cancels == 2:
                    self._abandon_restore = True
                    if self._restoring:
                        work.cancel()

    async def _start(self, stack: contextlib.AsyncExitStack, tasks: list[asyncio.Task[None]]) -> None:
        """Start the lab, connect every switch, start every probe; `stack` undoes what got done."""
        self._work_out_plan()
        # Before anything samples: freezing collects the heap once (~30 ms at 512 ports).
        stack.enter_context(frozen_heap())
        # LIFO: after every switch has closed; pushed first so a start that fails midway is undone too.
        stack.push_async_callback(self.lab.aclose)
        await self.lab.start()
        for sw in self.lab.switches.values():
            await sw.connect()
            stack.push_async_callback(sw.close)
            self._connected.append(sw)
        self.lab.probes.extend(self._switch_power_probes())
        self._roles = _ProbeRoles(self.lab)
        for aware in self._roles.switch_aware:
            aware.expect_switch_acks()
        # What is recorded so far, durably, before anything samples: the first fsync also starts the worker
        # thread every later one runs in (its import and start cost milliseconds of loop time, which at the
        # end of the first reconfiguration landed on the samplers' ticks).
        await self.events.flush_durably()
        for probe in self.lab.probes:
            await probe.__aenter__()
            stack.push_async_exit(self._probe_exit(probe))
            tasks.append(asyncio.create_task(self._pump(probe), name=f"pump:{probe.name}"))
        tasks.append(asyncio.create_task(self._flusher(), name="flusher"))
        await stack.enter_async_context(self.loop_lag)

    async def _run(self) -> tuple[str, str | None]:
        status, error = "completed", None
        tasks: list[asyncio.Task[None]] = []
        async with contextlib.AsyncExitStack() as stack:
            try:
                await self._start(stack, tasks)
                await self._sequence_unless_faulted()
            except asyncio.CancelledError:
                _absorb_cancel()
                status, error = "aborted", "interrupted by signal"
                self.events.emit(now_ns(), Kind.RUN_ABORT, "controller", error)
            except LabctlError as e:
                status, error = "failed", str(e)
                log.error("run failed: %s", e)
            except Exception as e:  # a bug or an unforeseen fault: the baseline is still restored below
                status, error = "failed", f"internal error: {type(e).__name__}: {e}"
                self.events.emit(now_ns(), Kind.RUN_FAULT, "controller", error)
                log.exception("run failed")
            abandoned = self._abandon_restore
            if self._restores and not abandoned:
                failed, abandoned = await self._run_restores()
                if failed:
                    error = "; ".join(filter(None, [error, *failed]))
                    status = "aborted" if abandoned else ("failed" if status == "completed" else status)
            elif self._restores:
                what = ", ".join(w for w, _ in self._restores)
                error = "; ".join(filter(None, [error, f"{what} NOT restored (abandoned)"]))
            # Nothing was changed (e.g. a switch never connected): nothing to put back.
            if (self.rails.touched or self.attenuated) and not abandoned:
                self._restoring = True
                try:
                    await self.restore_baseline()
                except asyncio.CancelledError:
                    _absorb_cancel()
                    abandoned = True
                except Exception as e:
                    error = (error + "; " if error else "") + f"baseline NOT restored: {e}"
                    status = "failed" if status == "completed" else status
                finally:
                    self._restoring = False
            if abandoned and self.rails.touched:
                error, status = (error or "") + "; baseline NOT restored (abandoned)", "aborted"
            await self._read_final_state()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        # A fault the lab reported while it was stopping (an agent lost after the last step) still means the
        # run's data cannot be trusted to be complete.
        if status == "completed" and self.lab.fault.reason is not None:
            status, error = "failed", self.lab.fault.reason
        # Probes have stopped: drain what their queues still hold (what they said while stopping: final
        # estimates, a last sample), then close the lab's models.
        for probe in self.lab.probes:
            queue = getattr(probe, "queue", None)
            if isinstance(queue, EventQueue):
                for event in queue.drain():
                    self.events.record(event)
        self._record_drops(final=True)
        self.lab.close()
        return status, error


class _ProbeRoles:
    """A lab's probes by what the engine tells them (`Lab.switch_aware_probes`, ...), looked up once."""

    def __init__(self, lab: Lab) -> None:
        self.switch_aware = lab.switch_aware_probes
        self.circuit = lab.circuit_probes
        self.window = lab.window_probes


def _absorb_cancel() -> None:
    """This task handled a cancellation itself: clear it, so later awaits in clean-up are not cancelled."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
