"""The summary page and the run page's attempt timeline through Flask's test client: inline
SVG from the store, labelled with its source, bounded reads, the page's policy unchanged."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from flask.testing import FlaskClient

from tasklease.worker.dashboard import create_dashboard_app, summary
from tasklease.worker.stores import MemoryStore
from tests.support.dashboard_seed import LONG_HANDLER, REPLAYED, RETRIED, seed_hour, task

# The policy the dashboard had before it drew charts: inline SVG needs nothing more.
POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'"
)


@pytest.fixture
def store() -> MemoryStore:
    store = MemoryStore()
    seed_hour(store, datetime.now(UTC))
    return store


@pytest.fixture
def client(store: MemoryStore) -> FlaskClient:
    return create_dashboard_app(store).test_client()


def test_the_summary_draws_each_handlers_hour_as_svg_and_names_its_source(
    client: FlaskClient,
) -> None:
    page = client.get("/summary")
    assert page.status_code == 200
    assert page.headers["Content-Security-Policy"] == POLICY
    html = page.text
    assert "Runs claimed per minute, all handlers" in html and "(from the store)" in html
    assert "tasklease.deliveries" in html  # Where the numbers the store lacks are.
    cards = re.findall(r'<section class="card handler">.*?</section>', html, re.S)
    names = [re.search(r'class="handler-name">([^<]+)<', c).group(1) for c in cards]  # type: ignore[union-attr]
    assert set(names) == {"send_receipt", "charge_card", "sync_inventory", LONG_HANDLER}
    assert names[0] == "sync_inventory"  # The handler with a stuck run comes first.
    for card in cards:
        assert card.count("<svg") == 1 and 'class="bar completed"' in card
    assert 'class="bar stuck"' in html and 'class="bar failed"' in html
    assert "<dt>p99</dt><dd>—</dd>" not in cards[0]
    assert 'id="limit"' not in html


def test_a_handlers_summary_shows_that_handler_only(client: FlaskClient) -> None:
    html = client.get("/summary?handler=charge_card").text
    assert html.count('<section class="card handler">') == 1
    assert "charge_card" in html
    empty = client.get("/summary?handler=nobody").text
    assert 'id="no-runs"' in empty


def test_a_page_view_reads_a_bounded_number_of_runs_and_says_when_it_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(summary, "MAX_RUNS", 120)
    store = MemoryStore()
    now = datetime.now(UTC)
    for n in range(300):
        task(store, "send", f"t{n}", now - timedelta(seconds=10 * n + 5))
    html = create_dashboard_app(store).test_client().get("/summary").text
    assert 'id="limit"' in html and "Only the newest 120 runs" in html
    assert re.search(r'<span class="value">120</span><span class="muted">runs claimed', html)
    assert "not read: the read stopped at its limit" in html


def test_names_are_escaped_inside_the_svg() -> None:
    store = MemoryStore()
    task(store, "<script>x</script>", "t", datetime.now(UTC) - timedelta(minutes=1))
    html = create_dashboard_app(store).test_client().get("/summary").text
    assert "<script>x" not in html and "&lt;script&gt;x" in html


def test_the_run_page_draws_the_attempt_timeline_with_what_the_record_keeps(
    client: FlaskClient,
) -> None:
    html = client.get(f"/runs/{RETRIED}").text
    timeline = re.search(r'<section class="card wide" id="timeline">.*?</section>', html, re.S)
    assert timeline is not None
    part = timeline.group(0)
    assert part.count("<svg") == 2  # A wide and a narrow drawing; CSS shows one.
    assert 'class="attempt completed"' in part and "fencing token 3" in part
    assert 'class="earlier"' in part
    assert "2 earlier attempts (fencing tokens below 3" in part
    replay = client.get("/runs/charge_card-replay-1044").text
    assert "replay of" in replay and 'class="attempt failed"' in replay
    assert f"run {REPLAYED}" in replay
