"""What ethtool(8) prints, parsed, and set beside what labctl reads through netlink: the check that labctl's
decoders agree with ethtool's own (bench/device_check.py).

Three outputs, as ethtool 6.x prints them (sources: ethtool's sff-common.h print macros, sfpdiag.c,
qsfp.c, cmis.c; netlink/settings.c and netlink/fec.c):
- `ethtool -m IF`: one `\\t%-41s : %s` line per field. Monitors: `%.4f mW / %.2f dBm` (power; `-inf dBm`
  with no light), `%.3f mA` (bias), `%.2f degrees C / %.2f degrees F`, `%.4f V`. SFF-8472 names its one
  lane's monitors without a channel (`Laser bias current`, `Laser output power`, `Receiver signal average
  optical power` or `Receiver signal OMA`); SFF-8636 and CMIS add `(Channel N)` (SFF-8636 prints the Rx
  power's with no space before it: `Rcvr signal avg optical power(Channel 1)`).
- `ethtool IF`: `Label: value` lines, a list (link modes) continued on lines without a colon.
- `ethtool --show-fec IF`: `Configured FEC encodings:` (ioctl) or `Supported/Configured FEC encodings:`
  (netlink) and `Active FEC encoding:`; encodings Auto, Off/None, RS, BaseR/BASER, LLRS.

Comparisons give one `FieldComparison` per field: `equal` (labctl's value printed with ethtool's decimals
is ethtool's text), `within rounding` (at most one unit of ethtool's last printed digit apart: its own
rounding, or a monitor's ADC moving one step between labctl's read and ethtool's), `different`, or present
on one side only (`ethtool only`, `labctl only`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from labctl.linux import ethtool_msgs as m
from labctl.linux.transceiver import DomReading

EQUAL = "equal"
ROUNDING = "within rounding"
DIFFERENT = "different"
ETHTOOL_ONLY = "ethtool only"
LABCTL_ONLY = "labctl only"
AGREE = frozenset({EQUAL, ROUNDING})


@dataclass(frozen=True, slots=True)
class Printed:
    """One value as ethtool printed it: the text, and for a number its value and decimals."""

    text: str
    value: float | None = None
    decimals: int | None = None


@dataclass(frozen=True, slots=True)
class FieldComparison:
    field: str
    labctl: str
    ethtool: str
    verdict: str

    @property
    def agrees(self) -> bool:
        return self.verdict in AGREE


# -- ethtool -m ------------------------------------------------------------------------------------------

_NUMBER = re.compile(r"^(-?inf|-?\d+(?:\.(\d+))?)")
_POWER = re.compile(r"^(-?\d+\.(\d+)) mW / (-?inf|-?\d+\.(\d+)) dBm")
_CHANNEL = re.compile(r"^(?P<label>.*?)\s*\(Channel (?P<lane>\d+)\)$")
_LANE_FIELDS = {
    "Laser bias current": "tx_bias_ma",
    "Laser tx bias current": "tx_bias_ma",
    "Laser output power": "tx_power",
    "Transmit avg optical power": "tx_power",
    "Receiver signal average optical power": "rx_power",
    "Rcvr signal avg optical power": "rx_power",
    "Receiver signal OMA": "rx_power",
}
_TEXT_FIELDS = {
    "Vendor name": "vendor_name",
    "Vendor OUI": "vendor_oui",
    "Vendor PN": "part_number",
    "Vendor rev": "revision",
    "Vendor SN": "serial_number",
    "Date code": "date_code",
}


def parse_labeled_lines(text: str) -> dict[str, str]:
    """`label : value` lines (ethtool -m's layout) → label → value, the first of repeated labels kept."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        label, sep, value = line.partition(" : ")
        if sep:
            out.setdefault(label.strip(), value.strip())
    return out


def _number(text: str) -> Printed:
    match = _NUMBER.match(text)
    if match is None:
        return Printed(text)
    return Printed(match.group(1), float(match.group(1)), len(match.group(2) or ""))


def module_fields(text: str) -> dict[str, Printed]:
    """`ethtool -m IF` → labctl's field names (those of `decoded_fields`) → what ethtool printed."""
    lines = parse_labeled_lines(text)
    out: dict[str, Printed] = {}
    if "Identifier" in lines:
        out["identifier"] = Printed(lines["Identifier"].split()[0].lower())
    for label, name in _TEXT_FIELDS.items():
        if label in lines:
            out[name] = Printed(lines[label])
    if "Module temperature" in lines:
        out["temperature_c"] = _number(lines["Module temperature"])
    if "Module voltage" in lines:
        out["supply_v"] = _number(lines["Module voltage"])
    for label, value in lines.items():
        channel = _CHANNEL.match(label)
        base, lane = (channel.group("label"), int(channel.group("lane"))) if channel else (label, 1)
        kind = _LANE_FIELDS.get(base)
        if kind is None:
            continue
        if kind == "rx_power":
            out["rx_power_type"] = Printed("oma" if "OMA" in base else "average")
        if kind == "tx_bias_ma":
            out[f"lane{lane}.tx_bias_ma"] = _number(value)
            continue
        power = _POWER.match(value)
        if power is None:
            out[f"lane{lane}.{kind}_mw"] = Printed(value)
            continue
        out[f"lane{lane}.{kind}_mw"] = Printed(power.group(1), float(power.group(1)), len(power.group(2)))
        dbm = power.group(3)
        out[f"lane{lane}.{kind}_dbm"] = Printed(dbm, float(dbm), len(power.group(4) or ""))
    return out


def decoded_fields(reading: DomReading) -> dict[str, str | float | None]:
    """labctl's decoding of a module under the names `module_fields` gives ethtool's. A dBm of None is no
    light (ethtool: -inf); a monitor the module lacks has no entry."""
    out: dict[str, str | float | None] = {"identifier": f"{reading.identifier:#04x}"}
    if reading.identity is not None:
        identity = reading.identity.to_dict()
        for name in _TEXT_FIELDS.values():
            out[name] = identity[name]
    if reading.temperature_c is not None:
        out["temperature_c"] = reading.temperature_c
    if reading.supply_v is not None:
        out["supply_v"] = reading.supply_v
    if reading.rx_power_type is not None and reading.lanes:
        out["rx_power_type"] = reading.rx_power_type
    for lane in reading.lanes:
        if lane.tx_bias_ma is not None:
            out[f"lane{lane.lane}.tx_bias_ma"] = lane.tx_bias_ma
        if lane.tx_power_mw is not None:
            out[f"lane{lane.lane}.tx_power_mw"] = lane.tx_power_mw
            out[f"lane{lane.lane}.tx_power_dbm"] = lane.tx_power_dbm
        if lane.rx_power_mw is not None:
            out[f"lane{lane.lane}.rx_power_mw"] = lane.rx_power_mw
            out[f"lane{lane.lane}.rx_power_dbm"] = lane.rx_power_dbm
    return out


def _compare_one(name: str, ours: str | float | None, theirs: Printed) -> FieldComparison:
    if isinstance(ours, str) or theirs.value is None:
        text = "" if ours is None else str(ours)
        return FieldComparison(name, text, theirs.text, EQUAL if text == theirs.text else DIFFERENT)
    if ours is None:  # no light: ethtool prints -inf dBm
        verdict = EQUAL if math.isinf(theirs.value) and theirs.value < 0 else DIFFERENT
        return FieldComparison(name, "-inf", theirs.text, verdict)
    digits = theirs.decimals or 0
    text = f"{ours:.{digits}f}"
    if text == theirs.text:
        return FieldComparison(name, text, theirs.text, EQUAL)
    if math.isfinite(theirs.value) and abs(ours - theirs.value) <= 10.0**-digits * (1 + 1e-9):
        return FieldComparison(name, text, theirs.text, ROUNDING)
    return FieldComparison(name, text, theirs.text, DIFFERENT)


def compare_module(
    ours: Mapping[str, str | float | None], theirs: Mapping[str, Printed]
) -> list[FieldComparison]:
    """Every field either side has, in labctl's order then ethtool's extras."""
    out = [
        _compare_one(name, value, theirs[name])
        if name in theirs
        else FieldComparison(name, _text(value), "", LABCTL_ONLY)
        for name, value in ours.items()
    ]
    out += [FieldComparison(name, "", p.text, ETHTOOL_ONLY) for name, p in theirs.items() if name not in ours]
    return out


def _text(value: object) -> str:
    if value is None:
        return "-inf"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


# -- ethtool IF and ethtool --show-fec --------------------------------------------------------------------

_FEC_NAMES = {"auto": "auto", "off": "off", "none": "off", "rs": "rs", "baser": "baser", "llrs": "llrs"}


def parse_colon_lines(text: str) -> dict[str, str]:
    """`Label: value` lines (ethtool IF, --show-fec); a line without a colon continues the one before."""
    out: dict[str, str] = {}
    last: str | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        label, sep, value = line.partition(":")
        if sep:
            last = label.strip()
            out[last] = value.strip()
        elif last is not None:
            out[last] = f"{out[last]} {line.strip()}".strip()
    return out


def _fec_set(text: str) -> frozenset[str]:
    if text.strip().lower() == "not reported":
        return frozenset()
    return frozenset(_FEC_NAMES.get(word.lower(), word.lower()) for word in text.split())


@dataclass(frozen=True, slots=True)
class LinkView:
    """A port's link as both sides can state it: link modes by the kernel's names, FEC by ethtool(8)'s
    encodings (auto, off, rs, baser, llrs). None: that side did not say."""

    supported_modes: frozenset[str] | None = None
    advertised_modes: frozenset[str] | None = None
    supported_fec: frozenset[str] | None = None
    autoneg: bool | None = None
    speed_mbps: int | None = None
    duplex: str | None = None
    link: bool | None = None
    configured_fec: frozenset[str] | None = None
    active_fec: str | None = None


def ethtool_link(settings_text: str | None, fec_text: str | None) -> LinkView:
    """`ethtool IF` and `ethtool --show-fec IF` output (either may be None: not run or refused)."""
    s = parse_colon_lines(settings_text or "")
    f = parse_colon_lines(fec_text or "")

    def modes(label: str) -> frozenset[str] | None:
        return frozenset(w for w in s[label].split() if m.is_link_mode(w)) if label in s else None

    speed = re.match(r"(\d+)Mb/s", s.get("Speed", ""))
    duplex = s.get("Duplex", "").lower()
    configured = f.get("Configured FEC encodings", f.get("Supported/Configured FEC encodings"))
    active = f.get("Active FEC encoding")
    return LinkView(
        supported_modes=modes("Supported link modes"),
        advertised_modes=modes("Advertised link modes"),
        supported_fec=_fec_set(s["Supported FEC modes"]) if "Supported FEC modes" in s else None,
        autoneg={"on": True, "off": False}.get(s.get("Auto-negotiation", "")),
        speed_mbps=int(speed.group(1)) if speed else None,
        duplex=duplex if duplex in ("full", "half") else None,
        link={"yes": True, "no": False}.get(s.get("Link detected", "")),
        configured_fec=_fec_set(configured) if configured is not None else None,
        active_fec=next(iter(_fec_set(active)), None) if active else None,
    )


def labctl_link(
    modes: m.LinkModes | None, names: Mapping[int, str], fec: m.FecState | None, link: bool | None
) -> LinkView:
    """The same view from labctl's netlink reads: LINKMODES_GET (with the ETH_SS_LINK_MODES names), FEC_GET
    and LINKSTATE_GET; None for each the driver does not answer."""
    ours = modes.ours if modes is not None else None

    def named(bits: Iterable[int], ours: m.Bitset) -> frozenset[str]:
        return frozenset(n for n in ours.named(bits, names) if m.is_link_mode(n))

    supported = ours.mask if ours is not None and ours.mask is not None else None
    fec_bits = {bit: name for name, bit in m.FEC_BITS.items()}
    configured = None
    active = None
    if fec is not None:
        value = fec.modes.value if fec.modes is not None else frozenset()
        configured = frozenset({"auto"} if fec.auto else set()) | {
            fec_bits[b] for b in value if b in fec_bits
        }
        active = fec_bits.get(fec.active) if fec.active is not None else None
    return LinkView(
        supported_modes=named(supported, ours) if ours is not None and supported is not None else None,
        advertised_modes=named(ours.value, ours) if ours is not None else None,
        supported_fec=frozenset(fec_bits[b] for b in supported if b in fec_bits)
        if supported is not None
        else None,
        autoneg=modes.autoneg if modes is not None else None,
        speed_mbps=modes.speed_mbps if modes is not None else None,
        duplex=modes.duplex if modes is not None else None,
        link=link,
        configured_fec=configured,
        active_fec=active,
    )


def compare_link(ours: LinkView, theirs: LinkView) -> list[FieldComparison]:
    """Field by field; a field neither side states is left out."""
    out = []
    for name in (f.name for f in dataclasses.fields(LinkView)):
        a, b = getattr(ours, name), getattr(theirs, name)
        if a is None and b is None:
            continue
        if a is None or b is None:
            verdict = ETHTOOL_ONLY if a is None else LABCTL_ONLY
        else:
            verdict = EQUAL if a == b else DIFFERENT
        out.append(FieldComparison(name, _show(a), _show(b), verdict))
    return out


def _show(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, frozenset):
        return " ".join(sorted(value)) or "(none)"
    return str(value).lower() if isinstance(value, bool) else str(value)
