"""Delay profiles: the timing model of a simulated or emulated lab.

A profile says how long each step of a link's recovery takes, as uniform ranges (jitter) drawn from a
seeded generator. `opus-testbed` is the Figure 9 measurement of the Opus testbed (DESIGN.md table);
`fast` has the same shape, far shorter, for tests. Ranges are written in the unit their key names.
"""

from __future__ import annotations

import random
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from labctl.core.errors import InputError

MAX_RANGE = 3_600_000.0  # an hour in ms (the largest unit a range is written in): nothing physical is longer
Range = Annotated[tuple[float, float], Field(description="[low, high], drawn uniformly")]


FecName = Literal["off", "rs", "baser", "llrs", "auto"]  # labctl.nic.settings.FecMode (ethtool's names)


class LinkModel(BaseModel):
    """What a modeled NIC port's link is set to before a run, what it can be set to, and how each setting
    changes its firmware link-up (the simulated lab's `LinkControl`, labctl.models.link_control).

    `firmware_up_ms` is the link-up with these defaults (auto-negotiation on). A link's firmware delay is
    that draw times the factor of each setting of its slower end: the Opus testbed's ≈6 s with
    auto-negotiation on and ≈3 s off (Opus, Figure 9) give `autoneg_off_factor` 0.5. The FEC and
    forced-mode factors are assumptions (no source measured them): FEC off
    skips the RS-FEC alignment lock; a forced link mode with auto-negotiation on changes nothing. Ends that
    disagree on auto-negotiation, or on a FEC mode neither leaves to `auto`, never come up (an assumption
    that matches what ConnectX NICs are reported to do, not a measurement)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    autoneg: bool = Field(default=True, description="auto-negotiation as the port starts")
    speed_mbps: int = Field(default=100_000, ge=1, le=1_600_000, description="link speed as it starts")
    link_modes: tuple[str, ...] = Field(
        default=("100000baseSR4/Full",), description="link modes advertised as it starts (ethtool names)"
    )
    supported_link_modes: tuple[str, ...] = Field(
        default=("100000baseSR4/Full", "50000baseSR2/Full", "40000baseSR4/Full", "25000baseSR/Full"),
        description="link modes the port can be set to (a ConnectX-6 Dx port with a 100G SR4 module)",
    )
    fec: FecName = Field(default="rs", description="FEC mode as it starts (RS-FEC: 100GBASE-SR4's own)")
    fec_modes: tuple[FecName, ...] = Field(
        default=("off", "rs", "baser", "auto"), description="FEC modes the port can be set to"
    )
    priv_flags: dict[str, bool] = Field(
        default={"rx_cqe_compress": False, "rx_striding_rq": True, "tx_port_ts": False},
        description="driver private flags and their state as the port starts (mlx5's names)",
    )
    autoneg_off_factor: float = Field(
        default=0.5,
        gt=0,
        le=10,
        description="firmware link-up with auto-negotiation off, as a share of `firmware_up_ms` (seed: ≈3 s "
        "of ≈6 s)",
    )
    fec_factor: dict[FecName, Annotated[float, Field(gt=0, le=10)]] = Field(
        default={"off": 0.9, "rs": 1.0, "baser": 1.0, "llrs": 1.0, "auto": 1.0},
        description="firmware link-up per FEC mode, as a share of `firmware_up_ms` (assumption: no source)",
    )
    forced_mode_factor: float = Field(
        default=1.0,
        gt=0,
        le=10,
        description="firmware link-up with link modes forced (a subset advertised), as a share (assumption)",
    )

    def factor(self, autoneg: bool, fec: str, forced: bool) -> float:
        """The share of `firmware_up_ms` a port with these settings takes to come up."""
        share = 1.0 if autoneg else self.autoneg_off_factor
        share *= float(dict(self.fec_factor).get(fec, 1.0))  # type: ignore[call-overload]
        return float(share * (self.forced_mode_factor if forced else 1.0))


class Profile(BaseModel):
    """The timing model of every simulated/emulated switch port and NIC port in a lab."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    description: str = Field(default="", description="what the profile models, in a line")
    switching_ms: Range = Field(
        description="OCS command received → mirrors settled (light on the new circuit), ms"
    )
    light_loss_ms: Range = Field(
        default=(0.5, 2.0),
        description="OCS command received → light gone from the old circuit (mirrors start to move), ms",
    )
    optical_settle_ms: Range = Field(
        default=(0.5, 3.0),
        description="mirrors settled → Rx power at its steady level (power meter/DOM ADC settling), ms",
    )
    firmware_up_ms: Range = Field(
        description="light back on both ends of a link → NIC firmware reports link-up (training, FEC lock, "
        "auto-negotiation), ms"
    )
    carrier_after_firmware_us: Range = Field(
        default=(70.0, 80.0), description="firmware link-up → Linux netdev carrier on, us"
    )
    transport_after_carrier_ms: Range = Field(
        description="carrier on at both ends → first traffic through (RDMA retry timer, QP recovery), ms"
    )
    carrier_down_after_loss_ms: Range = Field(
        default=(0.2, 1.0), description="light lost → carrier off (loss-of-signal detection), ms"
    )
    rx_power_dbm: float = Field(
        default=-2.5, ge=-60, le=30, description="received optical power on a lit port, dBm"
    )
    rx_noise_db: float = Field(
        default=0.05, ge=0, le=30, description="peak-to-peak noise on lit Rx power readings, dB"
    )
    rtt_us: Range = Field(default=(8.0, 14.0), description="ping-pong round trip on a working circuit, us")
    link: LinkModel = Field(
        default=LinkModel(),
        description="NIC ports' link settings as they start and each setting's effect on firmware link-up "
        "(what a tune experiment sweeps on the simulated lab)",
    )
    dom_update_ms: Range = Field(
        default=(0.0, 0.0),
        description="how often each transceiver refreshes its DOM registers (one draw per module; 0: on "
        "every read), ms. Real modules refresh every few to ~100 ms; a poller faster than that reads the "
        "same value repeatedly",
    )

    @model_validator(mode="after")
    def _ranges_ordered(self) -> Profile:
        for name, value in self:
            if isinstance(value, tuple) and (value[0] > value[1] or value[0] < 0 or value[1] > MAX_RANGE):
                raise ValueError(
                    f"{name}: range {list(value)} must be [low, high] with 0 <= low <= high <= {MAX_RANGE:g}"
                )
        return self

    def draw_ns(self, rng: random.Random, name: str) -> int:
        """One draw from the range `name`, in integer nanoseconds."""
        low, high = getattr(self, name)
        unit = 1_000 if name.endswith("_us") else 1_000_000
        return round(float(rng.uniform(low, high)) * unit)

    def draw_many_ns(self, rng: random.Random, name: str, n: int) -> list[int]:
        """n draws from the range `name` (the same stream of draws as n calls of `draw_ns`)."""
        low, high = getattr(self, name)
        unit = 1_000 if name.endswith("_us") else 1_000_000
        uniform = rng.uniform
        return [round(float(uniform(low, high)) * unit) for _ in range(n)]

    def range_ns(self, name: str) -> tuple[int, int]:
        """The range `name` in integer nanoseconds."""
        low, high = getattr(self, name)
        unit = 1_000 if name.endswith("_us") else 1_000_000
        return round(low * unit), round(high * unit)

    def mid_ns(self, name: str) -> int:
        low, high = getattr(self, name)
        unit = 1_000 if name.endswith("_us") else 1_000_000
        return round(float(low + high) / 2 * unit)


_OPUS: dict[str, Any] = {
    "description": "Opus testbed, Figure 9: Polatis ~25 ms, firmware link-up ~6 s, carrier +70-80 us, "
    "RDMA +100-200 ms",
    "switching_ms": (22.0, 28.0),
    "firmware_up_ms": (5700.0, 6300.0),
    "transport_after_carrier_ms": (100.0, 200.0),
}

BUILTIN_PROFILES: dict[str, dict[str, Any]] = {
    "opus-testbed": _OPUS,
    "opus-testbed-autoneg-off": {
        **_OPUS,
        "description": "Opus testbed with auto-negotiation off: firmware link-up ~3 s",
        "firmware_up_ms": (2700.0, 3300.0),
    },
    "fast": {
        "description": "same shape as opus-testbed, ~100x shorter, for tests",
        "switching_ms": (2.0, 3.0),
        "light_loss_ms": (0.1, 0.3),
        "optical_settle_ms": (0.1, 0.5),
        "firmware_up_ms": (40.0, 60.0),
        "transport_after_carrier_ms": (10.0, 20.0),
        "carrier_down_after_loss_ms": (0.1, 0.3),
    },
}

DEFAULT_PROFILE = "opus-testbed"


def resolve_profile(name: str, custom: dict[str, dict[str, Any]] | None = None) -> Profile:
    """A profile by name: the inventory's `profiles:` first (each may `extends:` another), then built-ins."""
    custom = custom or {}
    chain: list[str] = []
    fields: dict[str, Any] = {}
    current: str | None = name
    while current is not None:
        if current in chain:
            raise InputError(f"profile {name!r}: 'extends' loops through {' -> '.join([*chain, current])}")
        chain.append(current)
        if current in custom:
            layer = dict(custom[current])
            parent = layer.pop("extends", None)
        elif current in BUILTIN_PROFILES:
            layer, parent = dict(BUILTIN_PROFILES[current]), None
        else:
            known = sorted(set(BUILTIN_PROFILES) | set(custom))
            raise InputError(f"unknown profile {current!r} (known: {', '.join(known)})")
        fields = {**layer, **fields}
        current = parent
    try:
        return Profile(**fields)
    except Exception as e:  # pydantic.ValidationError
        errors = getattr(e, "errors", None)
        if errors is not None:
            err = errors(include_url=False)[0]
            loc = ".".join(str(p) for p in err["loc"])
            raise InputError(f"profile {name!r}: {loc}: {err['msg']}") from None
        raise
