"""A task name of 150 characters with no break opportunity pushed the runs list and the run
page wider than the window, at 1280 px and on a phone: table cells and grid columns grew to the
name's width. Long names now wrap (overflow-wrap: anywhere; min-width: 0 in flex and grid)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tasklease.cli.dashboard import serving_dashboard
from tasklease.plumbing.serve import free_port
from tasklease.worker.stores import SqliteStore
from tests.support.browser import Browser, chromium
from tests.support.helpers import claim_request

LONG_TASK = "export_" + "quarterly_ledger_" * 8 + "2026Q3"  # No break opportunity.
LONG_HANDLER = "reconcile_settlements_against_the_acquirer_daily_report_" + "x" * 30
RUN_ID = "long-run"


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    path = tmp_path / "runs.db"
    store = SqliteStore(path)
    identity = {"queue": "default", "task_name": LONG_TASK}
    request = claim_request(RUN_ID, handler=LONG_HANDLER, identity=identity)
    store.claim(request, datetime.now(UTC) - timedelta(minutes=3))
    store.close()
    with serving_dashboard(f"sqlite:///{path}", "127.0.0.1", free_port(), None) as served:
        yield served


@pytest.fixture
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


@pytest.mark.parametrize(("width", "mobile"), [(1280, False), (390, True)])
def test_a_long_task_name_does_not_widen_the_runs_list_or_the_run_page(
    browser: Browser, url: str, width: int, mobile: bool
) -> None:
    tab = browser.tab()
    tab.resize(width, 900, mobile=mobile)
    for page in ("", f"runs/{RUN_ID}"):
        tab.goto(url + page)
        assert LONG_TASK in tab.text()
        scroll = tab.evaluate("document.documentElement.scrollWidth")
        # A phone's layout viewport widens to fit content that overflows: measure both.
        assert tab.evaluate("innerWidth") == width, f"/{page} zoomed out at {width}"
        assert scroll <= width, f"/{page} is {scroll} px wide at {width}"
