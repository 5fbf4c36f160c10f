"""The summary page and the attempt timeline in headless Chromium at desktop and phone widths:
the SVG is drawn and visible, nothing widens the page, and the screenshots docs/ shows
(``TASKLEASE_UPDATE_SCREENSHOTS=1`` saves docs/dashboard-summary.png and
docs/dashboard-run.png)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tasklease.cli.dashboard import serving_dashboard
from tasklease.plumbing.serve import free_port
from tasklease.worker.stores import SqliteStore
from tests.support.browser import Browser, Tab, chromium, png_colours
from tests.support.dashboard_seed import LONG_HANDLER, TAKEN_OVER, seed_deliveries, seed_hour

DOCS = Path(__file__).resolve().parents[2] / "docs"
UPDATE = os.environ.get("TASKLEASE_UPDATE_SCREENSHOTS") == "1"
WIDTHS = [(1280, 1000, False), (390, 844, True)]
# The drawn SVGs that show at this width (a chart drawn twice shows one drawing per width).
VISIBLE_SVG = (
    "[...document.querySelectorAll('{0} svg')].filter(s => s.getBoundingClientRect().width > 0)"
)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("charts") / "runs.db"
    store = SqliteStore(path)
    seed_hour(store, datetime.now(UTC))
    seed_deliveries(store, datetime.now(UTC))
    store.close()
    with serving_dashboard(f"sqlite:///{path}", "127.0.0.1", free_port(), None) as served:
        yield served


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


def fits(tab: Tab, width: int) -> None:
    """The page is no wider than the window: no sideways scrolling."""
    assert tab.evaluate("innerWidth") == width, "the page zoomed out to fit"
    scroll = tab.evaluate("document.documentElement.scrollWidth")
    assert scroll <= tab.evaluate("innerWidth"), f"{tab.url} is {scroll} px wide at {width}"


def save(tab: Tab, path: Path) -> None:
    shot = tab.screenshot(path)
    _, _, colours = png_colours(shot)
    assert len(colours) > 20, "the screenshot is blank"
    if UPDATE:
        shutil.copy(path, DOCS / path.name)


@pytest.mark.parametrize(("width", "height", "mobile"), WIDTHS)
def test_the_summary_draws_every_handler_in_svg_without_widening_the_page(
    browser: Browser, url: str, tmp_path: Path, width: int, height: int, mobile: bool
) -> None:
    tab = browser.tab()
    tab.resize(width, height, mobile=mobile)
    tab.goto(url + "summary")
    fits(tab, width)
    assert tab.evaluate(f"{VISIBLE_SVG.format('#total')}.length") == 1
    handlers = tab.evaluate(f"{VISIBLE_SVG.format('#handlers')}.length")
    assert handlers == 4 + 3  # Runs of four handlers; deliveries of the three with counts.
    assert tab.evaluate(f"{VISIBLE_SVG.format('#deliveries')}.length") == 1
    outcomes = "document.querySelectorAll('#deliveries .wide-only rect.bar')"
    assert tab.evaluate(f"{outcomes}.length") > 60
    assert "lost_claim" in tab.text("#deliveries") and "duplicate" in tab.text("#deliveries")
    bars = "document.querySelectorAll('#total .wide-only rect.bar, #total .narrow-only rect.bar')"
    assert tab.evaluate(f"{bars}.length") > 60
    drawn = "(e => e.getBoundingClientRect().height)(document.querySelector('#total .figure'))"
    assert tab.evaluate(drawn) > 100
    assert LONG_HANDLER in tab.text("#handlers")
    assert "from the store" in tab.text("#total")
    name = "dashboard-summary.png" if not mobile else "dashboard-summary-phone.png"
    save(tab, tmp_path / name)


@pytest.mark.parametrize(("width", "height", "mobile"), WIDTHS)
def test_the_run_page_draws_its_attempt_timeline_without_widening_the_page(
    browser: Browser, url: str, tmp_path: Path, width: int, height: int, mobile: bool
) -> None:
    tab = browser.tab()
    tab.resize(width, height, mobile=mobile)
    tab.goto(url + f"runs/{TAKEN_OVER}")
    fits(tab, width)
    assert tab.evaluate(f"{VISIBLE_SVG.format('#timeline')}.length") == 1
    visible = VISIBLE_SVG.format("#timeline") + "[0]"
    assert tab.evaluate(f"{visible}.querySelectorAll('rect.attempt.running').length") == 1
    assert tab.evaluate(f"{visible}.querySelectorAll('rect.lease').length") == 1
    assert tab.evaluate(f"{visible}.querySelectorAll('rect.earlier').length") == 1
    assert "fencing token 2" in tab.evaluate(f"{visible}.textContent")
    assert "1 earlier attempt" in tab.text("#timeline")
    if mobile:
        tab.evaluate("document.querySelector('#timeline').scrollIntoView()")
    save(tab, tmp_path / ("dashboard-run.png" if not mobile else "dashboard-run-phone.png"))
