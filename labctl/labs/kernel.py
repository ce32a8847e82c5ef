"""The emulated lab: switch models driven by their drivers, a kernel fabric that follows them, real probes.

Selected by `fabric: emulated` in the inventory. Each switch is a `SwitchModel` behind either the
in-process sim driver (`driver: sim`) or the real TL1 driver talking over TCP to an in-process TL1
emulator (`driver: polatis-tl1`, `emulate: true`); the `KernelFabric` listens to the model's light, so it
moves identically either way. Probes: the netlink carrier probe (with the reconfiguration-window poll) and
the UDP ping-pong traffic probe, both on the NIC ends inside the host namespaces.

Fabric lifecycle: if `labctl emulate fabric up` already built this inventory's fabric (prefix
`lc-<layout hash>-`) and no other run holds it, the run locks it, resets it to dark and reuses it;
otherwise the run builds its own (`lr-<pid>-`) and always removes it at the end. Fabrics left by killed
runs (their pid is gone) are swept first.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path

from labctl.emulators.fabric import FabricLayout, KernelFabric, managed_prefix, run_prefix
from labctl.errors import HardwareError, InputError
from labctl.inventory import Inventory
from labctl.labs.base import Lab, LabContext, switch_timeouts, tl1_emulated_switch
from labctl.linux import netns
from labctl.models.switch import SwitchModel
from labctl.ocs import OpticalSwitch

LOCK_DIR = Path("/run/labctl")


class FabricLease:
    """Which fabric a run uses, whether it owns it (and must remove it), and the lock on a shared one."""

    def __init__(self, layout: FabricLayout, *, owned: bool) -> None:
        self.layout = layout
        self.owned = owned
        self._lock_fd: int | None = None

    @classmethod
    def choose(cls, inventory: Inventory) -> FabricLease:
        shared = FabricLayout.of(inventory, managed_prefix(inventory))
        if all(netns.exists(n) for n in shared.netns_names()) and not _locked(shared.prefix):
            return cls(shared, owned=False)
        return cls(FabricLayout.of(inventory, run_prefix()), owned=True)

    def acquire(self, fabric: KernelFabric) -> None:
        """Blocking: build the fabric, or lock and reset the shared one."""
        if os.geteuid() != 0:
            raise HardwareError("the emulated fabric needs root (network namespaces, veth, tc)")
        for stale in netns.stale_run_prefixes():
            netns.cleanup(stale)
        if self.owned:
            fabric.create()
            return
        self._lock_fd = _lock(self.layout.prefix)
        if self._lock_fd is None:
            raise HardwareError(f"fabric {self.layout.prefix} is in use by another run")
        fabric.reset()

    def release(self, fabric: KernelFabric) -> None:
        """Blocking: remove an owned fabric (always), or darken and unlock a shared one."""
        try:
            if self.owned:
                fabric.destroy()
            elif self._lock_fd is not None:
                fabric.reset()
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None


def _lock_path(prefix: str) -> Path:
    return LOCK_DIR / f"{prefix}lock"


def _lock(prefix: str) -> int | None:
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(_lock_path(prefix), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _locked(prefix: str) -> bool:
    path = _lock_path(prefix)
    if not path.exists():
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def build_emulated_lab(ctx: LabContext) -> Lab:
    from labctl.drivers.sim import SimSwitch
    from labctl.models.fabric import SimFabric
    from labctl.models.probes import SimRxPowerProbe
    from labctl.probes.carrier import CarrierTarget, NetlinkCarrierProbe
    from labctl.probes.traffic import TrafficEndpoint, UdpTrafficProbe

    inv = ctx.inventory
    lease = FabricLease.choose(inv)
    layout = lease.layout
    fabric = KernelFabric(layout, ctx.profile, ctx.rng, ctx.emit)
    models = {
        name: SwitchModel(name, spec.space, ctx.profile, ctx.rng) for name, spec in inv.switches.items()
    }
    switches: dict[str, OpticalSwitch] = {}
    lab = Lab(switches=switches, probes=[], circuit_probes=[])
    for name, spec in inv.switches.items():
        if spec.driver == "sim":
            switches[name] = SimSwitch(models[name], ctx.emit, switch_timeouts(spec))
        elif spec.driver == "polatis-tl1" and spec.emulate:
            switches[name] = tl1_emulated_switch(name, spec, models[name], ctx, lab)
        else:
            raise InputError(
                f"{inv.path}: switch {name}: the emulated fabric needs a switch model it can follow: "
                f"driver sim, or polatis-tl1 with `emulate: true` (got {spec.driver!r})"
            )

    carrier = NetlinkCarrierProbe(
        [CarrierTarget(fp.host_netns, fp.port.ifname, fp.port.source, fp.port.host) for fp in layout.ports]
    )
    traffic = UdpTrafficProbe(
        [
            TrafficEndpoint(fp.port.source, fp.ip, fp.port.ifname, fp.host_netns, fp.port.host)
            for fp in layout.ports
        ],
        interval_us=ctx.probes.traffic_interval_us,
        timeout_us=ctx.probes.traffic_timeout_us,
        report_interval_ns=round(ctx.probes.report_interval_ms * 1e6),
    )
    # Rx power: light at each NIC receiver follows the same switch models through the optical model of
    # the simulated lab (SimFabric: light source, settling ramp, per-port level); each port's emulated
    # QSFP28 EEPROM is read through the module read interface and decoded by the DOM decoder
    # (SimRxPowerProbe). SimFabric's link-layer transitions have no listener here: the kernel is the truth
    # for firmware, carrier and traffic.
    optics = SimFabric(inv, models, ctx.profile, ctx.rng)
    rx_power = SimRxPowerProbe(
        optics,
        inv.ports,
        hz=ctx.probes.rx_power_hz,
        deadband_db=ctx.probes.rx_power_deadband_db,
        report_interval_ns=round(ctx.probes.report_interval_ms * 1e6),
    )
    lab.probes.extend([carrier, traffic, rx_power])
    lab.circuit_probes.append(traffic)
    lab.window_probes.extend([carrier, rx_power])

    async def start_fabric() -> None:
        await asyncio.to_thread(lease.acquire, fabric)
        fabric.open()
        for name, model in models.items():
            fabric.follow(name, model)

    async def stop_fabric() -> None:
        fabric.close()
        optics.cancel_pending()
        for model in models.values():
            model.cancel_pending()
        await asyncio.to_thread(lease.release, fabric)

    # Start hooks run in order, close hooks in reverse: the fabric is up before any emulator serves and
    # is removed after every emulator has closed.
    lab.start_hooks.insert(0, start_fabric)
    lab.async_close_hooks.insert(0, stop_fabric)
    return lab
