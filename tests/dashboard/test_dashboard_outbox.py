"""The dashboard's outbox page: depth, oldest age and failed entries with their reasons
(escaped), shown when an outbox is configured; requeueing the failed ones needs CSRF."""

from __future__ import annotations

import re
import sqlite3
import urllib.request
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from tasklease.outbox import open_outbox
from tasklease.outbox.db import OutboxDB
from tasklease.plumbing.url_secrets import shown_url
from tasklease.producer import Producer
from tasklease.worker.dashboard import create_dashboard_app
from tasklease.worker.stores import MemoryStore, SqliteStore

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>"\'&'


def stage(path: Path, orders: range) -> None:
    """Stage one receipt per order through a real SQLite transaction, as a web app does."""
    producer = Producer("p", "us-central1", "q", "https://w.example", tasks_endpoint="http://x")
    with sqlite3.connect(path) as conn:
        for order in orders:
            conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)")
            conn.execute("INSERT INTO orders (id) VALUES (?)", (order,))
            producer.enqueue("send_receipt", {"order": order}, key=f"o{order}", transaction=conn)


def fail_one(db: OutboxDB, reason: str) -> str:
    """What the relay does with an entry Cloud Tasks refused for good."""
    entry = db.claim(1, 10**10, 60)[0]
    db.mark_failed({entry.id: reason})
    return entry.id


@pytest.fixture
def runs_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The store's own SQLite file, with the outbox table in it: 3 pending, 1 failed."""
    monkeypatch.delenv("TASKLEASE_OUTBOX_URL", raising=False)
    path = tmp_path / "runs.db"
    SqliteStore(path).get("nothing")  # The store creates its file and schema.
    db = open_outbox(f"sqlite:///{path}")
    db.migrate()
    stage(path, range(1, 5))
    fail_one(db, f"400 task too large {HOSTILE}")
    db.close()
    return path


def client_for(store: object, **kwargs: str) -> FlaskClient:
    client = create_dashboard_app(store, **kwargs).test_client()  # type: ignore[arg-type]
    client.environ_base["HTTP_ORIGIN"] = "http://localhost"  # What a browser sends on a POST.
    return client


def test_the_page_shows_depth_oldest_age_and_each_failed_entry_with_its_reason(
    runs_db: Path,
) -> None:
    client = client_for(SqliteStore(runs_db))
    assert 'href="/outbox">Outbox</a>' in client.get("/").text  # Found in the store's file.
    page = client.get("/outbox")
    assert page.status_code == 200, page.text
    assert re.search(r'id="depth">3<', page.text)
    assert re.search(r'id="failed-total">1<', page.text)
    assert re.search(r'id="oldest-age">[0-9.]+ s<', page.text)
    assert "send_receipt" in page.text and "400 task too large" in page.text


def test_a_hostile_reason_is_shown_as_text_and_never_becomes_markup(runs_db: Path) -> None:
    page = client_for(SqliteStore(runs_db)).get("/outbox").text
    assert "<script>" not in page and "<img" not in page
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in (
        page
    )


def test_requeueing_the_failed_entries_needs_the_pages_csrf_token(runs_db: Path) -> None:
    client = client_for(SqliteStore(runs_db))
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/outbox").text)
    assert token is not None
    assert client.post("/outbox/requeue").status_code == 403
    assert client.post("/outbox/requeue", data={"csrf_token": "x" * 43}).status_code == 403
    db = open_outbox(f"sqlite:///{runs_db}")
    assert db.status(0).failed_total == 1  # Nothing was requeued by the refused posts.
    done = client.post("/outbox/requeue", data={"csrf_token": token.group(1)})
    assert done.status_code == 200 and "Requeued 1 failed entries" in done.text
    assert re.search(r'id="depth">4<', done.text) and 'id="no-failed"' in done.text
    assert db.status(0).failed_total == 0
    db.close()


def test_without_an_outbox_there_is_no_link_and_the_page_says_how_to_configure_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("TASKLEASE_OUTBOX_URL", raising=False)
    for store in (MemoryStore(), SqliteStore(tmp_path / "plain.db")):
        client = client_for(store)
        assert "Outbox</a>" not in client.get("/").text
        page = client.get("/outbox")
        assert page.status_code == 404 and "TASKLEASE_OUTBOX_URL" in page.text
        assert client.post("/outbox/requeue").status_code == 403  # CSRF first, as ever.


def test_tasklease_outbox_url_names_an_outbox_in_another_database(
    runs_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKLEASE_OUTBOX_URL", f"sqlite:///{runs_db}")
    page = client_for(MemoryStore()).get("/outbox")
    assert page.status_code == 200 and re.search(r'id="depth">3<', page.text)
    # outbox="" turns the page off whatever the environment says.
    assert client_for(MemoryStore(), outbox="").get("/outbox").status_code == 404


def test_an_outbox_without_its_table_answers_unavailable(tmp_path: Path) -> None:
    page = client_for(MemoryStore(), outbox=f"sqlite:///{tmp_path}/empty.db").get("/outbox")
    assert page.status_code == 503 and "The outbox is unavailable" in page.text


def test_the_page_never_shows_the_databases_password() -> None:
    shown = shown_url("postgresql://shop:s3cret@db.internal:5432/shop?schema=app")
    assert shown == "postgresql://shop:***@db.internal:5432/shop?schema=app"
    assert shown_url("sqlite:////srv/shop.db") == "sqlite:////srv/shop.db"


def test_tasklease_dashboard_finds_the_outbox_in_its_stores_database(runs_db: Path) -> None:
    from tasklease.cli.dashboard import serving_dashboard  # noqa: PLC0415
    from tasklease.plumbing.serve import free_port  # noqa: PLC0415

    with serving_dashboard(f"sqlite:///{runs_db}", "127.0.0.1", free_port(), None) as url:
        page = urllib.request.urlopen(f"{url}outbox", timeout=10).read().decode()
    assert re.search(r'id="depth">3<', page) and "400 task too large" in page
