"""The kernel lab: switch models driven by their drivers, a kernel fabric that follows them, real probes.

Selected by `kind: kernel` in the inventory. Each switch is a `SwitchModel` behind its driver (the sim
driver, or a driver with `emulate: true` against its protocol emulator over TCP); the `KernelFabric`
listens to the models' light, so it moves identically either way. Probes: the netlink carrier probe (with
the reconfiguration-window poll), the UDP ping-pong traffic probe, both on the NIC ends inside the host
namespaces, and the Rx-power poller on model-driven transceivers.

Fabric lifecycle: if `labctl emulate fabric up` already built this inventory's fabric (prefix
`lc-<layout hash>-`) and no other run holds it, the run locks it, resets it to dark and reuses it;
otherwise the run builds its own (`lr-<pid>-`) and always removes it at the end. Fabrics left by killed
runs (their pid is gone) are swept first.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
from pathlib import Path

from labctl.core.errors import HardwareError
from labctl.emulators.fabric import FabricLayout, KernelFabric, managed_prefix, run_prefix
from labctl.inventory.schema import Inventory
from labctl.labs.base import Lab, LabContext, LabKind
from labctl.labs.world import (
    add_power_meters,
    build_probes,
    check_power_meters,
    check_switches_over_models,
    drive_models,
    no_broker,
    switch_models,
)
from labctl.linux import netns

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


PROBES = ("carrier", "traffic", "rx-power")
TRAFFIC_PROBE = {"udp": "traffic", "rdma": "rc-traffic"}
"""The probe that carries the ping-pong marking t5, by the experiment's `probes.transport`."""


def check(inventory: Inventory) -> None:
    no_broker(inventory, "kernel")
    check_switches_over_models(inventory, "kernel")
    check_power_meters(inventory, "kernel", over_models=True)
    FabricLayout.of(inventory, managed_prefix(inventory))  # names and addresses the fabric needs


def build(ctx: LabContext) -> Lab:
    # Imported here: checking an inventory (`labctl inventory check`) loads no model or probe (numpy).
    import asyncio

    from labctl.models.fabric import SimFabric
    from labctl.probes.base import ProbeContext
    from labctl.probes.model import model_sites

    inv = ctx.inventory
    if os.geteuid() != 0:  # refused here, before a run directory exists, not at start inside the run
        raise HardwareError(
            "lab kind 'kernel' builds network namespaces, veths and tc filters: run as root (e.g. sudo "
            "$(command -v labctl) ...), or use a simulated inventory"
        )
    lease = FabricLease.choose(inv)
    layout = lease.layout
    fabric = KernelFabric(layout, ctx.profile, ctx.rng, ctx.emit)
    models = switch_models(ctx)
    lab = Lab()
    drive_models(ctx, models, lab)
    # Rx power: light at each NIC receiver follows the same switch models through the optical model of the
    # simulated lab (SimFabric: light source, settling ramp, per-port level), read from an emulated module
    # EEPROM per port by the real poller and DOM decoder. SimFabric's link-layer transitions have no
    # listener here: the kernel is the truth for firmware, carrier and traffic.
    optics = SimFabric(inv, models, ctx.profile, ctx.rng)
    optical = {site.port: site for site in model_sites(optics, inv.ports)}
    sites = [dataclasses.replace(optical[fp.port], netns=fp.host_netns, ip=fp.ip) for fp in layout.ports]
    probes = tuple(TRAFFIC_PROBE[ctx.probes.transport] if name == "traffic" else name for name in PROBES)
    lab.probes = build_probes(probes, ProbeContext(ctx.probes, ports=sites), extra=True)
    add_power_meters(lab, ctx, models)

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

    # The lab starts before any switch connects (and serves its emulator) and closes after every switch has
    # closed: the fabric is up before an emulated switch moves light and gone only after it stopped.
    lab.start_hooks.append(start_fabric)
    lab.async_close_hooks.append(stop_fabric)
    return lab


KIND = LabKind(
    "kernel",
    "a kernel-real fabric (root, Linux): a network namespace per host, veth NIC ports, tc cross-connects; "
    "carrier and traffic are real kernel events, only the delays are modeled",
    check,
    build,
    no_link_control="veths accept no link modes",
)
