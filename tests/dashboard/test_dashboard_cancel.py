"""The dashboard's cancel button: a confirmation page, a POST under the CSRF rules, and the
run page showing who cancelled it and when."""

from __future__ import annotations

from flask.testing import FlaskClient

from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores import MemoryStore
from tests.dashboard.test_dashboard import client, confirm, queue, store

__all__ = ["client", "queue", "store"]  # The fixtures, shared with the dashboard's tests.


def test_cancel_needs_the_csrf_token_from_the_dashboards_own_page(
    client: FlaskClient, store: MemoryStore
) -> None:
    page = client.get("/runs/released")
    assert 'id="cancel"' in page.text
    assert client.post("/runs/released/cancel").status_code == 403  # No token.
    token = confirm(client, "released", "cancel")
    forged = client.post("/runs/released/cancel", data={"csrf_token": "x" * 43})
    assert forged.status_code == 403
    other_site = client.post(
        "/runs/released/cancel",
        data={"csrf_token": token},
        headers={"Origin": "https://evil.example"},
    )
    assert other_site.status_code == 403
    assert store.get("released").status is RunStatus.RELEASED  # type: ignore[union-attr]
    done = client.post("/runs/released/cancel", data={"csrf_token": token})
    assert done.status_code == 200 and "Cancelled by a local dashboard operator" in done.text
    record = store.get("released")
    assert record is not None and record.status is RunStatus.CANCELLED
    assert record.cancelled_by == "a local dashboard operator"
    shown = client.get("/runs/released")
    assert 'id="cancelled"' in shown.text and "a local dashboard operator" in shown.text
    assert 'id="cancel"' not in shown.text  # Nothing left to cancel.
    assert '<rect class="attempt cancelled"' in shown.text  # Its timeline's bar.


def test_a_running_run_is_marked_and_a_finished_one_refused(
    client: FlaskClient, store: MemoryStore
) -> None:
    token = confirm(client, "live", "cancel")
    assert "runs it now: it stops at its next step" in client.get("/runs/live/cancel").text
    marked = client.post("/runs/live/cancel", data={"csrf_token": token})
    assert marked.status_code == 200 and "stops at its next step" in marked.text
    assert store.get("live").status is RunStatus.IN_PROGRESS  # type: ignore[union-attr]
    assert 'id="cancel"' not in client.get("/runs/completed").text
    refused = client.post("/runs/completed/cancel", data={"csrf_token": token})
    assert refused.status_code == 409 and "it has ended (completed)" in refused.text
