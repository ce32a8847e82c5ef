"""What an agent does for each command the controller may send: the allow-list and its handlers.

`start`/`stop` its probes, `set_circuits`, `window` and `switched` for them, `ping` for the clock
exchange, `inspect` (read-only) and `link` (its ports' link settings); each command's arguments are
validated, and each command is acted on once however often it comes (and answered each time).
`AgentCommands` is a part of `labctl.agents.agent.Agent` (a mixin): the agent's `__init__` sets the
state named below.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec

from labctl.agents.clock import HostClock
from labctl.agents.clockping import ClockResponder
from labctl.agents.inspect import inspect_host
from labctl.agents.mirror import FabricMirror
from labctl.agents.wire import (
    CircuitArgs,
    Command,
    LinkArgs,
    PingArgs,
    Rejected,
    Rejections,
    Reply,
    StartArgs,
    StopArgs,
    SwitchedArgs,
    WindowArgs,
    _enc,
)
from labctl.core.errors import LabctlError
from labctl.inventory.profiles import Profile
from labctl.inventory.schema import Inventory, NicPort
from labctl.labs.base import ReconfigWindow
from labctl.linux.timesync import clock_sync_state
from labctl.models.fabric import SimFabric
from labctl.nic.settings import (
    LinkControl,
    LinkSettingMismatch,
    LinkSettingUnsupported,
    PortRef,
    settings_from_json,
    settings_to_json,
    support_to_json,
)
from labctl.probes.base import ProbeContext, probe_kinds
from labctl.probes.sampling import CircuitProbe, Probe, ProbeSettings

log = logging.getLogger("labctl.agents")


class AgentCommands:
    """Answers the controller's commands: one at a time, each handler's effect on this host's probes."""

    inventory: Inventory
    host: str
    incarnation: str
    agent_context: Callable[[Inventory, str, ProbeSettings, SimFabric | None], ProbeContext]
    allowed_probes: tuple[str, ...]
    mirrors_world: bool
    mirror: FabricMirror | None
    world_offset_ns: int
    mirror_lag_ns: int
    clock: HostClock
    clock_responder: ClockResponder | None
    link_control: LinkControl | None
    ports: list[NicPort]
    sources: set[str]
    all_sources: set[str]
    rejections: Rejections
    seq: int
    sent_events: int
    _probes: dict[str, Probe]
    _pumps: dict[str, asyncio.Task[None]]
    _handled: OrderedDict[int, Reply]
    _cmd_lock: asyncio.Lock
    _replying: set[asyncio.Task[bool]]
    _identity: dict[str, Any]
    _topics: dict[str, str]

    if TYPE_CHECKING:

        def now(self) -> int: ...
        async def flush(self) -> None: ...
        async def _publish(self, topic_name: str, body: bytes, *, retain: bool = False) -> bool: ...
        async def _pump(self, probe: Probe) -> None: ...
        async def _stop_probes(self, names: list[str]) -> dict[str, Any]: ...

    async def _command(self, cmd: Command, t_rx: int) -> None:
        handler = self.COMMANDS.get(cmd.op)
        if handler is not None:  # (one not allowed is logged as a rejection)
            # Clock pings come several a second while a run goes: at debug; the other commands (a few per
            # reconfiguration) at info. The operation and its id only: a start's arguments are its settings.
            (log.debug if cmd.op == "ping" else log.info)(
                "agent %s: command %s (id %d)",
                self.host,
                cmd.op,
                cmd.id,
                extra={"host": self.host, "op": cmd.op, "cmd_id": cmd.id},
            )
        if handler is None:
            self.rejections.add("unauthorised", f"command {cmd.op!r} is not allowed", self._topics["cmd"])
            reply = Reply(host=self.host, id=cmd.id, op=cmd.op, ok=False, error="command not allowed")
        elif cmd.id in self._handled:  # QoS 1 may deliver twice: answer again, act once
            reply = self._handled[cmd.id]
        else:
            async with self._cmd_lock:
                try:
                    reply = await handler(self, cmd, t_rx)
                except Rejected as r:
                    self.rejections.add(r.kind, f"{cmd.op}: {r.reason}", self._topics["cmd"])
                    reply = Reply(host=self.host, id=cmd.id, op=cmd.op, ok=False, error=r.reason)
                except Exception as e:  # a failing command must not take the agent down
                    log.exception("agent %s: %s failed", self.host, cmd.op)
                    reply = Reply(
                        host=self.host, id=cmd.id, op=cmd.op, ok=False, error=f"{cmd.op} failed: {e!r}"
                    )
            self._handled[cmd.id] = reply
            while len(self._handled) > 256:
                self._handled.popitem(last=False)
        reply.incarnation = self.incarnation
        if cmd.op == "ping" and reply.ok:
            # What the controller needs to tell a shared clock (boot id, time namespace) and to use the
            # hosts' clock daemons (this clock and CLOCK_REALTIME read together), with the pong's t3.
            real = time.time_ns()
            reply.t3 = self.now()
            reply.data = {"clock": {**self._identity, "mono_ns": reply.t3, "real_ns": real}}
            if self.clock_responder is not None and self.clock_responder.address is not None:
                reply.data["clock_udp"] = list(self.clock_responder.address)
        # Not awaited here: the message loop must not wait for the broker's PUBACK of a reply.
        task = asyncio.create_task(self._publish(self._topics["reply"], _enc.encode(reply)))
        self._replying.add(task)
        task.add_done_callback(self._replying.discard)

    def _args(self, kind: type[Any], cmd: Command) -> Any:
        try:
            return msgspec.convert(cmd.args, kind)
        except msgspec.ValidationError as e:
            raise Rejected("malformed", f"bad arguments: {e}") from None

    async def _cmd_ping(self, cmd: Command, t_rx: int) -> Reply:
        self._args(PingArgs, cmd)
        return Reply(host=self.host, id=cmd.id, op=cmd.op, ok=True, t2=t_rx)

    async def _cmd_start(self, cmd: Command, t_rx: int) -> Reply:
        args: StartArgs = self._args(StartArgs, cmd)
        unknown = sorted(set(args.probes) - set(self.allowed_probes))
        if unknown or not args.probes:
            raise Rejected(
                "malformed", f"probes {unknown} are not run here (allowed: {', '.join(self.allowed_probes)})"
            )
        try:
            settings = ProbeSettings.model_validate(args.settings)
            profile = Profile.model_validate(args.profile)
        except ValueError as e:
            raise Rejected("malformed", f"bad settings or profile: {str(e).splitlines()[0]}") from None
        await self._stop_probes(list(self._probes))
        await self.flush()  # whatever an earlier run left goes out first: this run's stream starts after it
        seq0, n0 = self.seq, self.sent_events
        if self.mirror is not None:
            self.mirror.cancel_pending()
        self.mirror_lag_ns = max(0, args.mirror_lag_ns) if self.mirrors_world else 0
        if self.mirrors_world:
            self.mirror = FabricMirror(
                self.inventory, profile, random.Random(args.seed), lag_ns=self.mirror_lag_ns
            )
        self.world_offset_ns = args.world_offset_ns
        # This host's probes, built from the registry where its lab kind says they look (the mirror of the
        # controller's model, or the host's own interfaces).
        ctx = self.agent_context(self.inventory, self.host, settings, self.mirror)
        probes = {name: probe_kinds.get(name).build(ctx) for name in sorted(set(args.probes))}
        for name, probe in probes.items():
            await probe.__aenter__()
            self._probes[name] = probe
            self._pumps[name] = asyncio.create_task(self._pump(probe), name=f"agent:{self.host}:{name}")
        log.info(
            "agent %s: probes started: %s",
            self.host,
            ", ".join(probes),
            extra={"host": self.host, "probes": list(probes), "cmd_id": cmd.id, "seed": args.seed},
        )
        sync = await asyncio.to_thread(clock_sync_state)
        return Reply(host=self.host, id=cmd.id, op=cmd.op, ok=True, seq=seq0, n=n0, data={"time_sync": sync})

    async def _cmd_stop(self, cmd: Command, t_rx: int) -> Reply:
        args: StopArgs = self._args(StopArgs, cmd)
        names = list(self._probes) if args.probes is None else args.probes
        if set(names) - set(self.allowed_probes):
            raise Rejected(
                "malformed", f"probes {sorted(set(names) - set(self.allowed_probes))} are not run here"
            )
        if self.mirror_lag_ns and self._probes:
            # The mirror's probes sample the model `lag` behind it: let them reach the moment of this stop
            # (and the commands received before it take effect) before they end.
            await asyncio.sleep(self.mirror_lag_ns / 1e9)
        stats = await self._stop_probes(names)
        await self.flush()  # everything sampled so far goes out before the reply that counts it
        # By probe name; and what this agent refused so far (run.json agents.agent_rejected.<host>).
        data: dict[str, Any] = {"probes": stats, "rejected": self.rejections.as_dict()}
        if self.mirror is not None:
            data["world"] = self.mirror.stats()
        return Reply(
            host=self.host, id=cmd.id, op=cmd.op, ok=True, seq=self.seq, n=self.sent_events, data=data
        )

    async def _cmd_set_circuits(self, cmd: Command, t_rx: int) -> Reply:
        args: CircuitArgs = self._args(CircuitArgs, cmd)
        for source, peer in args.circuits.items():
            if source not in self.sources:
                raise Rejected("unauthorised", f"{source} is not a port of {self.host}")
            if peer is not None and peer not in self.all_sources:
                raise Rejected("malformed", f"unknown peer port {peer}")

        def act() -> None:
            for probe in self._probes.values():
                if isinstance(probe, CircuitProbe):
                    probe.set_circuits(args.circuits)

        self._after_lag(act, t_rx, args.t_ns)
        return Reply(host=self.host, id=cmd.id, op=cmd.op, ok=True)

    async def _cmd_window(self, cmd: Command, t_rx: int) -> Reply:
        """The controller's reconfiguration window, for the probes that sample harder inside one."""
        args: WindowArgs = self._args(WindowArgs, cmd)
        if args.open is not None and set(args.open) - self.sources:
            raise Rejected("unauthorised", f"window names ports not on {self.host}")

        def act() -> None:
            for probe in self._probes.values():
                if isinstance(probe, ReconfigWindow):
                    if args.open is None:
                        probe.close_window()
                    else:
                        probe.open_window(args.open)

        self._after_lag(act, t_rx, args.t_ns)
        return Reply(host=self.host, id=cmd.id, op=cmd.op, ok=True)

    async def _cmd_switched(self, cmd: Command, t_rx: int) -> Reply:
        """The switch acknowledged moving these ports' light: for the probes that act on it (the Rx-power
        poller reports each port's next sample), as the controller tells its own probes."""
        args: SwitchedArgs = self._args(SwitchedArgs, cmd)
        if set(args.sources) - self.sources:
            raise Rejected("unauthorised", f"switched names ports not on {self.host}")

        def act() -> None:
            for probe in self._probes.values():
                switched = getattr(probe, "switched", None)
                if callable(switched):
                    switched(args.sources)

        self._after_lag(act, t_rx, args.t_ns)
        return Reply(host=self.host, id=cmd.id, op=cmd.op, ok=True)

    def _after_lag(self, act: Callable[[], None], t_rx: int, t_ns: int | None) -> None:
        """Run a notice's effect on the probes where this host's probes are in time: at once; or, for a
        mirror running `lag` behind the model, on the mirror's timeline at the controller's moment (`t_ns`,
        its clock, mapped as the world feed's items are), so that a circuit, window or switch notice reaches
        the samplers at the point of the model's time the controller's own probes would see it, in order
        with the light it goes with, however late the broker delivered it (a re-target that waited for a
        busy broker would otherwise leave the old circuit probed, and the new one's traffic marked late by
        the delay, on no record). From an older controller (no `t_ns`): `lag` after it arrived."""
        if self.mirror is None or not self.mirror.lag_ns:
            act()
            return
        if t_ns is None:
            self.mirror.at(self.clock.raw(t_rx) + self.mirror.lag_ns, act)
            return
        self.mirror.notice(self.clock.raw(t_ns + self.world_offset_ns) + self.mirror.lag_ns, act)

    async def _cmd_inspect(self, cmd: Command, t_rx: int) -> Reply:
        """Read-only facts about this host's ports, for `labctl lab check` (labctl.agents.inspect)."""
        if cmd.args:
            raise Rejected("malformed", "inspect takes no arguments")
        data = await asyncio.to_thread(inspect_host, self.ports)
        return Reply(host=self.host, id=cmd.id, op=cmd.op, ok=True, data=data)

    async def _cmd_link(self, cmd: Command, t_rx: int) -> Reply:
        """One of this host's ports' link settings: what it supports, what it holds, or set (read back and
        verified by the local LinkControl). A port or setting it refuses is an answer (`data.refusal`:
        unsupported, mismatch, failed), not a rejection: the controller raises it as a local one would."""
        args: LinkArgs = self._args(LinkArgs, cmd)
        if args.port not in {p.ifname for p in self.ports}:
            raise Rejected("unauthorised", f"{args.port} is not a port of {self.host}")
        if (args.op == "apply") != (args.settings is not None):
            raise Rejected("malformed", "settings go with apply, and only with it")
        control = self.link_control
        if control is None:
            raise Rejected("malformed", f"a {self.inventory.kind} lab's agent sets no link settings")
        port = PortRef(self.host, args.port)
        data: dict[str, Any]
        try:
            if args.op == "support":
                data = {"support": support_to_json(await control.support(port))}
            elif args.op == "read":
                data = {"settings": settings_to_json(await control.read(port))}
            else:
                want = settings_from_json(msgspec.to_builtins(args.settings))
                data = {"settings": settings_to_json(await control.apply(port, want))}
        except LabctlError as e:
            if isinstance(e, LinkSettingUnsupported):
                data = {"refusal": "unsupported", "why": e.why}
            elif isinstance(e, LinkSettingMismatch):
                data = {"refusal": "mismatch", "differences": e.differences}
            else:
                data = {"refusal": "failed"}
            log.warning("agent %s: link %s %s: %s", self.host, args.op, args.port, e)
            return Reply(host=self.host, id=cmd.id, op=cmd.op, ok=False, error=str(e), data=data)
        return Reply(host=self.host, id=cmd.id, op=cmd.op, ok=True, data=data)

    COMMANDS: ClassVar[dict[str, Callable[[AgentCommands, Command, int], Any]]] = {
        "ping": _cmd_ping,
        "start": _cmd_start,
        "stop": _cmd_stop,
        "set_circuits": _cmd_set_circuits,
        "window": _cmd_window,
        "switched": _cmd_switched,
        "inspect": _cmd_inspect,
        "link": _cmd_link,
    }
