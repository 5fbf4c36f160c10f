"""A page on another port of the dashboard's host (cookies are not isolated by port) planted
the CSRF cookie and posted the same token through a 307 on its own origin, which Chromium
sends as ``Origin: null``: a live run was released. The token is now an HMAC under a server
secret, and a state change must come from the dashboard's own origin."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from flask.testing import FlaskClient
from pytest_httpserver import HTTPServer
from werkzeug import Response

from tasklease.cli.dashboard import serving_dashboard
from tasklease.errors import ConfigurationError
from tasklease.plumbing.serve import free_port
from tasklease.testing.operations_contract import seed_every_state
from tasklease.worker.core.records import RunStatus
from tasklease.worker.dashboard import CSRF_COOKIE, create_dashboard_app
from tasklease.worker.stores import MemoryStore, SqliteStore
from tests.support.browser import chromium

PLANTED = "A" * 43  # Any 43 characters: what the old check took for a token.
OWN = "http://localhost"  # The test client's own origin.


@pytest.fixture
def store() -> MemoryStore:
    store = MemoryStore()
    seed_every_state(store, datetime.now(UTC) - timedelta(hours=1))
    return store


def fields(client: FlaskClient, **headers: str) -> dict[str, str]:
    page = client.get("/runs/live/release", headers=headers)
    return dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page.text))


def released(store: MemoryStore) -> bool:
    return store.get("live").status is RunStatus.RELEASED  # type: ignore[union-attr]


def test_a_planted_cookie_with_the_same_token_is_no_token(store: MemoryStore) -> None:
    client = create_dashboard_app(store).test_client()
    client.set_cookie(CSRF_COOKIE, PLANTED)
    form = {"csrf_token": PLANTED, "force": "1", "attempt_id": "attempt-1", "fencing_token": "1"}
    answer = client.post("/runs/live/release", data=form, headers={"Origin": OWN})
    assert answer.status_code == 403 and "CSRF token" in answer.text
    assert not released(store)


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "null"},
        {},
        {"Origin": "http://localhost:8091"},
        {"Origin": "https://localhost"},
        {"Referer": "http://localhost.evil.example/runs/live/release"},
        {"Origin": "null", "Referer": f"{OWN}/runs/live/release"},
    ],
)
def test_a_post_from_another_origin_or_none_is_refused(
    store: MemoryStore, headers: dict[str, str]
) -> None:
    client = create_dashboard_app(store).test_client()
    answer = client.post("/runs/live/release", data=fields(client), headers=headers)
    assert answer.status_code == 403 and "own page" in answer.text
    assert not released(store)


def test_the_own_origin_or_referer_with_the_pages_token_is_accepted(store: MemoryStore) -> None:
    client = create_dashboard_app(store).test_client()
    form = fields(client)
    assert form["csrf_token"] != client.get_cookie(CSRF_COOKIE).value  # type: ignore[union-attr]
    answer = client.post(
        "/runs/live/release", data=form, headers={"Referer": f"{OWN}/runs/live/release"}
    )
    assert answer.status_code == 200 and released(store)


def test_a_token_is_valid_only_under_the_secret_that_signed_it(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = create_dashboard_app(store).test_client()
    form = fields(first)
    other = create_dashboard_app(store).test_client()  # Another process: another secret.
    other.set_cookie(CSRF_COOKIE, first.get_cookie(CSRF_COOKIE).value)  # type: ignore[union-attr]
    refused = other.post("/runs/live/release", data=form, headers={"Origin": OWN})
    assert refused.status_code == 403 and not released(store)
    monkeypatch.setenv("TASKLEASE_DASHBOARD_SECRET", "s" * 32)  # Shared by every instance.
    first = create_dashboard_app(store).test_client()
    form = fields(first)
    other = create_dashboard_app(store).test_client()
    other.set_cookie(CSRF_COOKIE, first.get_cookie(CSRF_COOKIE).value)  # type: ignore[union-attr]
    assert other.post("/runs/live/release", data=form, headers={"Origin": OWN}).status_code == 200
    monkeypatch.setenv("TASKLEASE_DASHBOARD_SECRET", "short")
    with pytest.raises(ConfigurationError, match="TASKLEASE_DASHBOARD_SECRET"):
        create_dashboard_app(store)


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[tuple[str, SqliteStore]]:
    path = tmp_path / "runs.db"
    store = SqliteStore(path)
    seed_every_state(store, datetime.now(UTC) - timedelta(hours=1))
    with serving_dashboard(f"sqlite:///{path}", "127.0.0.1", free_port(), None) as url:
        yield url, store
    store.close()


@pytest.fixture
def attacker() -> Iterator[HTTPServer]:
    server = HTTPServer(host="127.0.0.1", port=free_port())
    server.start()
    yield server
    server.clear()
    server.stop()


ATTACK_PAGE = f"""<!doctype html>
<script>document.cookie = "{CSRF_COOKIE}={PLANTED}; path=/";</script>
<form method="post" action="/bounce">
  <input name="csrf_token" value="{PLANTED}"><input name="force" value="1">
  <input name="attempt_id" value="attempt-1"><input name="fencing_token" value="1">
  <button id="go">win a prize</button>
</form>"""


def test_a_page_on_another_port_cannot_release_a_live_run_in_chromium(
    dashboard: tuple[str, SqliteStore], attacker: HTTPServer
) -> None:
    url, store = dashboard
    attacker.expect_request("/").respond_with_data(ATTACK_PAGE, content_type="text/html")
    # A 307 keeps the POST and its body; after a cross-origin redirect the Origin is "null".
    bounce = Response(status=307, headers={"Location": url + "runs/live/release"})
    attacker.expect_request("/bounce", method="POST").respond_with_response(bounce)
    with chromium() as browser:
        tab = browser.tab()
        tab.goto(attacker.url_for("/"))
        assert PLANTED in tab.evaluate("document.cookie")
        tab.click("#go")
        assert tab.url == url + "runs/live/release"  # The browser did post it to the dashboard.
        assert "Refused" in tab.text()
    record = store.get("live")
    assert record is not None
    assert (record.status, record.fencing_token) == (RunStatus.IN_PROGRESS, 1)
