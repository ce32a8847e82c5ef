"""Optional dependencies (the `[gpu]`, and later `[netconf]`, `[scpi]`, `[serial]`, `[rdma]` extras).

They are imported where they are used, never at module level, so `import labctl` and every lab that does
not need one work without it; a missing one is one line naming the extra to install.
"""

from __future__ import annotations

import importlib
import json
import warnings
from pathlib import Path
from types import ModuleType
from typing import TextIO
from urllib.parse import unquote, urlparse

from labctl.core.errors import LabctlError
from labctl.core.version import DISTRIBUTION


class MissingExtra(LabctlError):
    """An optional dependency is not installed; the message says which extra brings it."""

    def __init__(self, module: str, extra: str, purpose: str, missing: str | None = None) -> None:
        self.module = module
        self.extra = extra
        gone = f"{missing} is not installed" if missing and missing != module else "it is not installed"
        super().__init__(f"{purpose} needs {module} ({gone}): {install_hint(extra)}")


def install_hint(extra: str) -> str:
    """The pip line that adds `extra` to the labctl that is running: from the clone it was installed from
    (editable), from its wheel, else by its distribution name (never `labctl`, an unrelated project there)."""
    import importlib.metadata  # here: every `labctl` process imports this module, few need the hint

    try:
        direct = json.loads(
            importlib.metadata.distribution(DISTRIBUTION).read_text("direct_url.json") or "{}"
        )
    except (importlib.metadata.PackageNotFoundError, ValueError):
        direct = {}
    url = urlparse(str(direct.get("url", "")))
    if url.scheme == "file" and url.path:
        source = unquote(url.path)
        if direct.get("dir_info", {}).get("editable"):
            return f"pip install -e '{source}[{extra}]'"
        return f"pip install '{source}[{extra}]'"
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def is_deprecation(category: type[Warning]) -> bool:
    """A deprecation notice, Python's own or a library's (cryptography's CryptographyDeprecationWarning
    derives from UserWarning, so the class name is what tells it)."""
    return issubclass(category, DeprecationWarning | PendingDeprecationWarning) or any(
        is_deprecation_name(klass.__name__) for klass in category.__mro__
    )


def is_deprecation_name(category_name: str) -> bool:
    return "Deprecat" in category_name


def quiet_import(module: str) -> ModuleType:
    """Import a third-party module without passing on the deprecation notices its import raises (e.g.
    asyncssh touching cryptography's DSA classes): they are for that module's authors, not for a labctl
    user, and under `-W error` they would fail the import. Any other warning is passed on as it was."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        imported = importlib.import_module(module)
    for notice in caught:
        if not is_deprecation(notice.category):
            warnings.warn_explicit(notice.message, notice.category, notice.filename, notice.lineno)
    return imported


LABCTL_DIR = str(Path(__file__).resolve().parents[1])


def library_deprecation(category: type[Warning], filename: str) -> bool:
    """A deprecation notice raised outside labctl's own code: for that library's authors, not for a labctl
    user at a terminal (labctl's own deprecations are shown)."""
    return is_deprecation(category) and library_file(filename)


def library_file(filename: str) -> bool:
    """A file outside labctl's package."""
    return not str(Path(filename).resolve()).startswith(LABCTL_DIR)


def hide_library_deprecations() -> None:
    """For labctl's own commands: a library's deprecation notice never reaches the user's terminal (issue 45:
    asyncssh's DSA notice under cryptography 51 printed before the NETCONF emulator's banner). Every other
    warning is shown as before. (`labctl.core.logs.setup_logging`, which routes warnings into the log, drops
    the same notices there.)"""
    shown = warnings.showwarning
    if getattr(shown, "hides_library_deprecations", False):
        return

    def showwarning(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if not library_deprecation(category, filename):
            shown(message, category, filename, lineno, file, line)

    showwarning.hides_library_deprecations = True  # type: ignore[attr-defined]
    warnings.showwarning = showwarning


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import `module` or raise MissingExtra: `<purpose> needs <module> …: pip install '…[<extra>]'`."""
    try:
        return quiet_import(module)
    except ImportError as e:
        raise MissingExtra(module, extra, purpose, e.name) from None
