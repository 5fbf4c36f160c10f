"""The dashboard's run page of a waiting run: its wait, and the signal form under CSRF."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from flask.testing import FlaskClient

from tasklease import protocol
from tasklease.producer import MemoryTransport, Producer
from tasklease.testing.contract_support import claim_request
from tasklease.worker.core import waits
from tasklease.worker.core.waits import Wait
from tasklease.worker.dashboard import create_dashboard_app
from tasklease.worker.stores import MemoryStore

RUN = "d" * 64


@pytest.fixture
def store() -> MemoryStore:
    made = MemoryStore()
    now = datetime.now(UTC)
    made.claim(claim_request(RUN, identity={"queue": "q", "task_name": "t"}), now)
    wait = Wait("approval", 0, now, now + timedelta(hours=2), queue="q")
    assert made.suspend(RUN, "attempt-1", wait, '{"order": 1}', now) is not None
    return made


@pytest.fixture
def queue() -> MemoryTransport:
    return MemoryTransport()


@pytest.fixture
def client(store: MemoryStore, queue: MemoryTransport) -> FlaskClient:
    producer = Producer("p", "l", "q", "https://w.example", transport=queue)
    client = create_dashboard_app(store, producer=producer).test_client()
    client.environ_base["HTTP_ORIGIN"] = "http://localhost"
    return client


def signal_form(client: FlaskClient) -> dict[str, str]:
    page = client.get(f"/runs/{RUN}")
    assert page.status_code == 200
    assert 'id="wait"' in page.text and "Waits for approval" in page.text
    return dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page.text))


def test_the_form_sends_the_signal_once_and_the_page_shows_it_came(
    client: FlaskClient, store: MemoryStore, queue: MemoryTransport
) -> None:
    fields = signal_form(client)
    assert fields["name"] == "approval"
    sent = client.post(f"/runs/{RUN}/signal", data={**fields, "payload": '{"ok": true}'})
    assert sent.status_code == 200 and "Signal sent: the run resumes." in sent.text
    assert "its signal has come" in sent.text and 'id="signal"' not in sent.text
    again = client.post(f"/runs/{RUN}/signal", data={**fields, "payload": "1"})
    assert "sent before" in again.text
    (task,) = queue.tasks
    assert task.request.headers[protocol.RESUME_HEADER].startswith(RUN)
    record = store.get(RUN)
    assert record is not None
    assert waits.waits_of(record).signals["approval"].payload_json == '{"ok":true}'


def test_a_signal_without_the_pages_csrf_token_or_with_bad_json_changes_nothing(
    client: FlaskClient, store: MemoryStore, queue: MemoryTransport
) -> None:
    forged = client.post(f"/runs/{RUN}/signal", data={"name": "approval", "payload": "1"})
    assert forged.status_code == 403
    fields = signal_form(client)
    broken = client.post(f"/runs/{RUN}/signal", data={**fields, "payload": "{nope"})
    assert broken.status_code == 400 and "not JSON" in broken.text
    record = store.get(RUN)
    assert record is not None and waits.waits_of(record).signals == {}
    assert queue.tasks == []
