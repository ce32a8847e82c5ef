"""pyverbs behind labctl.rdma.compat: the real distribution module without a device (CI installs
python3-pyverbs), the enum-class API of newer rdma-core, and a missing pyverbs as one line."""

from __future__ import annotations

import enum
import sys
import types
from pathlib import Path

import pytest

from labctl.rdma import compat
from labctl.rdma.rc import QpAttrs, WcStatus
from tests.conftest import require


@pytest.fixture(scope="module")
def verbs() -> compat.Verbs:
    try:
        return compat.load()
    except compat.PyverbsMissing as e:
        require(False, f"pyverbs: {e} (CI installs python3-pyverbs)")
        raise


def test_the_real_module_builds_the_objects_an_rc_ping_pong_needs(verbs: compat.Verbs) -> None:
    qp = verbs.module("qp")
    wr = verbs.module("wr")
    cap = qp.QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
    init = qp.QPInitAttr(qp_type=verbs.const("IBV_QPT_RC"), cap=cap)
    assert init.qp_type == verbs.const("IBV_QPT_RC")
    attrs = QpAttrs(timeout=14, retry_cnt=7, rnr_retry=7, min_rnr_timer=12)
    attr = qp.QPAttr()
    for name in ("timeout", "retry_cnt", "rnr_retry", "min_rnr_timer"):
        setattr(attr, name, getattr(attrs, name))
    assert (attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.min_rnr_timer) == (14, 7, 7, 12)
    sge = wr.SGE(0x1000, 64, 0)
    send = wr.SendWR(opcode=verbs.const("IBV_WR_SEND"), num_sge=1, sg=[sge])
    assert send.num_sge == 1


def test_completion_statuses_are_named_as_verbs_names_them(verbs: compat.Verbs) -> None:
    for status in WcStatus:  # the model's statuses are the real module's
        assert verbs.wc_status_name(verbs.const(status.value)) == status.value
    assert verbs.wc_status_name(0) == "IBV_WC_SUCCESS"


def test_no_device_is_one_clear_line(verbs: compat.Verbs) -> None:
    if compat.SYSFS_INFINIBAND.is_dir() and any(compat.SYSFS_INFINIBAND.iterdir()):
        pytest.skip("this host has an RDMA device")
    with pytest.raises(compat.RdmaUnavailable) as info:
        compat.devices(verbs)
    assert "\n" not in str(info.value) and "no RDMA device" in str(info.value)


def test_the_enum_class_api_of_newer_rdma_core_answers_the_same_names() -> None:
    class ibv_qp_type(enum.IntEnum):
        IBV_QPT_RC = 2
        IBV_QPT_UD = 4

    class ibv_wc_status(enum.IntEnum):
        IBV_WC_SUCCESS = 0
        IBV_WC_RETRY_EXC_ERR = 12

    enums = types.ModuleType("pyverbs.libibverbs_enums")
    enums.ibv_qp_type = ibv_qp_type  # type: ignore[attr-defined]
    enums.ibv_wc_status = ibv_wc_status  # type: ignore[attr-defined]
    verbs = compat.Verbs(types.ModuleType("pyverbs"), enums, enum_classes=True)
    assert verbs.const("IBV_QPT_RC") == 2
    assert verbs.wc_status_name(12) == "IBV_WC_RETRY_EXC_ERR"
    with pytest.raises(KeyError):
        verbs.const("IBV_NOPE")


def test_a_missing_pyverbs_is_one_line_naming_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyverbs", None)  # an import of it fails, as where it is not installed
    with pytest.raises(compat.PyverbsMissing) as info:
        compat.load(dist_packages=(tmp_path,))
    message = str(info.value)
    assert "\n" not in message and "python3-pyverbs" in message


def test_the_rts_attributes_carry_the_path_psns_and_recovery_settings(verbs: compat.Verbs) -> None:
    from labctl.inventory.schema import RdmaPortSpec
    from labctl.rdma.oob import QpInfo
    from labctl.rdma.verbs import ipv4_gid, rts_attr

    gid = ipv4_gid("10.0.0.20/24")
    assert gid == "0000:0000:0000:0000:0000:ffff:0a00:0014"
    remote = QpInfo(qpn=0x1234, psn=0x55, gid=gid)
    attrs = QpAttrs(timeout=14, retry_cnt=7, rnr_retry=7, min_rnr_timer=12)
    attr = rts_attr(verbs, RdmaPortSpec(device="mlx5_0", port=1, gid_index=3), attrs, remote, sq_psn=0x66)
    assert (attr.dest_qp_num, attr.rq_psn, attr.sq_psn) == (0x1234, 0x55, 0x66)
    assert (attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.min_rnr_timer) == (14, 7, 7, 12)
    assert attr.path_mtu == verbs.const("IBV_MTU_1024")
    assert attr.ah_attr.port_num == 1 and attr.ah_attr.is_global == 1


def test_opening_a_qp_without_a_device_is_one_line(verbs: compat.Verbs) -> None:
    from labctl.inventory.schema import RdmaPortSpec
    from labctl.rdma.verbs import VerbsQp

    if compat.SYSFS_INFINIBAND.is_dir() and any(compat.SYSFS_INFINIBAND.iterdir()):
        pytest.skip("this host has an RDMA device")
    qp = VerbsQp(verbs, RdmaPortSpec(device="mlx5_0"), QpAttrs())
    with pytest.raises(compat.RdmaUnavailable) as info:
        qp.open()
    assert "\n" not in str(info.value)
    qp.close()  # nothing was opened: closing is a no-op
