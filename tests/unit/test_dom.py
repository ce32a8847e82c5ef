"""DOM decoder tests. Images are written by hand from the specification tables (SFF-8472 Tables 4-1/8-6/9-*,
SFF-8636 Tables 6-2/6-8/6-24, CMIS 4.0/5.x Tables 8-4/8-29/8-41, 8-52): each field is placed at its byte
offset as a literal word, and the expected values are worked out in the comments, not computed by our own
encoder. The emulated module is then checked against the same decoder."""

from __future__ import annotations

import asyncio
import math

import pytest

from labctl.core.errors import InputError
from labctl.linux.ethtool import ModuleEepromError
from labctl.linux.transceiver import (
    DomDecodeError,
    EepromRead,
    FlatImage,
    ModuleKind,
    PagedImage,
    TruncatedImageError,
    UnknownModuleError,
    check_request,
    decode_image,
    module_info,
    parse_hex,
    read_dom,
)
from labctl.models.module_eeprom import EmulatedQsfp28, ModuleEepromReadError
from labctl.probes.rxpower import RxPowerProbe
from labctl.probes.rxpower_ports import LosPlan, ModulePort
from tests.helpers.dom import _collect, _Flaky, put, qsfp28


def sfp_internal() -> bytearray:
    img = bytearray(512)  # A0h = 0..255, A2h = 256..511
    put(img, 0, "03 04 07")  # identifier SFP, ext id, connector LC
    put(img, 92, "68")  # DDM implemented (0x40) | internally calibrated (0x20) | Rx avg power (0x08)
    a2 = 256
    put(img, a2 + 96, "1A 80")  # temperature 26 + 128/256 = 26.5 °C
    put(img, a2 + 98, "80 E8")  # Vcc 33000 × 100 µV = 3.3 V
    put(img, a2 + 100, "0F A0")  # bias 4000 × 2 µA = 8.0 mA
    put(img, a2 + 102, "13 88")  # Tx power 5000 × 0.1 µW = 0.5 mW
    put(img, a2 + 104, "0C 35")  # Rx power 3125 × 0.1 µW = 0.3125 mW
    put(img, a2 + 110, "00")  # status: Rx_LOS clear
    return img


def test_sfp_internal_calibration() -> None:
    d = decode_image(bytes(sfp_internal()))
    assert d.module is ModuleKind.SFF8472
    assert d.identifier_name == "SFP/SFP+/SFP28"
    assert d.calibration == "internal"
    assert d.rx_power_type == "average"
    assert d.temperature_c == pytest.approx(26.5)
    assert d.supply_v == pytest.approx(3.3)
    (lane,) = d.lanes
    assert lane.lane == 1
    assert lane.tx_bias_ma == pytest.approx(8.0)
    assert lane.tx_power_mw == pytest.approx(0.5)
    assert lane.rx_power_mw == pytest.approx(0.3125)
    assert lane.rx_power_dbm == pytest.approx(10 * math.log10(0.3125))  # -5.051 dBm
    assert lane.rx_los is False


def test_sfp_los_and_oma_and_no_light() -> None:
    img = sfp_internal()
    put(img, 92, "60")  # bit 3 clear: Rx power is OMA
    put(img, 256 + 104, "00 00")  # no light
    put(img, 256 + 110, "02")  # Rx_LOS state
    d = decode_image(bytes(img))
    assert d.rx_power_type == "oma"
    assert d.lanes[0].rx_power_mw == 0.0
    assert d.lanes[0].rx_power_dbm is None  # no light: no dBm, never a floor
    assert d.lanes[0].rx_los is True


def sfp_external() -> bytearray:
    img = bytearray(512)
    put(img, 0, "03")
    put(img, 92, "58")  # DDM (0x40) | externally calibrated (0x10) | average (0x08)
    a2 = 256
    # Rx_PWR(4..0) floats at 56, 60, 64, 68, 72: 0, 0, 0.25, 1.0, 10.0
    put(img, a2 + 56, "00000000 00000000 3E800000 3F800000 41200000")
    put(img, a2 + 76, "02 00 FF 9C")  # Tx_I slope 2.0, offset -100
    put(img, a2 + 80, "01 00 00 64")  # Tx_PWR slope 1.0, offset +100
    put(img, a2 + 84, "01 00 05 00")  # T slope 1.0, offset +1280 (= +5 °C)
    put(img, a2 + 88, "00 80 00 00")  # V slope 0.5, offset 0
    put(img, a2 + 96, "14 00")  # raw temperature 5120 → 5120 + 1280 = 6400 / 256 = 25.0 °C
    put(img, a2 + 98, "FF F0")  # raw Vcc 65520 × 0.5 = 32760 → 3.276 V
    put(img, a2 + 100, "07 D0")  # raw bias 2000 × 2 - 100 = 3900 → 7.8 mA
    put(img, a2 + 102, "13 24")  # raw Tx 4900 + 100 = 5000 → 0.5 mW
    put(img, a2 + 104, "00 64")  # raw Rx 100: 0.25·100² + 1.0·100 + 10 = 2610 → 0.261 mW
    return img


def test_sfp_external_calibration() -> None:
    d = decode_image(bytes(sfp_external()))
    assert d.calibration == "external"
    assert d.temperature_c == pytest.approx(25.0)
    assert d.supply_v == pytest.approx(3.276)
    lane = d.lanes[0]
    assert lane.tx_bias_ma == pytest.approx(7.8)
    assert lane.tx_power_mw == pytest.approx(0.5)
    assert lane.rx_power_mw == pytest.approx(0.261)


def test_sfp_external_calibration_below_zero_is_no_light() -> None:
    img = sfp_external()
    put(img, 256 + 72, "C0A00000")  # Rx_PWR(0) = -5.0
    put(img, 256 + 104, "00 00")  # raw 0 → -5 units: clamped to no light
    lane = decode_image(bytes(img)).lanes[0]
    assert lane.rx_power_mw == 0.0
    assert lane.rx_power_dbm is None


def test_sfp_fast_plan_reads_two_bytes_of_a2h() -> None:
    mem = FlatImage(bytes(sfp_external()))
    info = module_info(mem)
    assert info.rx_power_reads == (EepromRead(0x51, 0, 0, 104, 2),)
    assert info.decode_rx_power_mw([r.read(mem) for r in info.rx_power_reads]) == [pytest.approx(0.261)]


def test_sfp_without_ddm_has_no_lanes() -> None:
    img = bytearray(256)
    put(img, 0, "03")
    put(img, 92, "00")
    d = decode_image(bytes(img))
    assert d.lanes == ()
    assert module_info(FlatImage(bytes(img))).rx_power_reads == ()


def test_qsfp28_four_lanes() -> None:
    d = decode_image(bytes(qsfp28()))
    assert d.module is ModuleKind.SFF8636
    assert d.identifier_name == "QSFP28"
    assert d.temperature_c == pytest.approx(35.0)
    assert d.supply_v == pytest.approx(3.25)
    assert d.rx_power_type == "average"
    assert [lane.lane for lane in d.lanes] == [1, 2, 3, 4]
    assert [lane.rx_power_mw for lane in d.lanes] == pytest.approx([0.8, 0.1, 0.0, 1.0])
    dbm = [lane.rx_power_dbm for lane in d.lanes]
    assert dbm[0] == pytest.approx(-0.969, abs=1e-3)
    assert dbm[1] == pytest.approx(-10.0)
    assert dbm[2] is None
    assert dbm[3] == pytest.approx(0.0)
    assert [lane.tx_bias_ma for lane in d.lanes] == pytest.approx([12, 12, 12, 6])
    assert [lane.tx_power_mw for lane in d.lanes] == pytest.approx([0.5, 0.5, 0.5, 0.0])
    assert d.lanes[3].tx_power_dbm is None
    assert [lane.rx_los for lane in d.lanes] == [False, False, True, False]
    assert [lane.rx_lol for lane in d.lanes] == [False, False, True, False]


def test_qsfp_oma_and_fast_plan() -> None:
    img = qsfp28()
    put(img, 220, "34")  # bit 3 clear: OMA
    mem = FlatImage(bytes(img))
    info = module_info(mem)
    assert info.rx_power_type == "oma"
    assert info.rx_power_reads == (EepromRead(0x50, 0, 0, 34, 8),)  # lower page 0 bytes 34-41 only
    assert info.decode_rx_power_mw([bytes.fromhex("1F4003E800002710")]) == pytest.approx([0.8, 0.1, 0, 1])


def test_qsfp_plus_sff8436_has_no_lol() -> None:
    img = qsfp28()
    put(img, 0, "0D 01")  # QSFP+, SFF-8436 revision: byte 5 is not CDR LOL there
    d = decode_image(bytes(img))
    assert d.identifier_name == "QSFP+"
    assert [lane.rx_lol for lane in d.lanes] == [None] * 4
    assert d.lanes[2].rx_los is True


def test_live_read_does_not_read_latched_flags_unless_asked() -> None:
    mem = FlatImage(bytes(qsfp28()))
    d = read_dom(mem)
    assert not d.latched_flags_read
    assert [lane.rx_los for lane in d.lanes] == [None] * 4
    assert read_dom(mem, latched=True).lanes[2].rx_los is True


def cmis_pages(banks: int = 1) -> dict[tuple[int, int, int], bytes]:
    lower = bytearray(256)
    put(lower, 0, "18 40 00")  # QSFP-DD, CMIS 4.0, paged memory
    put(lower, 14, "2D 80")  # 45.5 °C
    put(lower, 16, "81 29")  # 33065 → 3.3065 V
    page01 = bytearray(128)
    put(page01, 142 - 128, "00" if banks == 1 else "01")  # banks supported: 0 / 0 and 1
    put(page01, 151 - 128, "10")  # Rx power type: average
    put(page01, 160 - 128, "07")  # Tx bias, Tx power, Rx power monitors; bias multiplier 1
    pages: dict[tuple[int, int, int], bytes] = {(0x50, 0, 0): bytes(lower), (0x50, 0, 1): bytes(page01)}
    for bank in range(banks):
        p11 = bytearray(128)
        put(p11, 147 - 128, "20")  # latched Rx LOS lane 6
        put(p11, 148 - 128, "20")  # latched Rx LOL lane 6
        put(p11, 154 - 128, "1388" * 8)  # Tx power 0.5 mW
        put(p11, 170 - 128, "0BB8" * 8)  # bias 3000 × 2 µA = 6 mA
        if bank == 0:  # 0.1 .. 0.8 mW, lane 6 dark
            put(p11, 186 - 128, "03E8 07D0 0BB8 0FA0 1388 0000 1B58 1F40")
        else:  # lanes 9-16: 1.0, 0.9, ... 0.3 mW
            put(p11, 186 - 128, "2710 2328 1F40 1B58 1770 1388 0FA0 0BB8")
        pages[(0x50, bank, 0x11)] = bytes(p11)
    return pages


def test_cmis_eight_lanes() -> None:
    d = read_dom(PagedImage(cmis_pages()), latched=True)
    assert d.module is ModuleKind.CMIS
    assert d.identifier_name == "QSFP-DD"
    assert d.temperature_c == pytest.approx(45.5)
    assert d.supply_v == pytest.approx(3.3065)
    assert d.rx_power_type == "average"
    assert [lane.lane for lane in d.lanes] == list(range(1, 9))
    assert [lane.rx_power_mw for lane in d.lanes] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0, 0.7, 0.8])
    assert d.lanes[5].rx_power_dbm is None
    assert d.lanes[0].rx_power_dbm == pytest.approx(-10.0)
    assert all(lane.tx_bias_ma == pytest.approx(6.0) for lane in d.lanes)
    assert all(lane.tx_power_mw == pytest.approx(0.5) for lane in d.lanes)
    assert [lane.rx_los for lane in d.lanes] == [i == 5 for i in range(8)]
    assert [lane.rx_lol for lane in d.lanes] == [i == 5 for i in range(8)]


def test_cmis_bank1_lanes_9_to_16() -> None:
    mem = PagedImage(cmis_pages(banks=2))
    d = read_dom(mem)
    assert [lane.lane for lane in d.lanes] == list(range(1, 17))
    assert [lane.rx_power_mw for lane in d.lanes[8:]] == pytest.approx(
        [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]
    )
    assert d.lanes[8].rx_power_dbm == pytest.approx(0.0)
    info = module_info(mem)
    assert info.rx_power_reads == (EepromRead(0x50, 0x11, 0, 186, 16), EepromRead(0x50, 0x11, 1, 186, 16))
    mws = info.decode_rx_power_mw([r.read(mem) for r in info.rx_power_reads])
    assert len(mws) == 16
    assert mws[8] == pytest.approx(1.0)


def test_cmis_bias_multiplier_and_oma() -> None:
    pages = cmis_pages()
    page01 = bytearray(pages[(0x50, 0, 1)])
    put(page01, 151 - 128, "00")  # OMA
    put(page01, 160 - 128, "0F")  # bits 4-3 = 01: bias ×2
    pages[(0x50, 0, 1)] = bytes(page01)
    d = read_dom(PagedImage(pages))
    assert d.rx_power_type == "oma"
    assert d.lanes[0].tx_bias_ma == pytest.approx(12.0)


def test_cmis_flat_file_uses_linear_page_layout() -> None:
    pages = cmis_pages()
    flat = bytearray(0x11 * 128 + 256)
    flat[0:256] = pages[(0x50, 0, 0)]
    flat[1 * 128 + 128 : 1 * 128 + 256] = pages[(0x50, 0, 1)]  # page 01h at 256
    flat[0x11 * 128 + 128 :] = pages[(0x50, 0, 0x11)]  # page 11h at 2304
    d = decode_image(bytes(flat))
    assert [lane.rx_power_mw for lane in d.lanes][:2] == pytest.approx([0.1, 0.2])
    with pytest.raises(TruncatedImageError, match=r"page 0x11"):
        decode_image(bytes(flat[:2300]))


def test_empty_image() -> None:
    with pytest.raises(TruncatedImageError, match="empty image"):
        decode_image(b"")


def test_unknown_identifier() -> None:
    img = bytearray(256)
    put(img, 0, "06")
    with pytest.raises(UnknownModuleError, match=r"0x06 \(XFP\) is not an SFP"):
        decode_image(bytes(img))
    with pytest.raises(UnknownModuleError, match="0x7f"):
        decode_image(b"\x7f" + bytes(255))


@pytest.mark.parametrize(
    ("image", "match"),
    [
        (bytes(sfp_internal()[:256]), r"A2h 96\.\.111"),  # DDM advertised, A2h missing
        (bytes(sfp_internal()[:300]), r"A2h 96\.\.111"),
        (bytes(qsfp28()[:40]), r"offset 220"),
        (bytes(qsfp28()[:200]), r"offset 220"),
        (bytes(qsfp28()[:1]), r"offset 0\.\.2"),
    ],
)
def test_truncated_images(image: bytes, match: str) -> None:
    with pytest.raises(TruncatedImageError, match=match) as exc:
        decode_image(image, "mod.bin")
    assert isinstance(exc.value, InputError)
    assert str(exc.value).startswith("mod.bin: truncated")
    assert "\n" not in str(exc.value)


def test_cmis_missing_page_11h() -> None:
    pages = cmis_pages()
    del pages[(0x50, 0, 0x11)]
    with pytest.raises(TruncatedImageError, match=r"no I2C 0x50 bank 0 page 0x11"):
        read_dom(PagedImage(pages))


def test_request_limits_follow_the_kernel() -> None:
    check_request(0x50, 0, 0, 34, 8)
    check_request(0x50, 0x11, 1, 186, 16)
    for args in [
        (0x50, 0, 0, 120, 16),  # crosses the half page
        (0x50, 0, 0, 0, 0),
        (0x50, 0, 0, 0, 129),
        (0x50, 0x11, 0, 100, 8),  # page != 0 lower half
        (0x80, 0, 0, 0, 1),
        (0x50, 0, 0, 256, 1),
    ]:
        with pytest.raises(ValueError, match=r"."):
            check_request(*args)


def test_parse_hex_accepts_ethtool_dump() -> None:
    text = "Offset\t\tValues\n------\t\t------\n0x0000:\t\t11 08 04 00\n0x0004:\t\t00 ff\n"
    assert parse_hex(text) == bytes.fromhex("11080400 00ff")
    with pytest.raises(DomDecodeError, match=r"x:2: 'zz' is not hex"):
        parse_hex("11\nzz\n", "x")


def test_emulated_module_round_trips_through_the_decoder() -> None:
    m = EmulatedQsfp28(tx_power_mw=0.7, tx_bias_ma=6.5, temperature_c=41.25, supply_v=3.28)
    m.set_rx_power_lanes_mw((0.5, None, 0.01234, 1.2))
    for d in (read_dom(m, latched=True), decode_image(m.image())):
        assert d.module is ModuleKind.SFF8636
        assert d.identifier_name == "QSFP28"
        assert d.rx_power_type == "average"
        assert d.temperature_c == pytest.approx(41.25)
        assert d.supply_v == pytest.approx(3.28)
        assert [lane.rx_power_mw for lane in d.lanes] == pytest.approx([0.5, 0.0, 0.0123, 1.2])
        assert d.lanes[1].rx_power_dbm is None
        assert [lane.tx_power_mw for lane in d.lanes] == pytest.approx([0.7] * 4)
        assert [lane.tx_bias_ma for lane in d.lanes] == pytest.approx([6.5] * 4)
        assert d.lanes[1].rx_los is True
    m.set_rx_power_dbm(-3.0, lane=2)
    d = read_dom(m)
    assert d.lanes[1].rx_power_dbm == pytest.approx(-3.0, abs=1e-3)
    assert EmulatedQsfp28(rx_power_average=False).image()[220] & 0x08 == 0
    assert read_dom(EmulatedQsfp28(rx_power_average=False)).rx_power_type == "oma"


def test_emulated_module_latched_flags_clear_on_read() -> None:
    m = EmulatedQsfp28(rx_power_mw=0.5)
    m.set_rx_power_mw(None, lane=1)
    m.set_rx_power_mw(0.5, lane=1)  # light back: the flag stays latched until read
    assert read_dom(m, latched=True).lanes[0].rx_los is True
    assert read_dom(m, latched=True).lanes[0].rx_los is False  # cleared by the previous read
    m.set_rx_power_mw(None, lane=1)
    assert read_dom(m, latched=True).lanes[0].rx_los is True
    assert read_dom(m, latched=True).lanes[0].rx_los is True  # still dark: re-latched


def test_emulated_module_refuses_what_the_kernel_refuses() -> None:
    m = EmulatedQsfp28()
    with pytest.raises(ModuleEepromReadError):
        m.read(0x50, 0, 0, 120, 16)
    with pytest.raises(ModuleEepromReadError, match="no page 0x11"):
        m.read(0x50, 0x11, 0, 186, 16)
    with pytest.raises(ModuleEepromReadError, match="I2C 0x51"):
        m.read(0x51, 0, 0, 104, 2)


async def test_poller_emits_per_lane_and_never_consumes_latched_flags() -> None:
    m = EmulatedQsfp28(rx_power_mw=0.5)
    m.set_rx_power_mw(None, lane=3)  # lane 3 dark: latched LOS set
    probe = RxPowerProbe([ModulePort("nic:h1/ens1f0np0", "h1", lambda: m)], hz=2000, report_interval_ns=10**9)
    async with probe:
        first = await asyncio.wait_for(_collect(probe, 4), 5)
        assert {e.meta["lane"] for e in first} == {1, 2, 3, 4}
        by_lane = {e.meta["lane"]: e for e in first}
        assert by_lane[1].value == pytest.approx(-3.01, abs=1e-2)
        assert by_lane[1].meta["mw"] == pytest.approx(0.5)
        assert by_lane[3].value is None and by_lane[3].meta["mw"] == 0.0
        assert all(e.kind == "rx_power" and e.source == "nic:h1/ens1f0np0" and e.host == "h1" for e in first)
        assert all("los" not in e.meta for e in first)
        m.set_rx_power_mw(0.5, lane=3)  # light returns on lane 3: a change event
        (back,) = await asyncio.wait_for(_collect(probe, 1), 5)
        assert back.meta["lane"] == 3 and back.value == pytest.approx(-3.01, abs=1e-2)
        assert back.t_ns > first[-1].t_ns
    assert probe.samples > 0
    assert m.lower[3] & 0x04  # the latched LOS the poller never read is still there for its owner


async def test_poller_reports_steady_lanes_while_a_reconfiguration_window_is_open() -> None:
    """A dark gap that fell between samples leaves the power unchanged: the window still reports it soon."""
    m = EmulatedQsfp28(rx_power_mw=0.5)
    probe = RxPowerProbe([ModulePort("nic:h1/p", "h1", lambda: m)], hz=2000, report_interval_ns=60 * 10**9)
    probe.open_window(["nic:h2/p"])  # before start and for another port: nothing to do
    async with probe:
        await asyncio.wait_for(_collect(probe, 4), 5)  # the first report of each lane
        probe.open_window(["nic:h1/p"])
        again = await asyncio.wait_for(_collect(probe, 8), 10)  # steady power, no heartbeat due: the window
        assert {e.meta["lane"] for e in again} == {1, 2, 3, 4}
        probe.close_window()


async def test_poller_consumes_latched_flags_only_when_configured() -> None:
    m = EmulatedQsfp28(rx_power_mw=0.5)
    m.set_rx_power_mw(None, lane=2)
    m.set_rx_power_mw(0.5, lane=2)  # transient LOS, latched
    probe = RxPowerProbe([ModulePort("nic:h1/p", "h1", lambda: m)], hz=2000, consume_latched_flags=True)
    async with probe:
        first = await asyncio.wait_for(_collect(probe, 4), 5)
    assert {e.meta["lane"]: e.meta["los"] for e in first} == {1: False, 2: True, 3: False, 4: False}
    assert m.lower[3] == 0  # consumed
    assert LosPlan.for_module(module_info(m)).reads == (EepromRead(0x50, 0, 0, 3, 1),)


async def test_a_module_without_rx_monitor_is_reported_and_not_sampled() -> None:
    img = bytearray(256)
    put(img, 0, "03")  # SFP without DDM
    good = EmulatedQsfp28(rx_power_mw=0.5)
    probe = RxPowerProbe(
        [
            ModulePort("nic:h1/p", "h1", lambda: FlatImage(bytes(img))),
            ModulePort("nic:h1/q", "h1", lambda: good),
        ],
        hz=2000,
    )
    async with probe:
        events = await asyncio.wait_for(_collect(probe, 5), 5)
    [error] = [e for e in events if e.kind == "sampler.error"]
    assert error.source == "nic:h1/p" and "no Rx power monitor" in str(error.value)
    assert {e.source for e in events if e.kind == "rx_power"} == {"nic:h1/q"}
    assert probe.stats()["ports_sampled"] == 1 and probe.stats()["ports_without_module"] == 1


async def test_poller_counts_transient_read_errors() -> None:
    flaky = _Flaky(EmulatedQsfp28(rx_power_mw=0.5), failures=3)
    probe = RxPowerProbe([ModulePort("nic:h1/p", "h1", lambda: flaky)], hz=2000)
    async with probe:
        first = await asyncio.wait_for(_collect(probe, 4), 5)
    assert probe.read_errors == 3
    assert all(e.meta["read_errors"] == 3 for e in first)


def test_ioctl_fallback_maps_pages_onto_the_flat_layouts() -> None:
    from labctl.linux.ethtool import ETH_MODULE_SFF_8472, ETH_MODULE_SFF_8636, IoctlModuleEeprom

    sfp = IoctlModuleEeprom.__new__(IoctlModuleEeprom)  # mapping only: no socket, no device
    sfp.ifname, sfp.netns, sfp.type, sfp.eeprom_len = "eth0", None, ETH_MODULE_SFF_8472, 512
    assert sfp.flat_offset(0x50, 0, 0, 92) == 92
    assert sfp.flat_offset(0x51, 0, 0, 104) == 360  # A2h at 256
    qsfp = IoctlModuleEeprom.__new__(IoctlModuleEeprom)
    qsfp.ifname, qsfp.netns, qsfp.type, qsfp.eeprom_len = "eth1", "ns1", ETH_MODULE_SFF_8636, 640
    assert qsfp.flat_offset(0x50, 0, 0, 34) == 34
    assert qsfp.flat_offset(0x50, 3, 0, 128) == 512  # page 03h upper half
    with pytest.raises(
        ModuleEepromError, match=r"eth1 \(netns ns1\): I2C 0x50 page 0x11 bank 1 is not reachable"
    ):
        qsfp.flat_offset(0x50, 0x11, 1, 186)


async def test_poller_over_a_model_driven_module() -> None:
    from labctl.models.module_eeprom import ModelDrivenQsfp28

    light: dict[str, float | None] = {"dbm": None}
    module = ModelDrivenQsfp28(lambda _t: light["dbm"])
    probe = RxPowerProbe([ModulePort("nic:h2/p", "h2", lambda: module)], hz=2000)
    async with probe:
        dark = await asyncio.wait_for(_collect(probe, 4), 5)
        assert all(e.value is None for e in dark)
        light["dbm"] = -4.0  # the circuit comes up: the next read sees it, no setter involved
        lit = await asyncio.wait_for(_collect(probe, 4), 5)
    assert [e.value for e in lit] == pytest.approx([-4.0] * 4, abs=1e-3)
    assert module.module.lower[3] == 0x0F  # the dark period stayed latched for the flags' owner


def ascii_field(text: str, width: int) -> str:
    """A space-padded ASCII field as the specs define them, in hex."""
    return text.ljust(width).encode("ascii").hex(" ")


def test_identity_of_each_memory_map() -> None:
    sfp = sfp_internal()
    put(sfp, 20, ascii_field("FINISAR CORP.", 16))  # SFF-8472 A0h 20-35 vendor name
    put(sfp, 37, "00 90 65")  # 37-39 OUI
    put(sfp, 40, ascii_field("FTLX8571D3BCL", 16))  # 40-55 part number
    put(sfp, 56, ascii_field("A", 4))  # 56-59 revision
    put(sfp, 68, ascii_field("ALM0N2B", 16))  # 68-83 serial
    put(sfp, 84, ascii_field("20120301", 8))  # 84-91 date code YYMMDD + lot
    q = qsfp28()
    put(q, 148, ascii_field("Mellanox", 16))  # SFF-8636 page 00h 148-163
    put(q, 165, "00 02 c9")  # 165-167
    put(q, 168, ascii_field("MMA1B00-C100D", 16))  # 168-183
    put(q, 184, ascii_field("B2", 2))  # 184-185
    put(q, 196, ascii_field("MT2043FT01234", 16))  # 196-211
    put(q, 212, ascii_field("201023", 8))  # 212-219
    pages = cmis_pages()
    lower = bytearray(pages[(0x50, 0, 0)])
    put(lower, 129, ascii_field("NVIDIA", 16))  # CMIS page 00h 129-144
    put(lower, 145, "48 b0 2d")  # 145-147
    put(lower, 148, ascii_field("MMS4X00-NS", 16))  # 148-163
    put(lower, 164, ascii_field("A5", 2))  # 164-165
    put(lower, 166, ascii_field("MT2230FT00001", 16))  # 166-181
    put(lower, 182, ascii_field("220725XY", 8))  # 182-189
    pages[(0x50, 0, 0)] = bytes(lower)
    got = {
        "sfp": decode_image(bytes(sfp)).identity,
        "qsfp": decode_image(bytes(q)).identity,
        "cmis": read_dom(PagedImage(pages)).identity,
    }
    assert {k: v.to_dict() if v else None for k, v in got.items()} == {
        "sfp": {
            "vendor_name": "FINISAR CORP.",
            "vendor_oui": "00:90:65",
            "part_number": "FTLX8571D3BCL",
            "revision": "A",
            "serial_number": "ALM0N2B",
            "date_code": "20120301",
        },
        "qsfp": {
            "vendor_name": "Mellanox",
            "vendor_oui": "00:02:c9",
            "part_number": "MMA1B00-C100D",
            "revision": "B2",
            "serial_number": "MT2043FT01234",
            "date_code": "201023",
        },
        "cmis": {
            "vendor_name": "NVIDIA",
            "vendor_oui": "48:b0:2d",
            "part_number": "MMS4X00-NS",
            "revision": "A5",
            "serial_number": "MT2230FT00001",
            "date_code": "220725XY",
        },
    }


def test_an_image_without_its_upper_page_decodes_without_identity() -> None:
    lower_only = bytearray(128)
    put(lower_only, 0, "18 40 80")  # QSFP-DD, CMIS 4.0, flat memory: nothing past byte 127 in this file
    d = decode_image(bytes(lower_only))
    assert d.module is ModuleKind.CMIS and d.identity is None and d.to_dict()["identity"] is None
