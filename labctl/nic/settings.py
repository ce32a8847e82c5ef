"""What a NIC port's link is set to, and the capability that reads and applies it.

`LinkSettings` is a partial assignment: a field left None is left as the port has it. A tune experiment
sweeps a grid of them; a lab offers `LinkControl` for its ports: real hosts through ethtool netlink
(ETHTOOL_MSG_LINKMODES_*, FEC_*, PRIVFLAGS_*), the simulated and agents labs through their NIC model. Every
apply is read back and verified, as a switch command is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, Protocol, get_args, runtime_checkable

from labctl.core.errors import HardwareError, InputError

FecMode = Literal["off", "rs", "baser", "llrs", "auto"]
"""ethtool's FEC names: none, Reed-Solomon (RS-FEC, clause 91/134), BASE-R (FireCode, clause 74), low-latency
RS (clause 161), and auto (the driver picks per link mode)."""
FEC_MODES: tuple[FecMode, ...] = get_args(FecMode)
Duplex = Literal["full", "half"]


@dataclass(frozen=True, slots=True)
class LinkSettings:
    """Settings for one port; None leaves that setting as the port has it."""

    autoneg: bool | None = None
    speed_mbps: int | None = None
    duplex: Duplex | None = None
    link_modes: tuple[str, ...] | None = None
    """Link modes advertised (with autoneg) by ethtool's names, e.g. `100000baseCR4/Full`."""
    fec: FecMode | None = None
    priv_flags: tuple[tuple[str, bool], ...] = ()
    """Driver private flags to set, (name, on), sorted by name."""

    def __post_init__(self) -> None:
        # sorted, so that the same modes or flags asked in another order compare (and label) equal
        object.__setattr__(self, "priv_flags", tuple(sorted(dict(self.priv_flags).items())))
        if self.link_modes is not None:
            object.__setattr__(self, "link_modes", tuple(sorted(set(self.link_modes))))

    @property
    def label(self) -> str:
        """`autoneg=off,fec=rs`: the set fields in a fixed order; `unchanged` when none is set."""
        parts: list[str] = []
        for name in ("autoneg", "speed_mbps", "duplex", "link_modes", "fec"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool):
                value = "on" if value else "off"
            elif isinstance(value, tuple):
                value = "+".join(value)
            parts.append(f"{name}={value}")
        parts += [f"{flag}={'on' if on else 'off'}" for flag, on in self.priv_flags]
        return ",".join(parts) or "unchanged"

    def over(self, base: LinkSettings) -> LinkSettings:
        """These settings laid over `base`: every field this one sets, the rest as `base` has them."""
        changes = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "priv_flags"}
        merged = replace(base, **{name: value for name, value in changes.items() if value is not None})
        flags = dict(base.priv_flags) | dict(self.priv_flags)
        return replace(merged, priv_flags=tuple(flags.items()))

    def differences(self, actual: LinkSettings) -> list[str]:
        """Each setting asked for that `actual` (a read-back) does not hold: `name: asked X, read Y`."""
        out: list[str] = []
        for name in ("autoneg", "speed_mbps", "duplex", "link_modes", "fec"):
            asked = getattr(self, name)
            if asked is not None and asked != getattr(actual, name):
                out.append(f"{name}: asked {asked!r}, read {getattr(actual, name)!r}")
        held = dict(actual.priv_flags)
        out += [
            f"{flag}: asked {on}, read {held.get(flag)}"
            for flag, on in self.priv_flags
            if held.get(flag) != on
        ]
        return out


@dataclass(frozen=True, slots=True)
class LinkSupport:
    """What a port can be set to (probed before a sweep starts)."""

    autoneg: bool
    """Auto-negotiation can be turned on and off."""
    link_modes: tuple[str, ...] = ()
    """Link modes the port supports (ethtool names)."""
    fec_modes: tuple[FecMode, ...] = ()
    priv_flags: tuple[str, ...] = ()
    note: str | None = None
    """Why nothing can be set, where that is so (a veth: "veth has no link modes")."""

    def refusal(self, settings: LinkSettings) -> str | None:
        """Why `settings` cannot be applied here, in a few words; None when they can."""
        if self.note is not None and settings != LinkSettings():
            return self.note
        if settings.autoneg is not None and not self.autoneg:
            return "auto-negotiation cannot be changed"
        if settings.fec is not None and settings.fec not in self.fec_modes:
            return f"FEC {settings.fec!r} not supported (supported: {', '.join(self.fec_modes) or 'none'})"
        for mode in settings.link_modes or ():
            if mode not in self.link_modes:
                return f"link mode {mode!r} not supported"
        for flag, _ in settings.priv_flags:
            if flag not in self.priv_flags:
                return f"no private flag {flag!r}"
        return None


@dataclass(frozen=True, slots=True)
class PortRef:
    """One NIC port of the lab, as the inventory names it."""

    host: str
    ifname: str

    @property
    def label(self) -> str:
        return f"{self.host}/{self.ifname}"


class LinkSettingUnsupported(InputError):
    """A setting a port does not take: one line naming host, port and setting (and the kernel's extack)."""

    def __init__(self, port: PortRef, settings: LinkSettings, why: str) -> None:
        self.port, self.settings, self.why = port, settings, why
        super().__init__(f"{port.label}: cannot set {settings.label}: {why}")


class LinkSettingMismatch(HardwareError):
    """An apply whose read-back differs from what was asked."""

    def __init__(self, port: PortRef, differences: list[str]) -> None:
        self.port, self.differences = port, differences
        super().__init__(f"{port.label}: read back after setting: {'; '.join(differences)}")


@runtime_checkable
class LinkControl(Protocol):
    """Reads and applies link settings on a lab's NIC ports (a lab kind offers one where it can)."""

    async def support(self, port: PortRef) -> LinkSupport:
        """What the port can be set to; probed before anything changes."""
        ...

    async def read(self, port: PortRef) -> LinkSettings:
        """Every setting the port holds now (all fields set, priv_flags all the driver's)."""
        ...

    async def apply(self, port: PortRef, settings: LinkSettings) -> LinkSettings:
        """Apply `settings`, read the port back and return what it holds; raises LinkSettingMismatch where
        the read-back differs, LinkSettingUnsupported where the port refuses."""
        ...


@dataclass(frozen=True, slots=True)
class SavedSettings:
    """Every port's settings as read before a sweep changed any: what a restore puts back."""

    ports: Mapping[PortRef, LinkSettings] = field(default_factory=dict)


def settings_to_json(settings: LinkSettings) -> dict[str, Any]:
    """As run.json, events, `link-settings-before.json` and the agents' `link` command carry them."""
    return {
        "autoneg": settings.autoneg,
        "speed_mbps": settings.speed_mbps,
        "duplex": settings.duplex,
        "link_modes": list(settings.link_modes) if settings.link_modes is not None else None,
        "fec": settings.fec,
        "priv_flags": dict(settings.priv_flags),
        "label": settings.label,
    }


def settings_from_json(data: Mapping[str, Any]) -> LinkSettings:
    """`settings_to_json`'s output back (its `label` is ignored); trusted input: the agents validate theirs
    with `labctl.agents.wire.LinkArgs` first."""
    modes = data.get("link_modes")
    return LinkSettings(
        autoneg=data.get("autoneg"),
        speed_mbps=data.get("speed_mbps"),
        duplex=data.get("duplex"),
        link_modes=tuple(modes) if modes is not None else None,
        fec=data.get("fec"),
        priv_flags=tuple((str(k), bool(v)) for k, v in (data.get("priv_flags") or {}).items()),
    )


def support_to_json(support: LinkSupport) -> dict[str, Any]:
    return {
        "autoneg": support.autoneg,
        "link_modes": list(support.link_modes),
        "fec_modes": list(support.fec_modes),
        "priv_flags": list(support.priv_flags),
        "note": support.note,
    }


def support_from_json(data: Mapping[str, Any]) -> LinkSupport:
    return LinkSupport(
        autoneg=bool(data.get("autoneg")),
        link_modes=tuple(data.get("link_modes") or ()),
        fec_modes=tuple(data.get("fec_modes") or ()),
        priv_flags=tuple(data.get("priv_flags") or ()),
        note=data.get("note"),
    )
