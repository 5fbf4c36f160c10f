"""The dashboard in a real browser: headless Chromium lists, filters, opens and releases runs,
and takes the screenshot the README shows (``TASKLEASE_UPDATE_SCREENSHOTS=1`` saves it to
docs/)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tasklease.cli.dashboard import serving_dashboard
from tasklease.plumbing.serve import free_port
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores import SqliteStore
from tests.support.browser import Browser, chromium, png_colours
from tests.support.helpers import claim_request

DOCS = Path(__file__).resolve().parents[2] / "docs"
UPDATE = os.environ.get("TASKLEASE_UPDATE_SCREENSHOTS") == "1"


def seed(store: SqliteStore, now: datetime) -> None:
    """A shop's last hour: receipts sent, a card declined, a crashed attempt, nightly jobs."""
    tasks = [
        ("send_receipt", "order-1042", 58, "completed", None),
        ("send_receipt", "order-1043", 51, "completed", None),
        ("charge_card", "order-1044", 47, "failed", "PermanentFailure: card declined (2051)"),
        ("sync_inventory", "sku-88", 40, "stuck", None),
        ("send_receipt", "order-1045", 31, "released", "TimeoutError: SMTP server 421"),
        ("charge_card", "order-1046", 22, "completed", None),
        ("send_receipt", "order-1047", 1, "in_progress", None),
    ]
    for handler, name, minutes, state, error in tasks:
        at = now - timedelta(minutes=minutes)
        run_id = f"{handler}-{name}"
        identity = {"queue": "default", "task_name": f"{name}-{handler}"}
        store.claim(claim_request(run_id, handler=handler, identity=identity), at)
        finished = at + timedelta(seconds=2)
        if state == "completed":
            store.complete(run_id, "attempt-1", '{"ok":true}', finished)
        elif state == "failed":
            store.fail(run_id, "attempt-1", error or "", finished, '{"order":1044}')
        elif state == "released":
            store.release(run_id, "attempt-1", error or "", finished)
    for slot, trigger in (("02:00", "scheduled"), ("03:00", "manual")):
        identity = {"job_name": "nightly_reports", "schedule_time": f"2026-11-30T{slot}:00Z"}
        identity["trigger"] = trigger
        run_id = f"nightly_reports-{slot}-{trigger}"
        request = claim_request(
            run_id, kind="scheduler", handler="nightly_reports", identity=identity
        )
        store.claim(request, now)
        store.complete(run_id, "attempt-1", None, now + timedelta(seconds=30))


@pytest.fixture
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[tuple[str, SqliteStore]]:
    path = tmp_path / "runs.db"
    store = SqliteStore(path)
    seed(store, datetime.now(UTC))
    with serving_dashboard(f"sqlite:///{path}", "127.0.0.1", free_port(), None) as url:
        yield url, store
    store.close()


def test_an_operator_lists_filters_opens_and_releases_runs_in_chromium(
    browser: Browser, dashboard: tuple[str, SqliteStore], tmp_path: Path
) -> None:
    url, store = dashboard
    tab = browser.tab()
    tab.resize(1280, 860)
    tab.goto(url)
    assert tab.evaluate("document.querySelectorAll('#runs tbody tr').length") == 9
    stuck_rows = tab.evaluate("[...document.querySelectorAll('tr.stuck')].map(r => r.innerText)")
    assert len(stuck_rows) == 1 and "sku-88" in stuck_rows[0]
    highlighted = tab.evaluate(
        "getComputedStyle(document.querySelector('tr.stuck td')).backgroundColor"
    )
    assert highlighted not in ("rgba(0, 0, 0, 0)", "rgb(255, 255, 255)")

    shot = tab.screenshot(tmp_path / "dashboard.png")
    width, height, colours = png_colours(shot)
    assert (width, height) == (1280, 860)
    _, count = colours.most_common(1)[0]
    assert len(colours) > 20, "the screenshot is blank: too few colours"
    assert count < 0.9 * sum(colours.values()), "the screenshot is one colour"

    # Filter with the form, as a person would: pick "failed" and press Filter.
    tab.evaluate("document.querySelector('select[name=status]').value = 'failed'")
    tab.click("form.filters button[type=submit]")
    assert "status=failed" in tab.url
    statuses = tab.evaluate("[...document.querySelectorAll('#runs .status')].map(s => s.innerText)")
    assert statuses == ["failed"]

    # Open the run.
    tab.click("a.run-link")
    assert "/runs/charge_card-order-1044" in tab.url
    assert "card declined" in tab.text("#error")
    assert tab.evaluate("!!document.querySelector('#replay')")

    # Release the crashed attempt, through the confirmation page.
    tab.goto(url + "?stuck=1")
    tab.click("a.run-link")
    tab.click("#release")
    assert "Release run" in tab.text("h1")
    tab.click("#confirm-button")
    assert "Released" in tab.text("#notice")
    assert tab.text("#status").startswith("released")
    record = store.get("sync_inventory-sku-88")
    assert record is not None
    assert (record.status, record.fencing_token) == (RunStatus.RELEASED, 2)

    # Readable on a phone: rows stack, the header row hides.
    tab.resize(390, 844, mobile=True)
    tab.goto(url)
    thead = "getComputedStyle(document.querySelector('#runs thead')).display"
    assert tab.evaluate(thead) == "none"
    assert tab.evaluate("document.documentElement.scrollWidth") <= 390
    phone = tab.screenshot(tmp_path / "dashboard-phone.png")
    assert len(png_colours(phone)[2]) > 20
    if UPDATE:
        DOCS.mkdir(exist_ok=True)
        shutil.copy(tmp_path / "dashboard.png", DOCS / "dashboard.png")
        shutil.copy(tmp_path / "dashboard-phone.png", DOCS / "dashboard-phone.png")
