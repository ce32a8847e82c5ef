"""pyverbs as users install it, behind one small interface.

pyverbs must match the system's rdma-core exactly (its modules link libibverbs), so real hosts use the
distribution's package (Debian/Ubuntu `python3-pyverbs`), built for the system Python; the PyPI sdist only
imports where its version equals the system rdma-core's. `load()` imports pyverbs from the environment,
else from the distribution's dist-packages when this Python has the same minor version as the system one
(the extension ABI is per minor version). A missing pyverbs is one line saying what to install.

The API drifted: rdma-core ≤ ~v50 has flat constants in `pyverbs.enums` (`IBV_QPT_RC`), later ones enum
classes in `pyverbs.libibverbs_enums` (`ibv_qp_type.IBV_QPT_RC`). `Verbs.const(name)` answers both, and
`Verbs.wc_status_name(code)` names a completion status the way verbs does (`IBV_WC_RETRY_EXC_ERR`).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from labctl.core.errors import HardwareError, LabctlError

DIST_PACKAGES = (Path("/usr/lib/python3/dist-packages"),)
SYSFS_INFINIBAND = Path("/sys/class/infiniband")


class PyverbsMissing(LabctlError):
    """pyverbs cannot be imported here."""


class RdmaUnavailable(HardwareError):
    """pyverbs imports, but there is no RDMA device to use."""


def _import_pyverbs(dist_packages: tuple[Path, ...]) -> ModuleType:
    try:
        return importlib.import_module("pyverbs")
    except ImportError as first:
        reason = str(first)
    for root in dist_packages:
        init = root / "pyverbs" / "__init__.py"
        if not init.exists():
            continue
        built = [p.name for p in (root / "pyverbs").glob("device.cpython-*.so")]
        tag = f"cpython-{sys.version_info.major}{sys.version_info.minor}"
        if built and not any(tag in name for name in built):
            reason = (
                f"{root}/pyverbs is built for another Python ({built[0]}), this is {sys.version.split()[0]}"
            )
            continue
        spec = importlib.util.spec_from_file_location(
            "pyverbs", init, submodule_search_locations=[str(init.parent)]
        )
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules["pyverbs"] = module
        try:
            spec.loader.exec_module(module)
        except ImportError as e:
            del sys.modules["pyverbs"]
            reason = str(e)
            continue
        return module
    raise PyverbsMissing(
        f"the RDMA probe needs pyverbs ({reason}): install the distribution's python3-pyverbs (it must match "
        "the system rdma-core; e.g. apt install python3-pyverbs) and run labctl with the system Python's "
        "minor version"
    )


@dataclass(frozen=True)
class Verbs:
    """The pyverbs modules and constants labctl uses, whichever API generation is installed."""

    pyverbs: ModuleType
    enums: ModuleType
    enum_classes: bool
    """True for rdma-core's enum-class API (`pyverbs.libibverbs_enums`), False for flat constants."""

    def const(self, name: str) -> int:
        """A verbs constant by its C name (IBV_QPT_RC, IBV_WR_SEND, IBV_ACCESS_LOCAL_WRITE, ...)."""
        if not self.enum_classes:
            return int(getattr(self.enums, name))
        for value in vars(self.enums).values():
            member = getattr(value, name, None) if isinstance(value, type) else None
            if member is not None:
                return int(member)
        raise KeyError(f"pyverbs has no constant {name}")

    def wc_status_name(self, code: int) -> str:
        """IBV_WC_SUCCESS, IBV_WC_RETRY_EXC_ERR, ... for a work completion's status code."""
        if self.enum_classes:
            status = getattr(self.enums, "ibv_wc_status", None)
            if status is not None:
                try:
                    return str(status(code).name)
                except ValueError:
                    pass
        for name, value in vars(self.enums).items():
            if name.startswith("IBV_WC_") and isinstance(value, int) and value == code and _is_status(name):
                return name
        return f"IBV_WC_STATUS_{code}"

    def module(self, name: str) -> Any:
        """A pyverbs submodule: device, pd, cq, mr, qp, wr, addr."""
        return importlib.import_module(f"pyverbs.{name}")


_STATUS_NAMES = (
    "SUCCESS",
    "LOC_LEN_ERR",
    "LOC_QP_OP_ERR",
    "LOC_EEC_OP_ERR",
    "LOC_PROT_ERR",
    "WR_FLUSH_ERR",
    "MW_BIND_ERR",
    "BAD_RESP_ERR",
    "LOC_ACCESS_ERR",
    "REM_INV_REQ_ERR",
    "REM_ACCESS_ERR",
    "REM_OP_ERR",
    "RETRY_EXC_ERR",
    "RNR_RETRY_EXC_ERR",
    "LOC_RDD_VIOL_ERR",
    "REM_INV_RD_REQ_ERR",
    "REM_ABORT_ERR",
    "INV_EECN_ERR",
    "INV_EEC_STATE_ERR",
    "FATAL_ERR",
    "RESP_TIMEOUT_ERR",
    "GENERAL_ERR",
    "TM_ERR",
    "TM_RNDV_INCOMPLETE",
)
"""enum ibv_wc_status, in order (IBV_WC_SUCCESS = 0 ... IBV_WC_TM_RNDV_INCOMPLETE); flat-constant modules
also hold IBV_WC_* opcodes and flags, so names are checked against this list."""


def _is_status(name: str) -> bool:
    return name.removeprefix("IBV_WC_") in _STATUS_NAMES


def load(dist_packages: tuple[Path, ...] = DIST_PACKAGES) -> Verbs:
    """Import pyverbs (PyverbsMissing with one line if it cannot be)."""
    pyverbs = _import_pyverbs(dist_packages)
    try:
        return Verbs(pyverbs, importlib.import_module("pyverbs.libibverbs_enums"), enum_classes=True)
    except ImportError:
        return Verbs(pyverbs, importlib.import_module("pyverbs.enums"), enum_classes=False)


def devices(verbs: Verbs) -> list[str]:
    """The RDMA devices here (mlx5_0, rxe0, ...); RdmaUnavailable with one line if there are none."""
    try:
        found = verbs.module("device").get_device_list()
    except Exception as e:  # pyverbs raises PyverbsRDMAError when there is no device list at all
        raise RdmaUnavailable(
            f"no RDMA device on this host ({type(e).__name__}: {e}; {SYSFS_INFINIBAND} "
            f"{'is empty' if SYSFS_INFINIBAND.is_dir() else 'does not exist'}): the RDMA probe needs a "
            "RoCE/InfiniBand NIC (or soft-RoCE: rdma link add rxe0 type rxe netdev IFACE)"
        ) from None
    names = [d.name.decode() if isinstance(d.name, bytes) else str(d.name) for d in found]
    if not names:
        raise RdmaUnavailable("no RDMA device on this host: the RDMA probe needs a RoCE/InfiniBand NIC")
    return names
