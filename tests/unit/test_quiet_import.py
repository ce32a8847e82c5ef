"""Optional dependencies import without passing their own deprecation notices on to a labctl user.

asyncssh with cryptography ≥ 51 raised CryptographyDeprecationWarning (a UserWarning subclass) on import:
`labctl emulate ocs --protocol netconf` printed it before its banner, and under the suite's `-W error` it
failed the import (issue 45).
"""

from __future__ import annotations

import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from labctl.core.extras import hide_library_deprecations, install_hint, is_deprecation, quiet_import, require


class VendorDeprecationWarning(UserWarning):
    """Shaped like cryptography's: a deprecation that derives from UserWarning."""


def test_a_deprecation_is_told_by_its_class_and_its_name() -> None:
    assert is_deprecation(DeprecationWarning)
    assert is_deprecation(PendingDeprecationWarning)
    assert is_deprecation(VendorDeprecationWarning)
    assert not is_deprecation(UserWarning)
    assert not is_deprecation(RuntimeWarning)


def test_the_import_drops_deprecations_and_passes_on_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "labctl_test_noisy_vendor.py").write_text(
        textwrap.dedent(
            f"""
            import warnings
            from {__name__} import VendorDeprecationWarning
            warnings.warn("DSA is deprecated", VendorDeprecationWarning)
            warnings.warn("old api", DeprecationWarning)
            warnings.warn("the real thing", UserWarning)
            VALUE = 7
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "labctl_test_noisy_vendor", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = require("labctl_test_noisy_vendor", "netconf", "a test")
    assert module.VALUE == 7
    assert [str(w.message) for w in caught] == ["the real thing"]
    assert caught[0].category is UserWarning
    # a second import finds the module loaded and warns nothing
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        assert quiet_import("labctl_test_noisy_vendor") is module
    assert again == []


def test_the_install_hint_names_where_this_labctl_came_from() -> None:
    """Never `pip install 'labctl[...]'`: that name on the public index is another project (issue 45)."""
    import importlib.metadata
    import json

    hint = install_hint("netconf")
    assert "'labctl[" not in hint
    direct = json.loads(importlib.metadata.distribution("labctl-ocs").read_text("direct_url.json") or "{}")
    if direct.get("dir_info", {}).get("editable"):  # this suite runs from a clone's editable install
        assert hint == f"pip install -e '{Path(__file__).resolve().parents[2]}[netconf]'"
    else:
        assert hint.endswith("[netconf]'")


def _warn_from(filename: str, category: type[Warning], text: str) -> None:
    warnings.warn_explicit(text, category, filename, 1)


def test_a_labctl_command_shows_no_library_deprecation_and_every_other_warning() -> None:
    import labctl

    ours = str(Path(labctl.__file__).parent / "run" / "engine.py")
    shown: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        # what the terminal would print: the showwarning in place before labctl's (pytest records otherwise)
        warnings.showwarning = lambda message, *args, **kwargs: shown.append(str(message))
        hide_library_deprecations()
        hide_library_deprecations()  # installed once however often called
        _warn_from(
            "/venv/site-packages/asyncssh/crypto/misc.py", VendorDeprecationWarning, "DSA is deprecated"
        )
        _warn_from("/venv/site-packages/pandas/core.py", UserWarning, "a library's real warning")
        _warn_from(ours, DeprecationWarning, "labctl's own deprecation")
    assert shown == ["a library's real warning", "labctl's own deprecation"]


def test_a_service_log_drops_library_deprecations_too() -> None:
    import io

    from labctl.core.logs import setup_logging

    stream = io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        handler = setup_logging("info", stream=stream, fmt="text")
        try:
            _warn_from(
                "/venv/site-packages/asyncssh/crypto/misc.py", VendorDeprecationWarning, "DSA is deprecated"
            )
            _warn_from("/venv/site-packages/aiomqtt/client.py", RuntimeWarning, "a real problem")
        finally:
            import logging

            logging.captureWarnings(False)
            logging.getLogger().removeHandler(handler)
            handler.close()
    assert "DSA is deprecated" not in stream.getvalue()
    assert "a real problem" in stream.getvalue()
