"""The operations of the NETCONF emulator: each `<rpc>` checked, carried out on the switch model, answered.

get and get-config (subtree filters, the empty-container form ONOS sends included; the data is
labctl.emulators.netconf_data's), edit-config on running (cross-connects, the variable optical attenuators
`voa` and the power monitor settings `opm-config`; every operation attribute, checked in full before
anything changes, patches first, settings once they went in), lock/unlock, close-session, the
optical-switch RPC port-set-state (and its polatis-switch form port-shutter-set-state), and RFC 5277
create-subscription. A mistake is an `rpc-error` with the RFC 6241 tag it deserves; a refusal (the model's
ChangeRefused, or the fault plan's) is `operation-failed`. No transport here: the front end
(labctl.emulators.netconf) frames, delivers and notifies.

This parser is written independently of the driver's codec (labctl/ocs/drivers/polatis_netconf/codec.py)
on purpose, so that a mistake in one is not mirrored by the other.
"""

from __future__ import annotations

import asyncio
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from collections.abc import Mapping as MappingType
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from labctl.core.errors import InputError
from labctl.emulators.core import SwitchEmulator
from labctl.emulators.netconf_data import (
    BASE,
    LATEST_REVISION,
    LEVEL_MODES,
    NOTIF,
    OPSW,
    PLTS,
    data,
    split_tag,
    text_of,
)
from labctl.emulators.netconf_session import NetconfSession
from labctl.inventory.mapping import MappingDiff
from labctl.models.switch import VOA_MODES, ChangeRefused, OpmConfig, SwitchModel, VoaSetting

__all__ = ["STREAMS", "NetconfOperations", "RpcError", "error_xml", "parse_xml"]

STREAMS = ("NETCONF", "Polatis")
"""RFC 5277's default stream, and the one Polatis sends its notifications on (polatis-switch YANG,
`mask-notification`; ONOS's notificationStream=Polatis). Both carry the same events here."""
_DECIMAL2 = re.compile(r"^[+-]?\d{1,6}(\.\d{1,2})?$")  # the YANG's floatFormat2d: two fraction digits


# -- errors ------------------------------------------------------------------------------------------------
class RpcError(Exception):
    """An `rpc-error` (RFC 6241 §4.3): its error-tag, message, error-type and error-info."""

    def __init__(
        self, tag: str, message: str, *, type_: str = "application", info: MappingType[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.tag = tag
        self.message = message
        self.type = type_
        self.info = dict(info or {})


def error_xml(error: RpcError) -> str:
    """The `<rpc-error>` element of an error, for the reply."""
    info = "".join(f"<{k}>{escape(v)}</{k}>" for k, v in error.info.items())
    return (
        f"<rpc-error><error-type>{error.type}</error-type><error-tag>{error.tag}</error-tag>"
        f"<error-severity>error</error-severity>"
        f'<error-message xml:lang="en">{escape(error.message)}</error-message>'
        + (f"<error-info>{info}</error-info>" if info else "")
        + "</rpc-error>"
    )


def parse_xml(text: str) -> ET.Element:
    """One message as XML; no DTDs (no entity expansion from a client)."""
    if "<!DOCTYPE" in text or "<!ENTITY" in text:
        raise RpcError("malformed-message", "DTDs are not accepted", type_="rpc")
    try:
        return ET.fromstring(text)
    except ET.ParseError as e:
        raise RpcError("malformed-message", f"not XML: {e}", type_="rpc") from None


def _operation_of(element: ET.Element) -> str | None:
    """The edit operation, written `operation` (as ONOS does) or in the base namespace (`nc:`/`xc:`)."""
    return element.get(f"{{{BASE}}}operation") or element.get("operation")


def _decimal2(element: ET.Element, name: str) -> float:
    """A floatFormat2d leaf (decimal64, two fraction digits)."""
    text = text_of(element)
    if not _DECIMAL2.match(text):
        raise RpcError(
            "invalid-value",
            f"{name} {text!r} is not a decimal with up to 2 fraction digits",
            info={"bad-element": name},
        )
    return float(text)


def _reference(element: ET.Element, space: Any) -> int:
    """voa reference-port: 0 (the patched ingress) or an ingress port."""
    text = text_of(element)
    if not text.isdigit() or (int(text) != 0 and not space.is_ingress(int(text))):
        raise RpcError(
            "invalid-value",
            f"reference-port {text!r} is not 0 or an ingress port 1..{space.n_ingress}",
            info={"bad-element": "reference-port"},
        )
    return int(text)


def _port(element: ET.Element, n: int, name: str) -> int:
    text = text_of(element)
    if not text.isdigit() or not 1 <= int(text) <= n:
        raise RpcError("invalid-value", f"{name} {text!r} is not a port 1..{n}", info={"bad-element": name})
    return int(text)


class NetconfOperations(SwitchEmulator):
    """The NETCONF operations over a switch model, without a transport: `answer` turns one `<rpc>` into its
    `<rpc-reply>`, the change it set moving, and the line it adds to the activity log. State beyond the
    core's: the ports disabled (`disabled`), the session holding the lock on running (`locked_by`), the
    optical-switch `revision` served and the name of its cross-connects list (`list_name`)."""

    change_verbs = frozenset({"EDIT-CONFIG"})

    def __init__(self, model: SwitchModel, *, revision: str = LATEST_REVISION, **core: Any) -> None:
        super().__init__(model, **core)
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", revision):
            raise InputError(f"optical-switch revision {revision!r} is not a date like {LATEST_REVISION}")
        self.revision = revision
        self.list_name = "pair" if revision >= "2017-08-04" else "pairs"
        self.disabled: set[int] = set()
        self.locked_by: NetconfSession | None = None
        self._staged: list[Callable[[], None]] = []  # config an edit-config applies once its change went in
        self._activity: list[str] = []  # what the current RPC changed, for activity-log-notification

    def lose_state(self) -> None:
        """As after a reboot: every patch gone, outputs dark, every port enabled."""
        super().lose_state()
        self.disabled.clear()

    async def answer(
        self, session: NetconfSession, text: str
    ) -> tuple[str, asyncio.Task[tuple[int, int]] | None, str]:
        """The `<rpc-reply>` to one `<rpc>`, the change of patches it set moving (None: none), and what it
        changed for the activity log ("": nothing, or it failed)."""
        moving: asyncio.Task[tuple[int, int]] | None = None
        attributes: dict[str, str] = {}
        activity = ""
        self._staged, self._activity = [], []
        try:
            rpc = parse_xml(text)
            if rpc.tag != f"{{{BASE}}}rpc":
                raise RpcError("unknown-element", f"expected <rpc> of {BASE}, got {rpc.tag}", type_="rpc")
            attributes = {k: v for k, v in rpc.attrib.items() if not k.startswith("{")}
            if "message-id" not in attributes:
                raise RpcError(
                    "missing-attribute",
                    "<rpc> has no message-id",
                    type_="rpc",
                    info={"bad-attribute": "message-id", "bad-element": "rpc"},
                )
            operations = list(rpc)
            if len(operations) != 1:
                raise RpcError("malformed-message", "an <rpc> holds exactly one operation", type_="rpc")
            body, diff = self._operation(session, operations[0])
            if diff is not None and not diff.empty:
                moving = await self.move(diff)
            for apply in self._staged:  # attenuators and monitors, once the patches were accepted
                apply()
            activity = "; ".join(self._activity)
        except RpcError as e:
            body = error_xml(e)
        except ChangeRefused as e:  # the switch itself said no
            body = error_xml(RpcError("operation-failed", str(e)))
        finally:
            self._staged, self._activity = [], []
        attrs = "".join(f" {k}={quoteattr(v)}" for k, v in attributes.items())
        return f'<rpc-reply xmlns="{BASE}"{attrs}>{body}</rpc-reply>', moving, activity

    def _operation(self, session: NetconfSession, op: ET.Element) -> tuple[str, MappingDiff | None]:
        ns, name = split_tag(op.tag)
        handlers: dict[
            tuple[str, str], Callable[[NetconfSession, ET.Element], tuple[str, MappingDiff | None]]
        ]
        handlers = {
            (BASE, "get"): self._get,
            (BASE, "get-config"): self._get_config,
            (BASE, "edit-config"): self._edit_config,
            (BASE, "lock"): self._lock,
            (BASE, "unlock"): self._unlock,
            (BASE, "close-session"): self._close_session,
            (OPSW, "port-set-state"): self._port_set_state,
            (PLTS, "port-shutter-set-state"): self._port_set_state,
            (NOTIF, "create-subscription"): self._create_subscription,
        }
        handler = handlers.get((ns, name))
        if handler is None:
            if ns not in (BASE, OPSW, PLTS, NOTIF):
                raise RpcError("unknown-namespace", f"unknown namespace {ns!r}", type_="protocol")
            raise RpcError("operation-not-supported", f"{name} is not supported here", type_="protocol")
        return handler(session, op)

    # -- operations -----------------------------------------------------------------------------------------
    def _filter(self, op: ET.Element) -> list[ET.Element] | None:
        flt = op.find(f"{{{BASE}}}filter")
        if flt is None:
            return None
        kind = flt.get("type", "subtree")
        if kind != "subtree":
            raise RpcError(
                "operation-not-supported", f"filter type {kind!r} (only subtree)", type_="protocol"
            )
        return list(flt)

    def _get(self, session: NetconfSession, op: ET.Element) -> tuple[str, None]:
        return data(
            self.model, self._filter(op), config_only=False, list_name=self.list_name, disabled=self.disabled
        ), None

    def _get_config(self, session: NetconfSession, op: ET.Element) -> tuple[str, None]:
        self._datastore(op, "source")
        return data(
            self.model, self._filter(op), config_only=True, list_name=self.list_name, disabled=self.disabled
        ), None

    def _datastore(self, op: ET.Element, role: str) -> None:
        holder = op.find(f"{{{BASE}}}{role}")
        if holder is None or len(holder) != 1:
            raise RpcError(
                "missing-element",
                f"<{role}> names no datastore",
                type_="protocol",
                info={"bad-element": role},
            )
        store = split_tag(holder[0].tag)[1]
        if store != "running":
            raise RpcError(
                "invalid-value", f"datastore {store!r}: this switch has only running", type_="protocol"
            )

    def _lock(self, session: NetconfSession, op: ET.Element) -> tuple[str, None]:
        self._datastore(op, "target")
        if self.locked_by is not None and self.locked_by is not session:
            raise RpcError(
                "lock-denied",
                "running is locked",
                type_="protocol",
                info={"session-id": str(self.locked_by.session_id)},
            )
        self.locked_by = session
        return "<ok/>", None

    def _unlock(self, session: NetconfSession, op: ET.Element) -> tuple[str, None]:
        self._datastore(op, "target")
        if self.locked_by is not session:
            raise RpcError("operation-failed", "this session holds no lock on running", type_="protocol")
        self.locked_by = None
        return "<ok/>", None

    def _close_session(self, session: NetconfSession, op: ET.Element) -> tuple[str, None]:
        session.ending = True
        return "<ok/>", None

    def _port_set_state(self, session: NetconfSession, op: ET.Element) -> tuple[str, None]:
        """optical-switch `port-set-state` (ONOS), or polatis-switch `port-shutter-set-state` (tcdona3's
        client): leaf-lists `port-enab` and `port-disab`, on the one enabled/disabled state that
        `port-config/status` reports (decision 0084)."""
        rpc = split_tag(op.tag)[1]
        n = self.model.space.n_ingress + self.model.space.n_egress
        changes: list[tuple[int, bool]] = []
        for child in op:
            name = split_tag(child.tag)[1]
            if name not in ("port-enab", "port-disab"):
                raise RpcError("unknown-element", f"{rpc} has no {name}", info={"bad-element": name})
            port = _port(child, n, name)
            changes.append((port, name == "port-disab"))
        for port, disable in changes:
            (self.disabled.add if disable else self.disabled.discard)(port)
        if changes:
            self._activity.append(
                f"{rpc}: " + ", ".join(f"{'disable' if off else 'enable'} {port}" for port, off in changes)
            )
        return "<ok/>", None

    def _create_subscription(self, session: NetconfSession, op: ET.Element) -> tuple[str, None]:
        """RFC 5277 §2.1.1: a stream (default NETCONF), an optional subtree filter; no replay."""
        if session.subscription is not None:
            raise RpcError("operation-failed", "this session already has a subscription (RFC 5277 §2.1.1)")
        stream, nodes = "NETCONF", []
        for child in op:
            name = split_tag(child.tag)[1]
            if name == "stream":
                stream = text_of(child)
            elif name == "filter":
                if child.get("type", "subtree") != "subtree":
                    raise RpcError("operation-not-supported", "filter type (only subtree)", type_="protocol")
                nodes = list(child)
            elif name in ("startTime", "stopTime"):
                raise RpcError(
                    "operation-failed",
                    f"{name}: this switch keeps no notification replay",
                    info={"bad-element": name},
                )
            else:
                raise RpcError(
                    "unknown-element", f"create-subscription has no {name}", info={"bad-element": name}
                )
        if stream not in STREAMS:
            raise RpcError(
                "invalid-value",
                f"no stream {stream!r} (streams: {', '.join(STREAMS)})",
                info={"bad-element": "stream"},
            )
        session.subscription = nodes
        return "<ok/>", None

    def _edit_config(self, session: NetconfSession, op: ET.Element) -> tuple[str, MappingDiff | None]:
        self._datastore(op, "target")
        if self.locked_by is not None and self.locked_by is not session:
            raise RpcError(
                "in-use",
                "running is locked by another session",
                type_="protocol",
                info={"session-id": str(self.locked_by.session_id)},
            )
        default = text_of(op.find(f"{{{BASE}}}default-operation") or ET.Element("x")) or "merge"
        if default not in ("merge", "replace", "none"):
            raise RpcError("invalid-value", f"default-operation {default!r}", type_="protocol")
        config = op.find(f"{{{BASE}}}config")
        if config is None:
            raise RpcError(
                "missing-element",
                "edit-config without <config>",
                type_="protocol",
                info={"bad-element": "config"},
            )
        if self.refuse("EDIT-CONFIG"):
            raise RpcError("operation-failed", "change refused (injected fault)")
        patches = dict(self.model.patches)
        after = dict(patches)
        for container in config:
            ns, name = split_tag(container.tag)
            if ns != OPSW:
                raise RpcError("unknown-namespace", f"{name} in namespace {ns!r}", info={"bad-namespace": ns})
            if name == "voa":
                self._edit_voa(container, default)
            elif name == "opm-config":
                self._edit_opm_config(container, default)
            elif name == "cross-connects":
                self._edit_cross_connects(container, after, default)
            else:
                raise RpcError("operation-not-supported", f"editing {name} is not supported here")
        egress_of: dict[int, int] = {}
        for ingress, egress in after.items():
            if egress in egress_of:
                raise RpcError(
                    "in-use",
                    f"egress {egress} would carry ingress {egress_of[egress]} and {ingress}",
                    info={"bad-element": "egress"},
                )
            egress_of[egress] = ingress
        before, wanted = set(patches.items()), set(after.items())
        diff = MappingDiff(remove=frozenset(before - wanted), add=frozenset(wanted - before))
        if not diff.empty:
            self._activity.insert(
                0,
                "cross-connects: "
                + ", ".join(
                    [f"add {i}>{e}" for i, e in sorted(diff.add)]
                    + [f"delete {i}>{e}" for i, e in sorted(diff.remove)]
                ),
            )
        return "<ok/>", diff

    def _entries(self, container: ET.Element, default: str) -> list[tuple[str, int, ET.Element]]:
        """(operation, port-id, entry) of each `port` of a per-port config list (voa, opm-config); a
        container-level delete/remove/replace first resets every port (operation "reset", port 0)."""
        n = self.model.space.n_ingress + self.model.space.n_egress
        name = split_tag(container.tag)[1]
        container_op = _operation_of(container) or default
        out: list[tuple[str, int, ET.Element]] = []
        if container_op in ("replace", "delete", "remove"):
            out.append(("reset", 0, container))
            if container_op != "replace":
                return out
        inherited = "merge" if container_op == "replace" else container_op
        for entry in container:
            ns, local = split_tag(entry.tag)
            if ns != OPSW or local != "port":
                raise RpcError("unknown-element", f"{name} has no {local}", info={"bad-element": local})
            operation = _operation_of(entry) or inherited
            if operation not in ("merge", "replace", "create", "delete", "remove", "none"):
                raise RpcError(
                    "bad-attribute",
                    f"operation {operation!r}",
                    type_="protocol",
                    info={"bad-attribute": "operation", "bad-element": "port"},
                )
            port_el = entry.find(f"{{{OPSW}}}port-id")
            if port_el is None:
                raise RpcError(
                    "missing-element", f"{name}/port without port-id", info={"bad-element": "port-id"}
                )
            out.append((operation, _port(port_el, n, "port-id"), entry))
        return out

    def _edit_voa(self, container: ET.Element, default: str) -> None:
        """`voa/port{port-id, atten-mode, atten-level, reference-port}`, checked in full before any is set
        (applied once the edit's cross-connects went in)."""
        space = self.model.space
        settings: dict[int, VoaSetting] = {}
        for operation, port, entry in self._entries(container, default):
            if operation == "reset":
                settings.update({e: VoaSetting() for e in self.model.voa})
                continue
            if not space.is_egress(port):
                raise RpcError(
                    "invalid-value",
                    f"port {port} is an ingress port: attenuators sit on egress ports",
                    info={"bad-element": "port-id"},
                )
            if operation == "none":
                continue
            current = settings.get(port, self.model.voa_setting(port))
            if operation in ("delete", "remove"):
                if operation == "delete" and current.mode == "VOA_MODE_NONE":
                    raise RpcError("data-missing", f"port {port} has no attenuation set")
                settings[port] = VoaSetting()
                continue
            if operation == "create" and current.mode != "VOA_MODE_NONE":
                raise RpcError("data-exists", f"port {port} already has an attenuation set")
            base = current if operation == "merge" else VoaSetting()
            mode_el = entry.find(f"{{{OPSW}}}atten-mode")
            mode = base.mode if mode_el is None else text_of(mode_el)
            if mode not in VOA_MODES:
                raise RpcError(
                    "invalid-value",
                    f"atten-mode {mode!r}: one of {', '.join(VOA_MODES)}",
                    info={"bad-element": "atten-mode"},
                )
            level_el = entry.find(f"{{{OPSW}}}atten-level")
            level = base.level if level_el is None else _decimal2(level_el, "atten-level")
            ref_el = entry.find(f"{{{OPSW}}}reference-port")
            reference = base.reference if ref_el is None else _reference(ref_el, space)
            settings[port] = VoaSetting(mode, level, reference if mode == "VOA_MODE_RELATIVE" else 0)
        if not settings:
            return

        def apply() -> None:
            for port, setting in sorted(settings.items()):
                self.model.set_voa(port, setting)

        self._staged.append(apply)
        self._activity.append(
            "voa: "
            + ", ".join(
                f"port {p} {s.mode}" + (f" {s.level:.2f}" if s.mode in LEVEL_MODES else "")
                for p, s in sorted(settings.items())
            )
        )

    def _edit_opm_config(self, container: ET.Element, default: str) -> None:
        """`opm-config/port{port-id, wavelength, offset, averaging-time}`, checked in full first."""
        configs: dict[int, OpmConfig] = {}
        for operation, port, entry in self._entries(container, default):
            if operation == "reset":
                configs.update({p: OpmConfig() for p in self.model.opm})
                continue
            if operation == "none":
                continue
            current = configs.get(port, self.model.opm_config(port))
            if operation in ("delete", "remove"):
                configs[port] = OpmConfig()
                continue
            base = current if operation == "merge" else OpmConfig()
            wave_el = entry.find(f"{{{OPSW}}}wavelength")
            offset_el = entry.find(f"{{{OPSW}}}offset")
            avg_el = entry.find(f"{{{OPSW}}}averaging-time")
            wavelength = base.wavelength_nm if wave_el is None else _decimal2(wave_el, "wavelength")
            if not 1260.0 <= wavelength <= 1640.0:
                raise RpcError(
                    "invalid-value",
                    f"wavelength {wavelength:g} is outside 1260.0..1640.0 nm",
                    info={"bad-element": "wavelength"},
                )
            offset = base.offset_db if offset_el is None else _decimal2(offset_el, "offset")
            if not -100.0 <= offset <= 100.0:
                raise RpcError(
                    "invalid-value", f"offset {offset:g} is outside -100..100", info={"bad-element": "offset"}
                )
            averaging = base.averaging_time
            if avg_el is not None:
                text = text_of(avg_el)
                if not text.isdigit() or not 1 <= int(text) <= 8:
                    raise RpcError(
                        "invalid-value",
                        f"averaging-time {text!r} is not 1..8",
                        info={"bad-element": "averaging-time"},
                    )
                averaging = int(text)
            configs[port] = OpmConfig(wavelength, offset, averaging)
        if not configs:
            return

        def apply() -> None:
            for port, config in sorted(configs.items()):
                self.model.set_opm(port, config)

        self._staged.append(apply)
        self._activity.append(
            "opm-config: "
            + ", ".join(
                f"port {p} wavelength {c.wavelength_nm:.2f} offset {c.offset_db:.2f} averaging-time "
                f"{c.averaging_time}"
                for p, c in sorted(configs.items())
            )
        )

    def _edit_cross_connects(self, container: ET.Element, after: dict[int, int], default: str) -> None:
        space = self.model.space
        n = space.n_ingress + space.n_egress
        container_op = _operation_of(container) or default
        if container_op in ("replace", "delete", "remove"):
            if container_op == "delete" and not after:
                raise RpcError("data-missing", "there are no cross-connects to delete")
            after.clear()
            if container_op != "replace":
                return
        inherited = "merge" if container_op == "replace" else container_op
        for entry in container:
            ns, name = split_tag(entry.tag)
            if ns != OPSW or name != self.list_name:
                raise RpcError(
                    "unknown-element",
                    f"cross-connects has no {name} (revision {self.revision} calls it {self.list_name})",
                    info={"bad-element": name},
                )
            operation = _operation_of(entry) or inherited
            ingress_el = entry.find(f"{{{OPSW}}}ingress")
            if ingress_el is None:
                raise RpcError("missing-element", f"{name} without ingress", info={"bad-element": "ingress"})
            ingress = _port(ingress_el, n, "ingress")
            if not space.is_ingress(ingress):
                raise RpcError(
                    "invalid-value",
                    f"port {ingress} is not an ingress (1..{space.n_ingress})",
                    info={"bad-element": "ingress"},
                )
            egress_el = entry.find(f"{{{OPSW}}}egress")
            egress = None if egress_el is None else _port(egress_el, n, "egress")
            if egress is not None and not space.is_egress(egress):
                raise RpcError(
                    "invalid-value", f"port {egress} is not an egress", info={"bad-element": "egress"}
                )
            if operation == "none":
                continue
            if operation in ("merge", "replace", "create"):
                if egress is None:
                    raise RpcError(
                        "missing-element", f"{name} {ingress} without egress", info={"bad-element": "egress"}
                    )
                if operation == "create" and ingress in after:
                    raise RpcError("data-exists", f"ingress {ingress} is already connected")
                after[ingress] = egress
            elif operation in ("delete", "remove"):
                held = after.get(ingress)
                if held is None or (egress is not None and held != egress):
                    if operation == "delete":
                        raise RpcError("data-missing", f"no cross-connect {ingress},{egress or '*'}")
                    continue
                del after[ingress]
            else:
                raise RpcError(
                    "bad-attribute",
                    f"operation {operation!r}",
                    type_="protocol",
                    info={"bad-attribute": "operation", "bad-element": name},
                )
