"""The light a power meter's channels see: one fiber's optical power over time, as a history of steps.

Two sources, each a step history per measured fiber that a meter channel averages over any window
(`LightTap.mean_mw`): `SwitchLight`, the egress ports of switch models in this process, stepped at the model's
light-change time; and `FabricLight`, the receive fibers of a kernel fabric that another process switches,
learnt from the kernel's tc notifications. `Dark` is a slot with nothing connected. What a meter does with
the light (averaging windows, noise, SCPI) is labctl.emulators.power_meter's.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import os
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from labctl.core.clock import now_ns
from labctl.inventory.schema import NicPort
from labctl.models.switch import INSERTION_LOSS_DB, SwitchModel

if TYPE_CHECKING:
    from labctl.emulators.fabric import FabricLayout

__all__ = ["Dark", "FabricLight", "LightTap", "SwitchLight"]

HISTORY_NS = 30_000_000_000  # light history kept per port: longer than any averaging window
RTMGRP_TC = 0x8  # 1 << (RTNLGRP_TC - 1): tc qdisc, class and filter changes
RTM_GETTFILTER = 46


class LightTap(Protocol):
    """The optical power on one fiber over time, as a meter channel sees it."""

    def mean_mw(self, start_ns: int, end_ns: int) -> float:
        """The mean power (mW) over [start_ns, end_ns] (its value at start_ns if the window is empty)."""
        ...


class Dark:
    """A slot with nothing connected."""

    def mean_mw(self, start_ns: int, end_ns: int) -> float:
        return 0.0


class SwitchLight:
    """The light leaving some egress ports of one switch model, as a history of steps per port: one model
    listener for all of them, each change recorded at its model time."""

    def __init__(self, model: SwitchModel, egresses: Iterable[int]) -> None:
        self.model = model
        model.timeline.run_due(now_ns())  # the patches as they stand now, then every change from here on
        self._t: dict[int, list[int]] = {}
        self._mw: dict[int, list[float]] = {}
        for egress in egresses:
            self._t[egress] = [0]
            self._mw[egress] = [self._power_mw(model.lit.get(egress))]
        model.add_listener(self._on_light)

    def _power_mw(self, ingress: int | None) -> float:
        launch_dbm = self.model.transmitting.get(ingress) if ingress is not None else None
        return 0.0 if launch_dbm is None else math.pow(10.0, (launch_dbm - INSERTION_LOSS_DB) / 10.0)

    def _on_light(self, egress: int, ingress: int | None, t_ns: int) -> None:
        times = self._t.get(egress)
        if times is None:
            return
        values = self._mw[egress]
        at = bisect.bisect_right(times, t_ns)  # in model-time order, even if delivered out of it
        times.insert(at, t_ns)
        values.insert(at, self._power_mw(ingress))
        keep = bisect.bisect_right(times, t_ns - HISTORY_NS) - 1
        if keep > 0:  # the step in force at the start of the kept history stays
            del times[:keep], values[:keep]

    def tap(self, egress: int) -> LightTap:
        return _PortTap(self, egress)

    def mean_mw(self, egress: int, start_ns: int, end_ns: int) -> float:
        # A reading stamped now must see every light change due by now (the model delivers a burst of them
        # a time slice per loop turn).
        self.model.timeline.run_due(now_ns())
        return _mean_of_steps(self._t[egress], self._mw[egress], start_ns, end_ns)


def _mean_of_steps(times: list[int], values: list[float], start_ns: int, end_ns: int) -> float:
    """The mean of a step function (values[i] from times[i] on) over [start_ns, end_ns]."""
    i = max(bisect.bisect_right(times, start_ns) - 1, 0)
    if end_ns <= start_ns:
        return values[i]
    total = 0.0
    t = start_ns
    while t < end_ns:
        step_end = times[i + 1] if i + 1 < len(times) else end_ns
        until = min(step_end, end_ns)
        total += values[i] * (until - t)
        t = until
        i += 1
    return total / (end_ns - start_ns)


class FabricLight:
    """The light a kernel fabric's OCS sends into NIC receive fibers, learnt from the kernel itself, for a
    meter that is its own process (`labctl emulate power-meter`).

    In the fabric (labctl.emulators.fabric) one direction of light is a tc u32 + mirred redirect in its
    `ocs` namespace, from the fiber end of the port whose transmit fiber lands on the patched ingress to the
    fiber end of the port whose receive fiber leaves the egress; the switch's process (`labctl emulate ocs
    --fabric`) programs it at the switch model's light-change time. This subscribes to that namespace's tc
    notifications (RTNLGRP_TC), reads the redirects already there, and keeps for each measured receive fiber
    a history of steps: the launch power less the switch's insertion loss while some fiber end is
    redirected to it, dark otherwise. A change is stamped when this process reads it (the socket is read
    on the loop as it becomes readable, and again before every reading), so the meter never sees light
    before the kernel carried it, and at most a loop turn after. Blocking at `open`; on the loop after."""

    def __init__(self, layout: FabricLayout, measured: Iterable[NicPort], launch_dbm: float = -1.0) -> None:
        self.layout = layout
        self._lit_mw = math.pow(10.0, (launch_dbm - INSERTION_LOSS_DB) / 10.0)
        self._fibers = {fp.index for fp in layout.ports}
        self._measured = [layout.port(port).index for port in measured]
        self._to: dict[int, int] = {}  # fiber end → the fiber end its frames (its light) are redirected to
        self._t: dict[int, list[int]] = {index: [0] for index in self._measured}
        self._mw: dict[int, list[float]] = {index: [0.0] for index in self._measured}
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def open(self) -> None:
        """Subscribe, then read every fiber end's redirects (a change between the two is applied after)."""
        from labctl.linux import netns
        from labctl.linux.rtnl import open_route_socket

        with netns.entered(self.layout.ocs_netns):
            sock = open_route_socket(RTMGRP_TC, blocking=False)
            dump = open_route_socket()
        try:
            dump.settimeout(2.0)
            for seq, index in enumerate(sorted(self._fibers), start=1):
                self._dump(dump, seq, index)
        except BaseException:
            sock.close()
            raise
        finally:
            dump.close()
        self._sock = sock
        for index in self._measured:  # the state found: in force from the start of the history
            self._mw[index] = [self._power(index)]
        self.drain()

    def _dump(self, dump: socket.socket, seq: int, index: int) -> None:
        from labctl.core.errors import HardwareError
        from labctl.linux.netlink import NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, iter_messages
        from labctl.linux.netlink import message as netlink_message
        from labctl.linux.rtnl import INGRESS_HANDLE, TCMSG

        body = TCMSG.pack(socket.AF_UNSPEC, index, 0, INGRESS_HANDLE, 0)
        dump.send(netlink_message(RTM_GETTFILTER, NLM_F_REQUEST | NLM_F_DUMP, seq, body))
        while True:
            data = dump.recv(1 << 16)
            for kind, _flags, mseq, start, end in iter_messages(data):
                if mseq != seq:
                    continue
                if kind == NLMSG_DONE:
                    return
                if kind == NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", data, start)
                    if code == 0:
                        return
                    raise HardwareError(
                        f"fabric {self.layout.prefix}: reading the cross-connects of fiber end {index}: "
                        f"{os.strerror(-code)}"
                    )
                self._message(kind, data, start, end)

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read tc changes as they come, on `loop`."""
        assert self._sock is not None, "open() first"
        self._loop = loop
        loop.add_reader(self._sock, self.drain)

    def close(self) -> None:
        if self._sock is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._sock)
            self._sock.close()
            self._sock = None

    def drain(self) -> None:
        """Apply every tc change the kernel has sent so far, stamped now."""
        from labctl.core.errors import HardwareError
        from labctl.linux.netlink import iter_messages

        if self._sock is None:
            return
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError as e:  # ENOBUFS: changes were lost, the light is no longer known
                raise HardwareError(f"fabric {self.layout.prefix}: tc notifications lost: {e}") from None
            t = now_ns()
            for kind, _flags, _seq, start, end in iter_messages(data):
                self._message(kind, data, start, end, t)

    def _message(self, kind: int, data: bytes, start: int, end: int, t: int | None = None) -> None:
        from labctl.linux.rtnl import RTM_DELTFILTER, RTM_NEWTFILTER, TCMSG

        if kind not in (RTM_NEWTFILTER, RTM_DELTFILTER):
            return
        _family, index, _handle, _parent, _info = TCMSG.unpack_from(data, start)
        if index not in self._fibers:
            return
        if kind == RTM_DELTFILTER:  # the fabric removes a fiber end's redirect with its whole prio
            if self._to.pop(index, None) is None:
                return
        else:
            target = _mirred_target(data, start + TCMSG.size, end)
            if target is None:  # the u32 hash table itself, or a filter that redirects nowhere
                return
            self._to[index] = target
        if t is not None:
            self._relight(t)

    def _power(self, index: int) -> float:
        return self._lit_mw if index in self._to.values() else 0.0

    def _relight(self, t: int) -> None:
        for index in self._measured:
            mw = self._power(index)
            times, values = self._t[index], self._mw[index]
            if mw == values[-1]:
                continue
            times.append(max(t, times[-1]))
            values.append(mw)
            keep = bisect.bisect_right(times, t - HISTORY_NS) - 1
            if keep > 0:
                del times[:keep], values[:keep]

    def tap(self, port: NicPort) -> LightTap:
        return _PortTap(self, self.layout.port(port).index)

    def mean_mw(self, index: int, start_ns: int, end_ns: int) -> float:
        self.drain()  # a reading stamped now sees every change the kernel made before it
        return _mean_of_steps(self._t[index], self._mw[index], start_ns, end_ns)


def _mirred_target(data: bytes, start: int, end: int) -> int | None:
    """The ifindex a u32 filter's mirred action sends frames to (None: no such action)."""
    from labctl.linux.netlink import parse_attrs
    from labctl.linux.rtnl import (
        TC_MIRRED,
        TCA_ACT_KIND,
        TCA_ACT_OPTIONS,
        TCA_MIRRED_PARMS,
        TCA_OPTIONS,
        TCA_U32_ACT,
    )

    options = parse_attrs(data, start, end).get(TCA_OPTIONS)
    if options is None:
        return None
    actions = parse_attrs(options, 0, len(options)).get(TCA_U32_ACT)
    if actions is None:
        return None
    for action in parse_attrs(actions, 0, len(actions)).values():
        fields = parse_attrs(action, 0, len(action))
        kind, opts = fields.get(TCA_ACT_KIND), fields.get(TCA_ACT_OPTIONS)
        if kind is None or opts is None or bytes(kind).rstrip(b"\0") != b"mirred":
            continue
        parms = parse_attrs(opts, 0, len(opts)).get(TCA_MIRRED_PARMS)
        if parms is not None and len(parms) >= TC_MIRRED.size:
            target: int = TC_MIRRED.unpack_from(parms, 0)[6]
            return target
    return None


class _Light(Protocol):
    def mean_mw(self, port: int, start_ns: int, end_ns: int) -> float: ...


@dataclass(frozen=True)
class _PortTap:
    light: _Light
    egress: int
    """The switch egress port (SwitchLight) or the receive fiber end's ifindex (FabricLight)."""

    def mean_mw(self, start_ns: int, end_ns: int) -> float:
        return self.light.mean_mw(self.egress, start_ns, end_ns)
