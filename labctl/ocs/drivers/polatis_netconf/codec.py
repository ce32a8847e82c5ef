"""Polatis NETCONF codec: the exact XML the driver sends, and what it reads out of the replies. Pure: text
in, values out, no I/O (ncclient frames and carries the messages).

Facts (shared reference §2): the optical-switch module (namespace `http://www.polatis.com/yang/optical-
switch`) holds `cross-connects/pair{ingress, egress}` (`pairs` before revision 2017-08-04, which the hello's
capability names), `opm-power/port{port-id, power}`, `product-information`, and the RPC `port-set-state`
(`port-enab`/`port-disab`). Changes are one `edit-config` on running: `merge` of the new pairs and `delete`
(by ingress, the list key) of the removed ones, nothing else, so one rail remap is one request.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

from labctl.core.errors import HardwareError
from labctl.inventory.mapping import Mapping, MappingDiff, PortSpace

NS_BASE = "urn:ietf:params:xml:ns:netconf:base:1.0"
NS_OPSW = "http://www.polatis.com/yang/optical-switch"
NS_PLTS = "http://www.polatis.com/yang/polatis-switch"
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
