"""An operator's release names the attempt the operator saw, never whichever holds the run
when the form is posted: a healthy retry that replaced a hung attempt keeps running alone."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tasklease import cli
from tasklease.cli.runs import Exit
from tasklease.worker.core.constants import MAX_CLOCK_SKEW
from tasklease.worker.core.records import RunStatus
from tasklease.worker.dashboard import create_dashboard_app
from tasklease.worker.stores import SqliteStore
from tests.support.helpers import claim_request


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    store = SqliteStore(tmp_path / "runs.db")
    yield store
    store.close()


def hang(store: SqliteStore) -> datetime:
    """attempt-1 claims the run now and hangs, its lease live (its keeper renews it)."""
    now = datetime.now(UTC)
    store.claim(claim_request("hung", attempt_id="attempt-1"), now)
    return now


def replace(store: SqliteStore, hung_at: datetime) -> None:
    """attempt-1's process dies; once its lease has lapsed a healthy retry, attempt-2,
    takes the run over (claimed then, its lease is live now too)."""
    takeover = hung_at + claim_request().lease + MAX_CLOCK_SKEW
    claim = store.claim(claim_request("hung", attempt_id="attempt-2"), takeover)
    assert claim.record.attempt_id == "attempt-2"


def test_the_dashboards_force_release_refuses_when_a_retry_replaced_the_attempt_shown(
    store: SqliteStore,
) -> None:
    client = create_dashboard_app(store).test_client()
    client.environ_base["HTTP_ORIGIN"] = "http://localhost"
    hung_at = hang(store)
    page = client.get("/runs/hung/release")
    assert 'name="force" value="1"' in page.text
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page.text))
    replace(store, hung_at)  # Before the operator's click.

    answer = client.post("/runs/hung/release", data=fields)

    record = store.get("hung")
    assert record is not None
    assert (record.status, record.attempt_id) == (RunStatus.IN_PROGRESS, "attempt-2")
    assert answer.status_code == 409
    assert 'id="attempt">attempt-1<' in page.text  # The page named the attempt it showed.
    assert "attempt-1" in answer.text and "attempt-2" in answer.text
    assert "Nothing was released" in answer.text


def test_the_dashboard_refuses_a_release_form_that_names_no_attempt(
    store: SqliteStore,
) -> None:
    client = create_dashboard_app(store).test_client()
    client.environ_base["HTTP_ORIGIN"] = "http://localhost"
    replace(store, hang(store))
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/runs/hung/release").text)
    assert token is not None
    answer = client.post("/runs/hung/release", data={"csrf_token": token[1], "force": "1"})
    assert answer.status_code == 400
    assert store.get("hung").status is RunStatus.IN_PROGRESS  # type: ignore[union-attr]


def test_the_clis_force_release_of_a_replaced_attempt_refuses_and_names_the_holder(
    store: SqliteStore, capsys: pytest.CaptureFixture[str]
) -> None:
    replace(store, hang(store))
    url = f"sqlite:///{store.path}"
    argv = ["runs", "release", "hung", "--force", "--attempt", "attempt-1", "--store", url]
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == Exit.REFUSED
    assert "attempt-1 no longer holds it" in err and "attempt-2" in err
    record = store.get("hung")
    assert record is not None
    assert (record.status, record.attempt_id) == (RunStatus.IN_PROGRESS, "attempt-2")

    code = cli.main(
        ["runs", "release", "hung", "--force", "--attempt", "attempt-2", "--store", url]
    )
    captured = capsys.readouterr()
    assert code == Exit.OK
    assert "released attempt attempt-2" in captured.out
    assert store.get("hung").status is RunStatus.RELEASED  # type: ignore[union-attr]
