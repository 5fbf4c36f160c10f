"""Crafted query strings on the dashboard's list answer 400 with the reason, never 500: names
url_for reads itself (endpoint, _method, _anchor, _scheme, _external) are not carried into
links, and dates past datetime's range (a cursor in year 9999, ``older_than=1000000d``) are
invalid input. The CLI's ``--cursor`` and ``--older-than`` exit 2 with the reason."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from flask.testing import FlaskClient

from tasklease import cli
from tasklease.cli.runs import Exit
from tasklease.testing.operations_contract import seed_every_state
from tasklease.worker.dashboard import create_dashboard_app
from tasklease.worker.stores import SqliteStore


def cursor(moment: str) -> str:
    """A cursor of this module's own shape, for a crafted moment."""
    text = json.dumps([moment, "run"], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


CRAFTED = [
    "endpoint=x&limit=1",  # limit=1: the page builds its next page's link.
    "_method=POST&limit=1",
    "_anchor=evil&limit=1",
    "_scheme=javascript&_external=1&limit=1",
    "limit=1&values=x",
    f"cursor={cursor('9999-12-31T23:59:59-14:00')}",
    f"cursor={cursor('0001-01-01T00:00:00+14:00')}",
    "older_than=1000000d",
    "newer_than=1000000d",
    f"older_than={'9' * 400}d",
]


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    path = tmp_path / "runs.db"
    store = SqliteStore(path)
    seed_every_state(store, datetime.now(UTC) - timedelta(hours=1))
    store.close()
    yield f"sqlite:///{path}"


@pytest.fixture
def client(url: str) -> FlaskClient:
    store = SqliteStore(url.removeprefix("sqlite:///"))
    return create_dashboard_app(store).test_client()


@pytest.mark.parametrize("query", CRAFTED)
def test_a_crafted_query_string_answers_400_with_its_reason(
    client: FlaskClient, query: str
) -> None:
    page = client.get(f"/?{query}")
    assert page.status_code == 400
    notice = page.text.split('<div class="notice error">', 1)[1].split("</div>", 1)[0]
    assert notice.startswith(("unknown query parameter", "invalid cursor", "invalid duration"))
    assert "#evil" not in page.text and "javascript:" not in page.text


def test_known_filters_are_carried_into_the_next_pages_link_and_nothing_else(
    client: FlaskClient,
) -> None:
    page = client.get("/?limit=2&kind=task&handler=h")
    assert page.status_code == 200
    link = html.unescape(page.text.split('id="next" href="', 1)[1].split('"', 1)[0])
    assert sorted(parse_qs(urlsplit(link).query)) == ["cursor", "handler", "kind", "limit"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--cursor", cursor("9999-12-31T23:59:59-14:00")],
        ["--older-than", "1000000d"],
        ["--newer-than", f"{'9' * 400}d"],
    ],
)
def test_the_clis_out_of_range_cursor_or_age_exits_2_with_the_reason(
    url: str, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = cli.main(["runs", "list", "--store", url, *argv])
    except SystemExit as exit_:  # argparse refuses a bad --older-than itself.
        code = int(exit_.code or 0)
    err = capsys.readouterr().err
    assert code == Exit.USAGE
    assert "invalid cursor" in err or "invalid duration" in err
