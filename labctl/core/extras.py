"""Optional dependencies (the `[gpu]`, and later `[netconf]`, `[scpi]`, `[serial]`, `[rdma]` extras).

They are imported where they are used, never at module level, so `import labctl` and every lab that does
not need one work without it; a missing one is one line naming the extra to install.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType

from labctl.core.errors import LabctlError


class MissingExtra(LabctlError):
    """An optional dependency is not installed; the message says which extra brings it."""

    def __init__(self, module: str, extra: str, purpose: str, missing: str | None = None) -> None:
        self.module = module
        self.extra = extra
        gone = f"{missing} is not installed" if missing and missing != module else "it is not installed"
        super().__init__(f"{purpose} needs {module} ({gone}): pip install 'labctl[{extra}]'")


def is_deprecation(category: type[Warning]) -> bool:
    """A deprecation notice, Python's own or a library's (cryptography's CryptographyDeprecationWarning
    derives from UserWarning, so the class name is what tells it)."""
    return issubclass(category, DeprecationWarning | PendingDeprecationWarning) or any(
        "Deprecat" in klass.__name__ for klass in category.__mro__
    )


def quiet_import(module: str) -> ModuleType:
    """Import a third-party module without passing on the deprecation notices its import raises (e.g.
    asyncssh touching cryptography's DSA classes): they are for that module's authors, not for a labctl
    user, and under `-W error` they would fail the import. Any other warning is passed on as it was."""
    if module in sys.modules:
        return sys.modules[module]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        imported = importlib.import_module(module)
    for notice in caught:
        if not is_deprecation(notice.category):
            warnings.warn_explicit(notice.message, notice.category, notice.filename, notice.lineno)
    return imported


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import `module` or raise MissingExtra: `<purpose> needs <module> …: pip install 'labctl[<extra>]'`."""
    try:
        return quiet_import(module)
    except ImportError as e:
        raise MissingExtra(module, extra, purpose, e.name) from None
