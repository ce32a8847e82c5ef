"""The Polatis YANG data the NETCONF emulator serves: the data trees read from the switch model, filtered.

The nodes of the optical-switch module (shared reference §2.2): `product-information`, `cross-connects`
(its list is `pair`, or `pairs` before revision 2017-08-04), `port-config` (with each port's `status`),
`opm-power`, `opm-config` and `voa`; and the polatis-switch `activity-log-notification`. RFC 6241 §6
subtree filtering selects from them (for get, get-config and a subscription's notifications), and they go
out as XML with a default namespace declared where it changes. What no source shows (the dark-port power
reading, the model name's suffix) is an emulator choice, listed in docs/decisions/0031.
"""

from __future__ import annotations

import copy
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from xml.sax.saxutils import escape, quoteattr

from labctl.models.switch import SwitchModel

__all__ = [
    "BASE",
    "LATEST_REVISION",
    "LEVEL_MODES",
    "NOTIF",
    "OPSW",
    "PLTS",
    "activity_log_notification",
    "data",
    "leaf",
    "split_tag",
    "subtree_filter",
    "text_of",
    "to_xml",
]

BASE = "urn:ietf:params:xml:ns:netconf:base:1.0"
OPSW = "http://www.polatis.com/yang/optical-switch"
PLTS = "http://www.polatis.com/yang/polatis-switch"
NOTIF = "urn:ietf:params:xml:ns:netconf:notification:1.0"
LATEST_REVISION = "2018-03-22"
NO_LIGHT_DBM = -99.99  # a dark port's reading, as the TL1 front end prints it (the real value is unverified)
LEVEL_MODES = ("VOA_MODE_ABSOLUTE", "VOA_MODE_RELATIVE", "VOA_MODE_CONVERGED")
"""The modes whose `atten-level` exists (the YANG's `when`)."""


# -- subtree filtering (RFC 6241 §6) -----------------------------------------------------------------------
def _named(data_tag: str, filter_tag: str) -> bool:
    """A filter node without a namespace matches the name in any namespace."""
    if filter_tag.startswith("{"):
        return data_tag == filter_tag
    return data_tag.rsplit("}", 1)[-1] == filter_tag


def text_of(element: ET.Element) -> str:
    return (element.text or "").strip()


def _filter_node(data: ET.Element, node: ET.Element) -> ET.Element | None:
    """`data` as the filter node `node` (same name) selects it, or None where it selects nothing."""
    children = list(node)
    if not children:
        if text_of(node):  # a content match node on its own: the leaf if it has that value
            return copy.deepcopy(data) if text_of(data) == text_of(node) else None
        return copy.deepcopy(data)  # a selection node, or an empty container: all of it
    matches = [c for c in children if len(c) == 0 and text_of(c)]
    for match in matches:
        if not any(_named(d.tag, match.tag) and text_of(d) == text_of(match) for d in data):
            return None  # a list entry whose key (or any content match) differs
    others = [c for c in children if not any(c is m for m in matches)]
    out = ET.Element(data.tag, data.attrib)
    if not others:
        out.extend(copy.deepcopy(d) for d in data)  # content matches only: the whole entry
        return out
    for child in data:
        if any(_named(child.tag, m.tag) for m in matches):
            out.append(copy.deepcopy(child))
            continue
        for other in others:
            if _named(child.tag, other.tag):
                selected = _filter_node(child, other)
                if selected is not None:
                    out.append(selected)
                    break
    return out if matches or len(out) else None


def subtree_filter(roots: Iterable[ET.Element], nodes: Iterable[ET.Element] | None) -> list[ET.Element]:
    """The parts of the data trees `roots` that the filter's top-level `nodes` select (None: no filter)."""
    roots = list(roots)
    if nodes is None:
        return roots
    nodes = list(nodes)
    out: list[ET.Element] = []
    for root in roots:
        for node in nodes:
            if _named(root.tag, node.tag):
                selected = _filter_node(root, node)
                if selected is not None:
                    out.append(selected)
                    break
    return out


# -- XML out -----------------------------------------------------------------------------------------------
def split_tag(tag: str) -> tuple[str, str]:
    if tag.startswith("{"):
        ns, _, local = tag[1:].partition("}")
        return ns, local
    return "", tag


def to_xml(element: ET.Element, parent_ns: str = "") -> str:
    """Serialize with a default namespace declared where it changes (no `ns0:` prefixes)."""
    ns, local = split_tag(element.tag)
    attrs = "".join(f" {k}={quoteattr(v)}" for k, v in element.attrib.items() if not k.startswith("{"))
    declare = f' xmlns="{ns}"' if ns != parent_ns else ""
    inner = escape(element.text or "") + "".join(to_xml(c, ns) + escape(c.tail or "") for c in element)
    return f"<{local}{declare}{attrs}>{inner}</{local}>" if inner else f"<{local}{declare}{attrs}/>"


def leaf(parent: ET.Element, tag: str, text: object) -> ET.Element:
    element = ET.SubElement(parent, tag)
    element.text = str(text)
    return element


# -- the data trees ----------------------------------------------------------------------------------------
def data(
    model: SwitchModel,
    nodes: list[ET.Element] | None,
    *,
    config_only: bool,
    list_name: str,
    disabled: AbstractSet[int],
) -> str:
    """The `<data>` of a get (or, `config_only`, a get-config) with the filter's top-level `nodes` (None: no
    filter): only the trees the filter names are built."""
    builders: dict[str, Callable[[], ET.Element]] = {
        "product-information": lambda: _product_information(model),
        "cross-connects": lambda: _cross_connects(model, list_name),
        "port-config": lambda: _port_config(model, disabled, config_only),
        "opm-power": lambda: _opm_power(model),
        "opm-config": lambda: _opm_config(model),
        "voa": lambda: _voa(model),
    }
    if config_only:
        config = ("cross-connects", "port-config", "opm-config", "voa")
        builders = {k: v for k, v in builders.items() if k in config}
    wanted = None if nodes is None else {split_tag(n.tag)[1] for n in nodes}
    roots = [build() for name, build in builders.items() if wanted is None or name in wanted]
    return "<data>" + "".join(to_xml(e, BASE) for e in subtree_filter(roots, nodes)) + "</data>"


def activity_log_notification(user: str, address: str, activity: str) -> ET.Element:
    """The polatis-switch notification of a change: who made it, from where, over NETCONF, and what."""
    event = ET.Element(f"{{{PLTS}}}activity-log-notification")
    leaf(event, f"{{{PLTS}}}notification-username", user)
    if address:
        leaf(event, f"{{{PLTS}}}notification-ip-address", address)
    leaf(event, f"{{{PLTS}}}notification-protocol", "NETCONF")
    leaf(event, f"{{{PLTS}}}notification-activity", activity)
    return event


def _product_information(model: SwitchModel) -> ET.Element:
    space = model.space
    root = ET.Element(f"{{{OPSW}}}product-information")
    leaf(root, f"{{{OPSW}}}manufacturer", "Polatis")
    leaf(root, f"{{{OPSW}}}serial-number", "LABCTL-EMU-0001")
    leaf(root, f"{{{OPSW}}}model-name", f"N-VST-{space.n_ingress}x{space.n_egress}-LABCTL-EMU")
    leaf(root, f"{{{OPSW}}}software-version", "labctl-emulator")
    return root


def _cross_connects(model: SwitchModel, list_name: str) -> ET.Element:
    root = ET.Element(f"{{{OPSW}}}cross-connects")
    for ingress, egress in sorted(model.patches):
        entry = ET.SubElement(root, f"{{{OPSW}}}{list_name}")
        leaf(entry, f"{{{OPSW}}}ingress", ingress)
        leaf(entry, f"{{{OPSW}}}egress", egress)
    return root


def _port_config(model: SwitchModel, disabled: AbstractSet[int], config_only: bool) -> ET.Element:
    root = ET.Element(f"{{{OPSW}}}port-config")
    for port in model.space.all_ports:
        entry = ET.SubElement(root, f"{{{OPSW}}}port")
        leaf(entry, f"{{{OPSW}}}port-id", port)
        leaf(entry, f"{{{OPSW}}}label", "")
        if not config_only:
            leaf(entry, f"{{{OPSW}}}status", "DISABLED" if port in disabled else "ENABLED")
    return root


def _opm_config(model: SwitchModel) -> ET.Element:
    root = ET.Element(f"{{{OPSW}}}opm-config")
    for port in model.space.all_ports:
        config = model.opm_config(port)
        entry = ET.SubElement(root, f"{{{OPSW}}}port")
        leaf(entry, f"{{{OPSW}}}port-id", port)
        leaf(entry, f"{{{OPSW}}}wavelength", f"{config.wavelength_nm:.2f}")
        leaf(entry, f"{{{OPSW}}}offset", f"{config.offset_db:.2f}")
        leaf(entry, f"{{{OPSW}}}averaging-time", config.averaging_time)
    return root


def _voa(model: SwitchModel) -> ET.Element:
    """Every egress port's attenuator (atten-level only where the mode uses it, reference-port only for
    RELATIVE: the YANG's `when` conditions)."""
    root = ET.Element(f"{{{OPSW}}}voa")
    for port in model.space.egress:
        setting = model.voa_setting(port)
        entry = ET.SubElement(root, f"{{{OPSW}}}port")
        leaf(entry, f"{{{OPSW}}}port-id", port)
        leaf(entry, f"{{{OPSW}}}atten-mode", setting.mode)
        if setting.mode in LEVEL_MODES:
            leaf(entry, f"{{{OPSW}}}atten-level", f"{setting.level:.2f}")
        if setting.mode == "VOA_MODE_RELATIVE":
            leaf(entry, f"{{{OPSW}}}reference-port", setting.reference)
    return root


def _opm_power(model: SwitchModel) -> ET.Element:
    root = ET.Element(f"{{{OPSW}}}opm-power")
    for port in model.space.all_ports:
        entry = ET.SubElement(root, f"{{{OPSW}}}port")
        leaf(entry, f"{{{OPSW}}}port-id", port)
        dbm = model.monitor_dbm(port)
        leaf(entry, f"{{{OPSW}}}power", f"{NO_LIGHT_DBM if dbm is None else dbm:.2f}")
    return root
