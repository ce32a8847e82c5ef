"""Optional dependencies (the `[gpu]`, and later `[netconf]`, `[scpi]`, `[serial]`, `[rdma]` extras).

They are imported where they are used, never at module level, so `import labctl` and every lab that does
not need one work without it; a missing one is one line naming the extra to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from labctl.core.errors import LabctlError


class MissingExtra(LabctlError):
    """An optional dependency is not installed; the message says which extra brings it."""

    def __init__(self, module: str, extra: str, purpose: str, missing: str | None = None) -> None:
        self.module = module
        self.extra = extra
        gone = f"{missing} is not installed" if missing and missing != module else "it is not installed"
        super().__init__(f"{purpose} needs {module} ({gone}): pip install 'labctl[{extra}]'")


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import `module` or raise MissingExtra: `<purpose> needs <module> …: pip install 'labctl[<extra>]'`."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtra(module, extra, purpose, e.name) from None
