"""A token captured from a delivery (it travels with every task) must not open the dashboard
mounted in the worker: its operators are named, and an operator that also delivers needs an
audience of its own."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import flask
import pytest
from pytest_httpserver import HTTPServer

from tasklease.errors import ConfigurationError
from tasklease.worker import OidcAuth, Router, TaskContext, create_app
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores import MemoryStore
from tests.support.helpers import claim_request
from tests.worker.test_security import AUDIENCE, ROOT, SA, Keys

OPERATOR = "ops@p.iam.gserviceaccount.com"
BOARD_AUDIENCE = "tasklease-dashboard:ops"


@pytest.fixture
def keys(httpserver: HTTPServer) -> Keys:
    return Keys(httpserver)


def worker(keys: Keys, store: MemoryStore, **options: Any) -> flask.Flask:
    router = Router()

    @router.task("send_receipt")
    def send_receipt(payload: Any, ctx: TaskContext) -> None:
        pass

    auth = OidcAuth([SA], audience=ROOT, certs_url=keys.url)
    return create_app(router, store=store, auth=auth, dashboard="/tasklease", **options)


def force_release_live_run(client: Any, token: str) -> int:
    """What the audit did with a delivery's token: open the page, force-release a live run."""
    headers = {"Authorization": f"Bearer {token}", "Origin": "http://localhost"}
    page = client.get("/tasklease/runs/live/release", headers=headers)
    if page.status_code != 200:
        return int(page.status_code)
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page.text))
    return int(
        client.post("/tasklease/runs/live/release", data=fields, headers=headers).status_code
    )


def test_the_mounted_dashboard_refuses_to_start_without_operators_named(
    keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TASKLEASE_DASHBOARD_OPERATORS", raising=False)
    with pytest.raises(ConfigurationError, match="TASKLEASE_DASHBOARD_OPERATORS"):
        worker(keys, MemoryStore())


def test_a_delivery_token_cannot_force_release_a_live_run(keys: Keys) -> None:
    store = MemoryStore()
    store.claim(claim_request("live"), datetime.now(UTC))
    client = worker(keys, store, dashboard_operators=[OPERATOR]).test_client()
    for audience in (AUDIENCE, ROOT):  # Cloud Tasks' default audience, and the configured one.
        assert force_release_live_run(client, keys.token(email=SA, aud=audience)) in (401, 403)
    assert store.get("live").status is RunStatus.IN_PROGRESS  # type: ignore[union-attr]
    assert force_release_live_run(client, keys.token(email=OPERATOR, aud=ROOT)) == 200
    assert store.get("live").status is RunStatus.RELEASED  # type: ignore[union-attr]


def test_an_operator_that_also_delivers_needs_an_audience_of_its_own(
    keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigurationError, match="TASKLEASE_DASHBOARD_AUDIENCE"):
        worker(keys, MemoryStore(), dashboard_operators=[SA])
    with pytest.raises(ConfigurationError, match="also delivers"):
        worker(keys, MemoryStore(), dashboard_operators=[SA], dashboard_audience=ROOT + "/")
    store = MemoryStore()
    store.claim(claim_request("live"), datetime.now(UTC))
    monkeypatch.setenv("TASKLEASE_DASHBOARD_AUDIENCE", BOARD_AUDIENCE)
    client = worker(keys, store, dashboard_operators=[SA]).test_client()
    for audience in (AUDIENCE, ROOT):
        assert force_release_live_run(client, keys.token(email=SA, aud=audience)) == 401
    assert store.get("live").status is RunStatus.IN_PROGRESS  # type: ignore[union-attr]
    assert force_release_live_run(client, keys.token(email=SA, aud=BOARD_AUDIENCE)) == 200
