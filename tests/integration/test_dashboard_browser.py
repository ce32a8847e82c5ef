"""The dashboard in a real browser: Playwright driving Debian's Chromium (`apt-get install chromium`)
against a real `labctl serve --http 127.0.0.1:0` running a real fast experiment on the simulated lab. The
queue shows the job, the live page reaches "completed" with every port's t5 shown, the history lists the
run and its figures load. Screenshots go to the test's tmp_path (their paths are printed).

Skipped, with one line, where chromium or playwright is missing; in labctl's CI (LABCTL_CI=1) that fails."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from labctl.testing.support import require
from tests.helpers.dashboard import Served, serve_http, wait_until_done

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]  # fmt: skip
LIVE_TIMEOUT_MS = 120_000


@pytest.fixture
def browser() -> Iterator[Any]:
    require(
        Path(CHROMIUM).is_file() or shutil.which("chromium") is not None,
        "no chromium (apt-get install chromium)",
    )
    require(importlib.util.find_spec("playwright") is not None, "no playwright (pip install '.[test]')")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    yield from serve_http(tmp_path / "serve")


def _shot(page: Any, path: Path) -> None:
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


def test_queue_live_and_history_in_a_browser(browser: Any, served: Served, tmp_path: Path) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(30_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))

    # 1. the queue shows the job
    page.goto(served.url + "queue")
    job = page.locator("#jobs tr.job, #done tr.job").first
    job.wait_for()
    assert "dash" in job.inner_text()
    _shot(page, tmp_path / "queue.png")

    # 2. the live page follows the job to its run and reaches "completed", every port's t5 shown
    page.goto(served.url + "live/job/" + job.get_attribute("data-job"))
    page.wait_for_url("**/live/2*", timeout=LIVE_TIMEOUT_MS)  # run ids start with the date
    page.wait_for_function(
        "document.getElementById('status').textContent === 'completed'", timeout=LIVE_TIMEOUT_MS
    )
    ports = page.locator("#ports tbody tr")
    assert ports.count() == 16
    assert page.locator("#ports tbody td.reached.t5").count() == 16
    assert page.locator("#reconfig").inner_text() == page.locator("#total").inner_text() == "9"
    assert int(page.locator("#nrows").inner_text()) == 9 * 16
    page.locator("#end").wait_for()
    assert "Skipped ticks" in page.locator("#end").inner_text()
    _shot(page, tmp_path / "live.png")

    # 3. the history lists the run, and its figures load (drawn after run.end: once the job is done)
    wait_until_done(served)
    page.goto(served.url + "runs")
    run = page.locator("#runs tr.run").first
    assert "completed" in run.inner_text()
    page.locator("#trend").wait_for()
    _shot(page, tmp_path / "history.png")
    run.locator("a").first.click()
    page.wait_for_load_state("load")
    assert page.locator("#status").inner_text() == "completed"
    figures = page.locator("img.figure")
    assert figures.count() == 3
    widths = page.eval_on_selector_all("img.figure", "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
    assert all(w > 0 for w in widths), widths
    _shot(page, tmp_path / "run.png")

    # the pages are read-only without the token: a cancel from the page is refused with one line
    page.goto(served.url + "queue")
    page.locator("#done button.act").first.click()
    page.locator("#action-error").wait_for()
    assert "token" in page.locator("#action-error").inner_text()
    assert errors == [], errors
