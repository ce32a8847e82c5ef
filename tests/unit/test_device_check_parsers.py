"""The parsers bench/device_check.py relies on, on captured samples (tests/fixtures/device/README.md), and
the comparisons it reports: labctl's DOM decoding against `ethtool -m`'s, labctl's link reads against
`ethtool` / `ethtool --show-fec`, the retry-timer model against a device's ACK delay."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from labctl.linux import ethtool_msgs as m
from labctl.linux.ethtool_text import (
    DIFFERENT,
    EQUAL,
    ETHTOOL_ONLY,
    LABCTL_ONLY,
    ROUNDING,
    Printed,
    compare_link,
    compare_module,
    decoded_fields,
    ethtool_link,
    labctl_link,
    module_fields,
)
from labctl.linux.transceiver import FlatImage, parse_hex, read_dom
from labctl.rdma.devinfo import check_ack_timeout, parse_ibv_devices, parse_ibv_devinfo
from labctl.rdma.perftest import parse_latency_table
from labctl.rdma.rc import QpAttrs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "device"
MODULES = {"sfp_sff8472": 15, "qsfp28_sff8636": 30, "osfp_cmis": 50}  # fields compared per sample


def sample(name: str) -> str:
    return (FIXTURES / name).read_text()


def decoded(name: str) -> dict[str, str | float | None]:
    return decoded_fields(read_dom(FlatImage(parse_hex(sample(f"{name}.eeprom.hex")))))


# -- ethtool -m --------------------------------------------------------------------------------------------


def test_sff8472_sample_parses_to_its_one_lane() -> None:
    fields = module_fields(sample("sfp_sff8472.ethtool-m.txt"))
    assert fields["identifier"].text == "0x03"
    assert fields["vendor_name"].text == "FINISAR CORP." and fields["vendor_oui"].text == "00:90:65"
    assert fields["temperature_c"] == Printed("34.50", 34.5, 2)
    assert fields["supply_v"] == Printed("3.3121", 3.3121, 4)
    assert fields["lane1.tx_bias_ma"] == Printed("6.750", 6.75, 3)
    assert fields["lane1.rx_power_mw"] == Printed("0.4837", 0.4837, 4)
    assert fields["lane1.rx_power_dbm"] == Printed("-3.15", -3.15, 2)
    assert fields["rx_power_type"].text == "average"
    assert not [k for k in fields if k.startswith("lane2")]  # thresholds are not lanes


def test_sff8636_sample_has_four_channels_and_a_dark_lane() -> None:
    fields = module_fields(sample("qsfp28_sff8636.ethtool-m.txt"))
    lanes = {k.split(".")[0] for k in fields if k.startswith("lane")}
    assert lanes == {"lane1", "lane2", "lane3", "lane4"}
    # "Rcvr signal avg optical power(Channel 4)": no space before the channel, and no light
    assert fields["lane4.rx_power_mw"].value == 0.0
    assert fields["lane4.rx_power_dbm"].text == "-inf"


def test_cmis_sample_has_eight_channels() -> None:
    fields = module_fields(sample("osfp_cmis.ethtool-m.txt"))
    assert fields["identifier"].text == "0x19"
    assert fields["lane8.tx_bias_ma"] == Printed("8.280", 8.28, 3)
    assert fields["lane8.rx_power_mw"].text == "0.9733"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_labctl_decoding_agrees_with_ethtool_on_every_field(name: str) -> None:
    rows = compare_module(decoded(name), module_fields(sample(f"{name}.ethtool-m.txt")))
    assert Counter(r.verdict for r in rows) == {EQUAL: MODULES[name]}, [r for r in rows if not r.agrees]


def test_each_verdict_is_reported() -> None:
    ours: dict[str, str | float | None] = {
        "temperature_c": 34.5,  # printed the same
        "supply_v": 3.31216,  # ethtool says 3.3121: less than one unit of its last digit apart
        "lane1.tx_bias_ma": 6.75,  # ethtool says 7.000: different
        "lane1.rx_power_dbm": None,  # no light: ethtool's -inf
        "vendor_pn": "FTLX8571D3BCL",  # ethtool printed no such field
    }
    theirs = {
        "temperature_c": Printed("34.50", 34.5, 2),
        "supply_v": Printed("3.3121", 3.3121, 4),
        "lane1.tx_bias_ma": Printed("7.000", 7.0, 3),
        "lane1.rx_power_dbm": Printed("-inf", float("-inf"), 0),
        "date_code": Printed("140530"),
    }
    verdicts = {r.field: (r.verdict, r.labctl, r.ethtool) for r in compare_module(ours, theirs)}
    assert verdicts == {
        "temperature_c": (EQUAL, "34.50", "34.50"),
        "supply_v": (ROUNDING, "3.3122", "3.3121"),
        "lane1.tx_bias_ma": (DIFFERENT, "6.750", "7.000"),
        "lane1.rx_power_dbm": (EQUAL, "-inf", "-inf"),
        "vendor_pn": (LABCTL_ONLY, "FTLX8571D3BCL", ""),
        "date_code": (ETHTOOL_ONLY, "", "140530"),
    }


def test_one_adc_step_between_the_two_reads_is_within_rounding() -> None:
    text = sample("qsfp28_sff8636.ethtool-m.txt").replace("1.1110 mW / 0.46 dBm", "1.1111 mW / 0.46 dBm")
    rows = {r.field: r for r in compare_module(decoded("qsfp28_sff8636"), module_fields(text))}
    assert rows["lane1.rx_power_mw"].verdict == ROUNDING
    text = text.replace("1.1111 mW", "1.1150 mW")
    rows = {r.field: r for r in compare_module(decoded("qsfp28_sff8636"), module_fields(text))}
    assert rows["lane1.rx_power_mw"].verdict == DIFFERENT


def test_a_different_vendor_string_is_different() -> None:
    text = sample("sfp_sff8472.ethtool-m.txt").replace("FTLX8571D3BCL", "FTLX8571D3BCV")
    rows = {r.field: r for r in compare_module(decoded("sfp_sff8472"), module_fields(text))}
    assert rows["part_number"].verdict == DIFFERENT


# -- ethtool IF, --show-fec --------------------------------------------------------------------------------

LINK_MODE_BITS = {
    "1000baseKX/Full": 17,
    "10000baseKR/Full": 19,
    "40000baseKR4/Full": 23,
    "40000baseCR4/Full": 24,
    "40000baseSR4/Full": 25,
    "40000baseLR4/Full": 26,
    "25000baseCR/Full": 31,
    "25000baseKR/Full": 32,
    "25000baseSR/Full": 33,
    "50000baseCR2/Full": 34,
    "50000baseKR2/Full": 35,
    "100000baseKR4/Full": 36,
    "100000baseSR4/Full": 37,
    "100000baseCR4/Full": 38,
    "100000baseLR4_ER4/Full": 39,
}
NAMES = {
    **{bit: name for name, bit in LINK_MODE_BITS.items()},
    6: "Autoneg",
    13: "Pause",
    49: "None",
    50: "RS",
}
NAMES |= {51: "BASER"}


def labctl_side(**change: object) -> tuple[m.LinkModes, m.FecState]:
    """What labctl's LINKMODES_GET and FEC_GET would decode for the port of tests/fixtures/device/ethtool.txt."""
    supported = frozenset(LINK_MODE_BITS.values()) | {6, 13, 49, 50, 51}
    advertised = frozenset({36, 37, 38, 39, 6, 13, 50})
    modes = m.LinkModes(
        autoneg=True, ours=m.Bitset(92, advertised, supported), peer=None, speed_mbps=100_000, duplex="full"
    )
    fec = m.FecState(modes=m.Bitset(92, frozenset({50})), auto=True, active=50)
    return dataclasses.replace(modes, **change), fec  # type: ignore[arg-type]


def test_ethtool_settings_and_fec_parse() -> None:
    view = ethtool_link(sample("ethtool.txt"), sample("ethtool_show-fec.txt"))
    assert view.supported_modes is not None and len(view.supported_modes) == 15
    assert view.advertised_modes == {"100000baseKR4/Full", "100000baseSR4/Full", "100000baseCR4/Full",
                                     "100000baseLR4_ER4/Full"}  # fmt: skip
    assert view.supported_fec == {"off", "rs", "baser"}
    assert (view.autoneg, view.speed_mbps, view.duplex, view.link) == (True, 100_000, "full", True)
    assert (view.configured_fec, view.active_fec) == ({"auto", "rs"}, "rs")


def test_a_link_that_is_down_reads_as_unknown_speed() -> None:
    text = sample("ethtool.txt").replace("Speed: 100000Mb/s", "Speed: Unknown!")
    text = text.replace("Duplex: Full", "Duplex: Unknown! (255)").replace("detected: yes", "detected: no")
    old_fec = "Configured FEC encodings: Auto RS BaseR\nActive FEC encoding: None\n"  # the ioctl's wording
    view = ethtool_link(text, old_fec)
    assert (view.speed_mbps, view.duplex, view.link) == (None, None, False)
    assert (view.configured_fec, view.active_fec) == ({"auto", "rs", "baser"}, "off")


def test_labctl_reads_agree_with_ethtool() -> None:
    modes, fec = labctl_side()
    rows = compare_link(
        labctl_link(modes, NAMES, fec, True),
        ethtool_link(sample("ethtool.txt"), sample("ethtool_show-fec.txt")),
    )
    assert [r.field for r in rows] == [
        "supported_modes",
        "advertised_modes",
        "supported_fec",
        "autoneg",
        "speed_mbps",
        "duplex",
        "link",
        "configured_fec",
        "active_fec",
    ]
    assert all(r.verdict == EQUAL for r in rows), rows


def test_a_link_difference_and_a_missing_side_are_reported() -> None:
    modes, fec = labctl_side(speed_mbps=25_000)
    rows = {
        r.field: r
        for r in compare_link(
            labctl_link(modes, NAMES, None, True), ethtool_link(sample("ethtool.txt"), None)
        )
    }
    assert rows["speed_mbps"].verdict == DIFFERENT and rows["speed_mbps"].labctl == "25000"
    assert "configured_fec" not in rows  # neither side said
    rows = {
        r.field: r
        for r in compare_link(labctl_link(None, NAMES, fec, None), ethtool_link(sample("ethtool.txt"), None))
    }
    assert rows["speed_mbps"].verdict == ETHTOOL_ONLY and rows["configured_fec"].verdict == LABCTL_ONLY


# -- RDMA ----------------------------------------------------------------------------------------------


def test_ibv_devices_lists_name_and_guid() -> None:
    assert parse_ibv_devices(sample("ibv_devices.txt")) == [
        ("mlx5_0", "a088c20300b1c2d0"),
        ("mlx5_1", "a088c20300b1c2d1"),
    ]
    assert (
        parse_ibv_devices("    device          \t   node GUID\n    ------          \t----------------\n")
        == []
    )


def test_ibv_devinfo_gives_model_ack_delay_ports_and_gids() -> None:
    first, second = parse_ibv_devinfo(sample("ibv_devinfo-v.txt"))
    assert first.name == "mlx5_0" and first.model.startswith("ConnectX-7 (part 4129, fw 28.39.1002")
    assert first.local_ca_ack_delay == 16
    assert "MANAGED_FLOW_STEERING" in first.fields["device_cap_flags"]  # a flag list continued
    port = first.first_active_port()
    assert port is not None and port.number == 1 and port.link_layer == "Ethernet"
    assert port.fields["active_mtu"] == "1024 (3)" and len(port.gids) == 4
    gid = port.roce_v2_ipv4_gid()
    assert gid is not None and (gid.index, gid.gid) == (3, "::ffff:10.9.1.1")
    assert second.first_active_port() is None and second.ports[0].state == "PORT_DOWN"


def test_short_ibv_devinfo_has_no_ack_delay() -> None:
    short = (
        "hca_id:\trxe0\n\ttransport:\t\t\tInfiniBand (0)\n\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n"
    )
    (dev,) = parse_ibv_devinfo(short)
    assert dev.local_ca_ack_delay is None and dev.model == "unknown"
    assert dev.first_active_port() is not None


def test_the_retry_period_is_checked_against_the_ack_delay() -> None:
    below = check_ack_timeout(QpAttrs(), 16)  # the README's timeout 14 on a device reporting 16
    assert below.period_ns == 4096 << 14 and below.retry_budget_ns == 8 * (4096 << 14)
    assert below.verdict.startswith("BELOW THE DEVICE'S ACK DELAY")
    assert "period 67.109 ms, retry budget 536.9 ms" in below.line()
    assert check_ack_timeout(QpAttrs(timeout=16), 16).verdict.startswith("consistent")
    assert check_ack_timeout(QpAttrs(), None).verdict.startswith("not checked")
    assert "no period" in check_ack_timeout(QpAttrs(timeout=0), 16).verdict


def test_ib_send_lat_table() -> None:
    table = parse_latency_table(sample("ib_send_lat.txt"))
    assert table is not None
    assert (table["median_us"], table["p99_us"], table["iterations"]) == (1.03, 1.31, 10_000)
    assert parse_latency_table("Couldn't connect to 127.0.0.1:18515\n") is None
