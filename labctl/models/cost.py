"""The Opus per-port cost model: what a lab's photonic rails cost and draw against an electrical fabric.

Cost = n_sw * c_sw + n_ocs * c_ocs + n_xcvr * c_xcvr, and the same form for power; fibres are excluded
(Opus, SIGCOMM 2026, section 5 and Table 2). The photonic side is counted from the inventory itself: every
OCS port a NIC port's fibres land on, and one transceiver per NIC port. The electrical side is a
rail-optimized non-blocking fat tree of `tiers` switch tiers over the same NIC ports: each port climbs
every tier but the top one on a down and an up switch port and ends on the top tier's down port, so it
takes 2 * tiers - 1 switch ports, each with a transceiver, plus its own transceiver at the NIC.

The paper does not say how many switch ports its electrical fabric spends per GPU. Three tiers (5 switch
ports and 6 transceivers per NIC port) is the whole-tier fabric that comes closest to both of its figures:
23.84x power (paper 23.9x) and 4.11x cost (paper 4.3x). No whole number of switch ports gives both: at
Table 2's prices 4.3x needs 5.26 switch ports per NIC port while 23.9x needs 5.01 (docs/decisions/0063).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from labctl.core.errors import InputError
from labctl.core.yamlio import load_yaml, pydantic_error_line
from labctl.inventory.config import ConfigModel

DEFAULT_TIERS = 3
"""Switch tiers of the electrical fabric compared against (module docstring: why three)."""


class PriceItem(ConfigModel):
    usd: float = Field(ge=0, description="list price of one, in US dollars")
    watts: float = Field(ge=0, description="power of one, in watts")
    source: str = Field(min_length=1, description="where the two figures come from")


class Published(ConfigModel):
    cost_ratio: float = Field(gt=0, description="the published electrical/photonic cost ratio")
    power_ratio: float = Field(gt=0, description="the published electrical/photonic power ratio")
    scope: str = Field(description="what the published ratios cover (GPU, rate, scale)")
    source: str = Field(min_length=1)


class Prices(ConfigModel):
    name: str = Field(min_length=1, description="what these prices are for")
    rate_gbps: int = Field(gt=0, le=6400, description="the port rate the prices are for")
    switch_port: PriceItem = Field(description="one electrical switch port (without its transceiver)")
    transceiver: PriceItem = Field(description="one pluggable transceiver")
    ocs_port: PriceItem = Field(description="one optical circuit switch port")
    published: Published | None = Field(
        default=None, description="the ratios a publication reports for these prices, shown beside ours"
    )


def default_prices_path() -> Path:
    from labctl.core.shipped import data_dir

    return data_dir() / "prices.yaml"


def load_prices(path: Path | None = None) -> Prices:
    """The prices table (the shipped Table 2 values by default); a bad file is one line with file:line."""
    src = load_yaml(path or default_prices_path(), "prices")
    try:
        return Prices.model_validate(src.data)
    except ValidationError as e:
        raise InputError(pydantic_error_line(src, e)) from None


@dataclass(frozen=True)
class Fabric:
    """One fabric's parts and what they add up to."""

    name: str
    switch_ports: int
    ocs_ports: int
    transceivers: int
    cost_usd: float
    power_w: float


@dataclass(frozen=True)
class CostModel:
    lab: str
    gpus: int
    nic_ports: int
    nic_gbps: tuple[int, ...]
    tiers: int
    prices: Prices
    photonic: Fabric
    electrical: Fabric

    @property
    def cost_ratio(self) -> float:
        """Electrical over photonic cost: how many times cheaper the photonic rails are."""
        return self.electrical.cost_usd / self.photonic.cost_usd

    @property
    def power_ratio(self) -> float:
        return self.electrical.power_w / self.photonic.power_w

    def to_json(self) -> dict[str, Any]:
        return {
            "lab": self.lab,
            "gpus": self.gpus,
            "nic_ports": self.nic_ports,
            "tiers": self.tiers,
            "prices": self.prices.model_dump(),
            "photonic": asdict(self.photonic),
            "electrical": asdict(self.electrical),
            "cost_ratio": self.cost_ratio,
            "power_ratio": self.power_ratio,
        }


def _fabric(name: str, prices: Prices, switch_ports: int, ocs_ports: int, transceivers: int) -> Fabric:
    parts = (
        (switch_ports, prices.switch_port),
        (ocs_ports, prices.ocs_port),
        (transceivers, prices.transceiver),
    )
    return Fabric(
        name,
        switch_ports,
        ocs_ports,
        transceivers,
        cost_usd=sum(n * item.usd for n, item in parts),
        power_w=sum(n * item.watts for n, item in parts),
    )


def electrical_ports_per_endpoint(tiers: int) -> int:
    """Switch ports one NIC port takes in a non-blocking fat tree: down and up on each tier below the top,
    down on the top."""
    if tiers < 1:
        raise InputError(f"tiers: {tiers}: an electrical fabric has at least one switch tier")
    return 2 * tiers - 1


def model(
    lab: str,
    gpus: int,
    ocs_ports: int,
    nic_gbps: Iterable[int],
    prices: Prices,
    tiers: int = DEFAULT_TIERS,
) -> CostModel:
    """Both fabrics over the same NIC ports: photonic with `ocs_ports` OCS ports and a transceiver per NIC
    port; electrical with 2 * tiers - 1 switch ports per NIC port, a transceiver on each and at the NIC."""
    rates = tuple(nic_gbps)
    nic_ports = len(rates)
    if nic_ports == 0 or gpus <= 0:
        raise InputError(f"{lab}: no NIC ports or GPUs to cost (the model counts ports per GPU)")
    per_port = electrical_ports_per_endpoint(tiers)
    photonic = _fabric("photonic rails (OCS)", prices, 0, ocs_ports, nic_ports)
    electrical = _fabric(
        f"electrical rails ({tiers}-tier fat tree)",
        prices,
        per_port * nic_ports,
        0,
        (per_port + 1) * nic_ports,
    )
    return CostModel(lab, gpus, nic_ports, tuple(sorted(set(rates))), tiers, prices, photonic, electrical)


def from_inventory(inventory: Any, prices: Prices, tiers: int = DEFAULT_TIERS) -> CostModel:
    """Count the inventory's photonic rails: each distinct OCS port a fibre lands on (a NIC port's transmit
    fibre on an ingress port, its receive fibre from an egress port), a transceiver per NIC port, and its
    GPUs (those listed; else the distinct GPUs its NIC ports name; else one per NIC port)."""
    ports = inventory.ports
    ocs_ports = {(p.switch, "tx", p.tx) for p in ports} | {(p.switch, "rx", p.rx) for p in ports}
    # A switch with one port set (size NxN where ingress and egress share numbers) still counts each fibre's
    # port once: an ingress and an egress with one number are two ports on a 32x32 switch.
    listed = sum(len(spec.gpus) for spec in inventory.model.hosts.values())
    named = {(p.host, p.gpu) for p in ports if p.gpu is not None}
    gpus = listed or len(named) or len(ports)
    return model(inventory.lab, gpus, len(ocs_ports), (p.gbps for p in ports), prices, tiers)


def synthetic(gpus: int, prices: Prices, tiers: int = DEFAULT_TIERS) -> CostModel:
    """The paper's case: `gpus` GPUs, one NIC port each at the prices' rate, 2 OCS ports per GPU."""
    if gpus <= 0:
        raise InputError(f"--gpus: {gpus}: give a positive number of GPUs")
    return model(f"{gpus} GPUs", gpus, 2 * gpus, [prices.rate_gbps] * gpus, prices, tiers)


def notes(result: CostModel) -> list[str]:
    """What a reader must know to trust the ratios: rate mismatch, and the published figure beside ours."""
    lines = []
    other = [g for g in result.nic_gbps if g != result.prices.rate_gbps]
    if other:
        rates = "/".join(f"{g}G" for g in result.nic_gbps)
        lines.append(
            f"the prices are for {result.prices.rate_gbps}G ports; this lab's NIC ports run at {rates} "
            "(the model counts ports, so the ratios hold; the absolute figures do not)"
        )
    published = result.prices.published
    if published is not None:
        lines.append(
            f"published: {published.cost_ratio:g}x cost, {published.power_ratio:g}x power "
            f"({published.scope}; {published.source}); this model with {result.tiers} tiers: "
            f"{result.cost_ratio:.2f}x, {result.power_ratio:.2f}x. "
            "The paper does not give its switch ports per GPU: "
            f"{_ports_for(result, published.cost_ratio, 'usd'):.2f} would give its cost ratio and "
            f"{_ports_for(result, published.power_ratio, 'watts'):.2f} its power ratio at these prices"
        )
    return lines


def _ports_for(result: CostModel, ratio: float, field: str) -> float:
    """Switch ports per NIC port (each with a transceiver, plus the NIC's) that give `ratio` on `field`."""
    p = result.prices
    sw, xcvr = getattr(p.switch_port, field), getattr(p.transceiver, field)
    photonic_per_port = (
        result.photonic.cost_usd if field == "usd" else result.photonic.power_w
    ) / result.nic_ports
    # ratio * photonic = k * (sw + xcvr) + xcvr, per NIC port
    return float((ratio * photonic_per_port - xcvr) / (sw + xcvr))
