"""Polatis NETCONF codec: the exact XML the driver sends, and what it reads out of the replies. Pure: text
in, values out, no I/O (ncclient frames and carries the messages).

Facts (shared reference §2): the optical-switch module (namespace `http://www.polatis.com/yang/optical-
switch`) holds `cross-connects/pair{ingress, egress}` (`pairs` before revision 2017-08-04, which the hello's
capability names), `opm-power/port{port-id, power}`, `product-information`, and the RPC `port-set-state`
(`port-enab`/`port-disab`). Changes are one `edit-config` on running: `merge` of the new pairs and `delete`
(by ingress, the list key) of the removed ones, nothing else, so one rail remap is one request.
Beyond patches: `voa/port{port-id, atten-mode, atten-level, reference-port}` (the variable optical
attenuators), `opm-config/port{port-id, wavelength, offset, averaging-time}` (the power monitors'
settings), and RFC 5277 `create-subscription` and `<notification>` (Polatis sends on the stream
"Polatis"; a change is a polatis-switch `activity-log-notification`). Decision: docs/decisions/0064.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

from labctl.core.errors import HardwareError
from labctl.inventory.mapping import Mapping, MappingDiff, PortSpace
from labctl.ocs.protocol import VOA_MODES

NS_BASE = "urn:ietf:params:xml:ns:netconf:base:1.0"
NS_OPSW = "http://www.polatis.com/yang/optical-switch"
NS_PLTS = "http://www.polatis.com/yang/polatis-switch"
NS_NOTIF = "urn:ietf:params:xml:ns:netconf:notification:1.0"
CAP_NOTIFICATION = "urn:ietf:params:netconf:capability:notification:1.0"
CAP_INTERLEAVE = "urn:ietf:params:netconf:capability:interleave:1.0"
LEVEL_MODES = ("VOA_MODE_ABSOLUTE", "VOA_MODE_RELATIVE", "VOA_MODE_CONVERGED")
"""The modes that carry an `atten-level` (the YANG's `when`): dBm for ABSOLUTE/CONVERGED, dB for RELATIVE."""
CAP_BASE_10 = "urn:ietf:params:netconf:base:1.0"
CAP_BASE_11 = "urn:ietf:params:netconf:base:1.1"
CAP_WRITABLE_RUNNING = "urn:ietf:params:netconf:capability:writable-running:1.0"
MODULE_CAPABILITY = f"{NS_OPSW}?module=optical-switch&revision="
"""Prefix of the capability a Polatis switch advertises in its hello (ONOS matches on the same prefix)."""
NO_LIGHT_DBM = -99.99
"""What a dark port reads (tcdona3's fallback value, as for TL1; the real device's value is unverified): a
reading at or below it is no light."""
PAIR_REVISION = "2017-08-04"
"""From this revision on the cross-connect list is `pair`; before it, `pairs` (ONOS parseKeyPairCompat)."""

_REVISION = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_PRODUCT_SIZE = re.compile(r"-(\d+)x(\d+)-")  # N-VST-512x512-LA1-DMHNV-701 (reference §2.2)


class NetconfReplyError(HardwareError):
    """A reply that is not what NETCONF or the Polatis model says it is (not XML, wrong shape, bad port)."""


@dataclass(frozen=True, slots=True)
class RpcError:
    """One `<rpc-error>` (RFC 6241 §4.3)."""

    tag: str
    type: str = ""
    severity: str = "error"
    message: str = ""
    app_tag: str = ""
    path: str = ""


class NetconfRpcError(HardwareError):
    """The switch answered an RPC with `<rpc-error>`: one line with the operation and each error-tag."""

    def __init__(self, switch: str, operation: str, errors: Sequence[RpcError]) -> None:
        self.switch = switch
        self.operation = operation
        self.errors = tuple(errors)
        super().__init__(error_line(switch, operation, errors))


def error_line(switch: str, operation: str, errors: Sequence[RpcError]) -> str:
    """`ocs1: edit-config refused: operation-failed (application): <message>; in-use …` on one line."""
    parts = []
    for e in errors:
        text = e.tag + (f" ({e.type})" if e.type else "")
        if e.app_tag:
            text += f" [{e.app_tag}]"
        if e.path:
            text += f" at {e.path}"
        if e.message:
            text += f": {e.message}"
        parts.append(" ".join(text.split()))
    return f"{switch}: {operation} refused: " + ("; ".join(parts) or "rpc-error without details")


@dataclass(frozen=True, slots=True)
class Reply:
    """An `<rpc-reply>`: its message-id, whether it was `<ok/>`, its `<data>`, its errors."""

    message_id: str
    ok: bool = False
    data: ET.Element | None = None
    errors: tuple[RpcError, ...] = ()
    warnings: tuple[RpcError, ...] = field(default=())
    """`<rpc-error>`s of severity warning: the operation succeeded."""


# -- capabilities ------------------------------------------------------------------------------------------
def module_revision(capabilities: Iterable[str]) -> str | None:
    """The optical-switch module revision the hello advertises (None: the switch does not have it)."""
    for capability in capabilities:
        text = capability.strip().replace("&amp;", "&")
        if text.startswith(MODULE_CAPABILITY):
            revision = text[len(MODULE_CAPABILITY) :].split("&", 1)[0]
            if _REVISION.match(revision):
                return revision
    return None


def list_name(revision: str) -> str:
    """`pair` from revision 2017-08-04 on, `pairs` before it (ISO dates compare as text)."""
    return "pair" if revision >= PAIR_REVISION else "pairs"


def size_from_model(model_name: str) -> PortSpace | None:
    """The port space a product code names (`N-VST-512x512-LA1-DMHNV-701` → 512x512), or None."""
    m = _PRODUCT_SIZE.search(f"-{model_name.strip()}-")
    return PortSpace(int(m[1]), int(m[2])) if m else None


# -- requests: the exact text on the wire (inside ncclient's framing) --------------------------------------
def rpc(message_id: str, operation: str) -> str:
    return f'<rpc message-id="{escape(message_id, {chr(34): "&quot;"})}" xmlns="{NS_BASE}">{operation}</rpc>'


def get(subtree: str) -> str:
    return f'<get><filter type="subtree">{subtree}</filter></get>'


def cross_connects_filter() -> str:
    """The whole cross-connect list: one empty container (the form ONOS sends)."""
    return f'<cross-connects xmlns="{NS_OPSW}"/>'


def product_filter() -> str:
    return f'<product-information xmlns="{NS_OPSW}"/>'


def opm_power_filter(ports: Iterable[int]) -> str:
    """Power of the given ports: one list entry per port-id (a content match on the key)."""
    entries = "".join(f"<port><port-id>{int(p)}</port-id><power/></port>" for p in sorted(set(ports)))
    return f'<opm-power xmlns="{NS_OPSW}">{entries}</opm-power>'


def port_status_filter(ports: Iterable[int]) -> str:
    """The admin status of the given ports (port-config/port/status)."""
    entries = "".join(f"<port><port-id>{int(p)}</port-id><status/></port>" for p in sorted(set(ports)))
    return f'<port-config xmlns="{NS_OPSW}">{entries}</port-config>'


def edit_config(diff: MappingDiff, name: str = "pair") -> str:
    """One `edit-config` on running for a diff: `delete` (by ingress, the key) of each removed pair whose
    ingress is not patched again, then `merge` of each new pair (a merge on an existing ingress replaces its
    egress, so a moved ingress is one entry, not a delete and a merge of the same key)."""
    readded = {ingress for ingress, _ in diff.add}
    entries = [
        f'<{name} nc:operation="delete"><ingress>{i}</ingress></{name}>'
        for i, _ in sorted(diff.remove)
        if i not in readded
    ]
    entries += [
        f'<{name} nc:operation="merge"><ingress>{i}</ingress><egress>{e}</egress></{name}>'
        for i, e in sorted(diff.add)
    ]
    return (
        f'<edit-config><target><running/></target><config xmlns:nc="{NS_BASE}">'
        f'<cross-connects xmlns="{NS_OPSW}">{"".join(entries)}</cross-connects></config></edit-config>'
    )


def port_set_state(enable: Iterable[int] = (), disable: Iterable[int] = ()) -> str:
    """The Polatis `port-set-state` RPC (reference §2.3: the enable/disable path; the reply is `<ok/>`)."""
    body = "".join(f"<port-enab>{int(p)}</port-enab>" for p in sorted(set(enable)))
    body += "".join(f"<port-disab>{int(p)}</port-disab>" for p in sorted(set(disable)))
    return f'<port-set-state xmlns="{NS_OPSW}">{body}</port-set-state>'


def close_session() -> str:
    return "<close-session/>"


def voa_filter(ports: Iterable[int]) -> str:
    """The attenuator settings of the given ports (a content match on the key per port)."""
    entries = "".join(f"<port><port-id>{int(p)}</port-id></port>" for p in sorted(set(ports)))
    return f'<voa xmlns="{NS_OPSW}">{entries}</voa>'


def voa_edit(ports: Iterable[int], mode: str, level: float | None = None, reference: int = 0) -> str:
    """One `edit-config` (merge) setting every given port's attenuator alike: `atten-mode`, `atten-level`
    (two fraction digits) for the modes that have one, `reference-port` for RELATIVE."""
    if mode not in VOA_MODES:
        raise ValueError(f"atten-mode {mode!r}: one of {', '.join(VOA_MODES)}")
    leaves = f"<atten-mode>{mode}</atten-mode>"
    if mode in LEVEL_MODES:
        if level is None:
            raise ValueError(f"{mode} needs an atten-level")
        leaves += f"<atten-level>{level:.2f}</atten-level>"
    if mode == "VOA_MODE_RELATIVE":
        leaves += f"<reference-port>{int(reference)}</reference-port>"
    entries = "".join(f"<port><port-id>{int(p)}</port-id>{leaves}</port>" for p in sorted(set(ports)))
    return _edit(f'<voa xmlns="{NS_OPSW}">{entries}</voa>')


def opm_config_filter(ports: Iterable[int]) -> str:
    entries = "".join(f"<port><port-id>{int(p)}</port-id></port>" for p in sorted(set(ports)))
    return f'<opm-config xmlns="{NS_OPSW}">{entries}</opm-config>'


def opm_config_edit(
    ports: Iterable[int],
    *,
    wavelength_nm: float | None = None,
    offset_db: float | None = None,
    averaging_time: int | None = None,
) -> str:
    """One `edit-config` (merge) of the given ports' power monitor settings: only the leaves given."""
    leaves = ""
    if wavelength_nm is not None:
        leaves += f"<wavelength>{wavelength_nm:.2f}</wavelength>"
    if offset_db is not None:
        leaves += f"<offset>{offset_db:.2f}</offset>"
    if averaging_time is not None:
        leaves += f"<averaging-time>{int(averaging_time)}</averaging-time>"
    entries = "".join(f"<port><port-id>{int(p)}</port-id>{leaves}</port>" for p in sorted(set(ports)))
    return _edit(f'<opm-config xmlns="{NS_OPSW}">{entries}</opm-config>')


def _edit(config: str) -> str:
    return f"<edit-config><target><running/></target><config>{config}</config></edit-config>"


def create_subscription(stream: str = "Polatis") -> str:
    """RFC 5277 §2.1.1, on a named stream, no filter, no replay."""
    return f'<create-subscription xmlns="{NS_NOTIF}"><stream>{escape(stream)}</stream></create-subscription>'


# -- replies -----------------------------------------------------------------------------------------------
def _q(ns: str, tag: str) -> str:
    return f"{{{ns}}}{tag}"


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _text(element: ET.Element | None) -> str:
    return "" if element is None else "".join(element.itertext()).strip()


def parse_xml(raw: str, what: str = "reply") -> ET.Element:
    """Parse one message; refuse DTDs (no entity expansion from a peer) and anything that is not XML."""
    if "<!DOCTYPE" in raw or "<!ENTITY" in raw:
        raise NetconfReplyError(f"{what} carries a DTD; refused")
    try:
        return ET.fromstring(raw)
    except ET.ParseError as e:
        raise NetconfReplyError(f"{what} is not XML ({e})") from None


def parse_reply(raw: str) -> Reply:
    """An `<rpc-reply>` in the base namespace: `<ok/>`, `<data>`, and its `<rpc-error>`s."""
    root = parse_xml(raw)
    if root.tag != _q(NS_BASE, "rpc-reply"):
        raise NetconfReplyError(f"expected rpc-reply, got {_local(root.tag)}")
    errors: list[RpcError] = []
    warnings: list[RpcError] = []
    for element in root.findall(_q(NS_BASE, "rpc-error")):

        def field_of(name: str, element: ET.Element = element) -> str:
            return _text(element.find(_q(NS_BASE, name)))

        error = RpcError(
            tag=field_of("error-tag") or "unknown",
            type=field_of("error-type"),
            severity=field_of("error-severity") or "error",
            message=field_of("error-message"),
            app_tag=field_of("error-app-tag"),
            path=field_of("error-path"),
        )
        (warnings if error.severity == "warning" else errors).append(error)
    return Reply(
        message_id=root.get("message-id", ""),
        ok=root.find(_q(NS_BASE, "ok")) is not None,
        data=root.find(_q(NS_BASE, "data")),
        errors=tuple(errors),
        warnings=tuple(warnings),
    )


def _int_leaf(entry: ET.Element, name: str, where: str) -> int:
    text = _text(entry.find(_q(NS_OPSW, name)))
    if not text.isdigit():
        raise NetconfReplyError(f"{where}: {name} {text!r} is not a port number")
    return int(text)


def parse_cross_connects(data: ET.Element | None) -> Mapping:
    """The `(ingress, egress)` pairs of a `<data>` holding `cross-connects` (either list name)."""
    if data is None:
        raise NetconfReplyError("cross-connects reply has no <data>")
    pairs: set[tuple[int, int]] = set()
    for container in data.findall(_q(NS_OPSW, "cross-connects")):
        for entry in container:
            if entry.tag not in (_q(NS_OPSW, "pair"), _q(NS_OPSW, "pairs")):
                continue
            pairs.add(
                (_int_leaf(entry, "ingress", "cross-connects"), _int_leaf(entry, "egress", "cross-connects"))
            )
    return frozenset(pairs)


def parse_opm_power(data: ET.Element | None) -> dict[int, float | None]:
    """port-id → dBm; a port whose `power` is missing, empty or at the no-light floor reads None."""
    if data is None:
        raise NetconfReplyError("opm-power reply has no <data>")
    powers: dict[int, float | None] = {}
    for container in data.findall(_q(NS_OPSW, "opm-power")):
        for entry in container.findall(_q(NS_OPSW, "port")):
            port = _int_leaf(entry, "port-id", "opm-power")
            text = _text(entry.find(_q(NS_OPSW, "power")))
            if not text:
                powers[port] = None
                continue
            try:
                dbm = float(text)
            except ValueError:
                raise NetconfReplyError(f"opm-power: port {port} power {text!r} is not a number") from None
            powers[port] = None if dbm != dbm or dbm <= NO_LIGHT_DBM else dbm  # NaN or the floor: no light
    return powers


def parse_port_status(data: ET.Element | None) -> dict[int, str]:
    """port-id → ENABLED, DISABLED, FAILED or UNSUPPORTED (as the switch spells it, upper-cased)."""
    if data is None:
        raise NetconfReplyError("port-config reply has no <data>")
    states: dict[int, str] = {}
    for container in data.findall(_q(NS_OPSW, "port-config")):
        for entry in container.findall(_q(NS_OPSW, "port")):
            states[_int_leaf(entry, "port-id", "port-config")] = _text(
                entry.find(_q(NS_OPSW, "status"))
            ).upper()
    return states


@dataclass(frozen=True, slots=True)
class ProductInformation:
    manufacturer: str = ""
    serial_number: str = ""
    model_name: str = ""
    software_version: str = ""


def parse_product(data: ET.Element | None) -> ProductInformation:
    info = None if data is None else data.find(_q(NS_OPSW, "product-information"))
    if info is None:
        raise NetconfReplyError("the switch returned no product-information")

    def leaf(name: str) -> str:
        return _text(info.find(_q(NS_OPSW, name)))

    return ProductInformation(
        leaf("manufacturer"), leaf("serial-number"), leaf("model-name"), leaf("software-version")
    )


@dataclass(frozen=True, slots=True)
class VoaPort:
    """One port's `voa/port` entry: its mode, its level (None where the mode has none), its reference."""

    mode: str = "VOA_MODE_NONE"
    level: float | None = None
    reference: int = 0

    @property
    def attenuation_db(self) -> float | None:
        """dB below the port's patched light: 0.0 for NONE, the level for RELATIVE to the patched ingress,
        None for a setting of another kind (a target output power, maximum, fixed)."""
        if self.mode == "VOA_MODE_NONE":
            return 0.0
        if self.mode == "VOA_MODE_RELATIVE" and self.reference == 0:
            return self.level
        return None


def _decimal(entry: ET.Element, name: str, where: str) -> float | None:
    text = _text(entry.find(_q(NS_OPSW, name)))
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise NetconfReplyError(f"{where}: {name} {text!r} is not a number") from None
    if value != value:
        raise NetconfReplyError(f"{where}: {name} is not a number")
    return value


def parse_voa(data: ET.Element | None) -> dict[int, VoaPort]:
    """port-id → its attenuator setting (a port the switch leaves out: no entry)."""
    if data is None:
        raise NetconfReplyError("voa reply has no <data>")
    out: dict[int, VoaPort] = {}
    for container in data.findall(_q(NS_OPSW, "voa")):
        for entry in container.findall(_q(NS_OPSW, "port")):
            port = _int_leaf(entry, "port-id", "voa")
            mode = _text(entry.find(_q(NS_OPSW, "atten-mode"))) or "VOA_MODE_NONE"
            if mode not in VOA_MODES:
                raise NetconfReplyError(f"voa: port {port} atten-mode {mode!r} is not a Polatis mode")
            ref = _text(entry.find(_q(NS_OPSW, "reference-port")))
            if ref and not ref.isdigit():
                raise NetconfReplyError(f"voa: port {port} reference-port {ref!r} is not a port number")
            level = _decimal(entry, "atten-level", "voa")
            out[port] = VoaPort(mode, level if mode in LEVEL_MODES else None, int(ref or 0))
    return out


@dataclass(frozen=True, slots=True)
class OpmPort:
    """One port's `opm-config/port` entry (the YANG's defaults where a leaf is absent)."""

    wavelength_nm: float = 1550.0
    offset_db: float = 0.0
    averaging_time: int = 4


def parse_opm_config(data: ET.Element | None) -> dict[int, OpmPort]:
    if data is None:
        raise NetconfReplyError("opm-config reply has no <data>")
    out: dict[int, OpmPort] = {}
    for container in data.findall(_q(NS_OPSW, "opm-config")):
        for entry in container.findall(_q(NS_OPSW, "port")):
            port = _int_leaf(entry, "port-id", "opm-config")
            wavelength = _decimal(entry, "wavelength", "opm-config")
            offset = _decimal(entry, "offset", "opm-config")
            averaging = _text(entry.find(_q(NS_OPSW, "averaging-time")))
            if averaging and not averaging.isdigit():
                raise NetconfReplyError(
                    f"opm-config: port {port} averaging-time {averaging!r} is not a number"
                )
            out[port] = OpmPort(
                1550.0 if wavelength is None else wavelength,
                0.0 if offset is None else offset,
                int(averaging or 4),
            )
    return out


@dataclass(frozen=True, slots=True)
class Notification:
    """An RFC 5277 `<notification>`: its event's name and namespace, `eventTime` as sent, and the event's
    leaves (name → text; a nested element's leaves are joined under `parent/child`)."""

    name: str
    namespace: str
    event_time: str
    fields: dict[str, str] = field(default_factory=dict)


def parse_notification(raw: str) -> Notification:
    root = parse_xml(raw, "notification")
    if root.tag != _q(NS_NOTIF, "notification"):
        raise NetconfReplyError(f"expected notification, got {_local(root.tag)}")
    event_time = _text(root.find(_q(NS_NOTIF, "eventTime")))
    events = [c for c in root if c.tag != _q(NS_NOTIF, "eventTime")]
    if not events:
        raise NetconfReplyError("a notification without an event")
    event = events[0]
    fields: dict[str, str] = {}

    def walk(element: ET.Element, prefix: str) -> None:
        for child in element:
            name = prefix + _local(child.tag)
            if len(child):
                walk(child, name + "/")
            else:
                fields[name] = _text(child)

    walk(event, "")
    namespace = event.tag[1:].split("}", 1)[0] if event.tag.startswith("{") else ""
    return Notification(_local(event.tag), namespace, event_time, fields)
