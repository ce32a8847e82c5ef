"""A NIC port's link state as its driver reports it to ethtool: ETHTOOL_MSG_LINKSTATE_GET over generic
netlink, and the extended state that says why a link is down.

While the carrier is down, drivers that implement `get_link_ext_state` (mlx5 since kernel 5.10, reading the
firmware's PDDR troubleshooting page) name the firmware's current obstacle: still in auto-negotiation (no
partner, no ack), in link training (KR frame lock not acquired, …), a logical mismatch (PCS block lock,
FEC not locked), bad signal integrity, a cable or module issue. Polled through a reconfiguration, the
sequence of these states is the inside of the firmware phase between light back and carrier up
(decision 0023). Facts: shared reference probes.md §2.4; uapi linux/ethtool.h, linux/ethtool_netlink.h.
"""

from __future__ import annotations

import errno
import struct
from dataclasses import dataclass

from labctl.linux.genl import GenericNetlink
from labctl.linux.netlink import NLA_F_NESTED, NetlinkError, attr, cstr, parse_attrs
from labctl.linux.netns import sockets_in_netns

ETHTOOL_GENL_NAME = "ethtool"
ETHTOOL_GENL_VERSION = 1
ETHTOOL_MSG_LINKSTATE_GET = 6
ETHTOOL_A_HEADER_DEV_NAME = 2
ETHTOOL_A_LINKSTATE_HEADER = 1
ETHTOOL_A_LINKSTATE_LINK = 2  # u8: the driver's get_link (mlx5: the netdev carrier)
ETHTOOL_A_LINKSTATE_EXT_STATE = 5  # u8, only while the link is down and the driver knows why
ETHTOOL_A_LINKSTATE_EXT_SUBSTATE = 6  # u8
ETHTOOL_A_LINKSTATE_EXT_DOWN_CNT = 7  # u32, link-down events (kernels ≥ 6.6 with get_link_ext_stats)

# enum ethtool_link_ext_state, and its substates (uapi linux/ethtool.h)
EXT_STATES = (
    "autoneg",
    "link_training_failure",
    "link_logical_mismatch",
    "bad_signal_integrity",
    "no_cable",
    "cable_issue",
    "eeprom_issue",
    "calibration_failure",
    "power_budget_exceeded",
    "overheat",
    "module",
)
EXT_SUBSTATES: dict[str, tuple[str, ...]] = {
    "autoneg": (
        "no_partner_detected",
        "ack_not_received",
        "next_page_exchange_failed",
        "no_partner_detected_force_mode",
        "fec_mismatch_during_override",
        "no_hcd",
    ),
    "link_training_failure": (
        "kr_frame_lock_not_acquired",
        "kr_link_inhibit_timeout",
        "kr_link_partner_did_not_set_receiver_ready",
        "remote_fault",
    ),
    "link_logical_mismatch": (
        "pcs_did_not_acquire_block_lock",
        "pcs_did_not_acquire_am_lock",
        "pcs_did_not_get_align_status",
        "fc_fec_is_not_locked",
        "rs_fec_is_not_locked",
    ),
    "bad_signal_integrity": (
        "large_number_of_physical_errors",
        "unsupported_rate",
        "serdes_reference_clock_lost",
        "serdes_alos",
    ),
    "cable_issue": ("unsupported_cable", "cable_test_failure"),
    "module": ("cmis_not_ready",),
}


@dataclass(frozen=True, slots=True)
class LinkState:
    link: bool | None
    ext_state: int | None = None
    ext_substate: int | None = None
    down_count: int | None = None

    @property
    def state_name(self) -> str | None:
        if self.ext_state is None:
            return None
        return (
            EXT_STATES[self.ext_state] if self.ext_state < len(EXT_STATES) else f"ext_state_{self.ext_state}"
        )

    @property
    def substate_name(self) -> str | None:
        if self.ext_substate is None or self.ext_substate == 0:
            return None
        names = EXT_SUBSTATES.get(self.state_name or "", ())
        i = self.ext_substate - 1  # substates count from 1
        return names[i] if i < len(names) else f"substate_{self.ext_substate}"

    @property
    def label(self) -> str:
        """`up`, `down`, or the firmware's reason while down (`autoneg/no_partner_detected`)."""
        if self.state_name is not None:
            return self.state_name + (f"/{self.substate_name}" if self.substate_name else "")
        return {True: "up", False: "down", None: "unknown"}[self.link]


def parse_linkstate(payload: bytes | bytearray | memoryview) -> LinkState:
    """The attributes of an ETHTOOL_MSG_LINKSTATE_GET_REPLY (after the genl header)."""
    attrs = parse_attrs(payload, 0, len(payload))

    def u8(kind: int) -> int | None:
        value = attrs.get(kind)
        return None if value is None or len(value) < 1 else value[0]

    link = u8(ETHTOOL_A_LINKSTATE_LINK)
    down = attrs.get(ETHTOOL_A_LINKSTATE_EXT_DOWN_CNT)
    return LinkState(
        link=None if link is None else bool(link),
        ext_state=u8(ETHTOOL_A_LINKSTATE_EXT_STATE),
        ext_substate=u8(ETHTOOL_A_LINKSTATE_EXT_SUBSTATE),
        down_count=struct.unpack_from("=I", down)[0] if down is not None and len(down) >= 4 else None,
    )


class LinkStateReader:
    """One interface's LINKSTATE_GET, pre-built; `read()` is one request and its reply."""

    def __init__(self, ifname: str, netns: str | None = None, timeout_s: float = 1.0) -> None:
        self.ifname = ifname
        self.timeout_s = timeout_s
        (sock,) = sockets_in_netns(netns, [GenericNetlink.new_socket])
        self.nl = GenericNetlink(sock, timeout_s)
        try:
            family = self.nl.resolve_family(ETHTOOL_GENL_NAME)
        except BaseException:
            self.nl.close()
            raise
        header = attr(
            ETHTOOL_A_LINKSTATE_HEADER | NLA_F_NESTED, attr(ETHTOOL_A_HEADER_DEV_NAME, cstr(ifname))
        )
        self._msg = GenericNetlink.message(family, ETHTOOL_MSG_LINKSTATE_GET, ETHTOOL_GENL_VERSION, header)

    def read(self) -> LinkState:
        """One request and its reply; NetlinkError if the kernel refused it or did not answer in time."""
        try:
            return parse_linkstate(self.nl.request(self._msg))
        except NetlinkError as e:
            if e.errno == errno.ENODEV:
                raise NetlinkError(errno.ENODEV, f"no interface {self.ifname}") from None
            raise
        except TimeoutError:  # the socket's timeout: one error type for a caller to catch, and saying which
            raise NetlinkError(
                errno.ETIMEDOUT, f"no reply about {self.ifname} within {self.timeout_s:g} s"
            ) from None

    def close(self) -> None:
        self.nl.close()
