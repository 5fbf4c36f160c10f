"""The worker's Django view answers as the Flask and ASGI workers do: OIDC with the
include's prefix in a handler's URL, 405, 413, 404, and one log line per delivery."""

from __future__ import annotations

import logging
import time

import pytest
from django.test import Client, override_settings
from google.auth import jwt
from pytest_httpserver import HTTPServer

from tasklease.django import DJANGO_TASK_HANDLER
from tasklease.emulator.oidc import TokenIssuer
from tasklease.worker.auth.authenticators import OidcAuth
from tasklease.worker.observe.logs import EXECUTION_LOGGER
from tests.django_project import tasks
from tests.support.helpers import task_headers

ACCOUNT = "tasks@p.iam.gserviceaccount.com"
PATH = f"/worker/tasks/{DJANGO_TASK_HANDLER}"


def _body(note: str) -> bytes:
    return b'{"task": "tests.django_project.tasks.record", "args": ["' + note.encode() + b'"]}'


def _token(issuer: TokenIssuer, audience: str) -> str:
    now = int(time.time())
    claims = {
        "iss": "https://accounts.google.com",
        "aud": audience,
        "email": ACCOUNT,
        "email_verified": True,
        "iat": now,
        "exp": now + 600,
        "sub": "1",
    }
    return jwt.encode(issuer._signer, claims).decode()  # type: ignore[no-untyped-call,no-any-return]


@pytest.fixture
def issuer(httpserver: HTTPServer) -> TokenIssuer:
    issuer = TokenIssuer()
    httpserver.expect_request("/certs").respond_with_json(issuer.certs())
    return issuer


def _post(client: Client, task: str, body: bytes, **headers: str) -> object:
    return client.post(
        PATH, data=body, content_type="application/json", headers=task_headers(task=task) | headers
    )


def test_a_token_for_the_handlers_url_under_the_include_prefix_is_accepted(
    issuer: TokenIssuer, httpserver: HTTPServer
) -> None:
    tasks.CALLS.clear()
    auth = OidcAuth([ACCOUNT], audience="http://testserver", certs_url=httpserver.url_for("/certs"))
    client = Client()
    with override_settings(TASKLEASE_AUTH=auth):
        # Cloud Tasks' default audience is the target's whole URL: the prefix is part of it.
        right = _token(issuer, f"http://testserver{PATH}")
        accepted = _post(client, "oidc-1", _body("signed"), Authorization=f"Bearer {right}")
        wrong = _token(issuer, f"http://testserver/tasks/{DJANGO_TASK_HANDLER}")
        refused = _post(client, "oidc-2", _body("unsigned"), Authorization=f"Bearer {wrong}")
    assert accepted.status_code == 200, accepted.content  # type: ignore[attr-defined]
    assert refused.status_code == 401  # type: ignore[attr-defined]
    assert tasks.CALLS == ["signed"]


def test_a_get_is_answered_405_allowing_post() -> None:
    response = Client().get(PATH, headers=task_headers(task="get-1"))
    assert response.status_code == 405
    assert response.headers["Allow"] == "POST"


def test_a_body_over_the_limit_is_answered_413_and_runs_nothing() -> None:
    tasks.CALLS.clear()
    with override_settings(TASKLEASE_MAX_TASK_BYTES=32):
        response = _post(Client(), "big-1", _body("x" * 64))
    assert response.status_code == 413  # type: ignore[attr-defined]
    assert tasks.CALLS == []


def test_a_handler_nobody_registered_is_answered_404() -> None:
    response = Client().post(
        "/worker/tasks/no_such_handler", data=b"{}", content_type="application/json",
        headers=task_headers(task="missing-1"),
    )  # fmt: skip
    assert response.status_code == 404
    assert response.headers["X-Tasklease-Outcome"]


def test_each_delivery_writes_the_workers_log_line(caplog: pytest.LogCaptureFixture) -> None:
    tasks.CALLS.clear()
    with caplog.at_level(logging.INFO, logger=EXECUTION_LOGGER):
        response = _post(Client(), "logged-1", _body("logged"))
    assert response.status_code == 200  # type: ignore[attr-defined]
    [line] = [r for r in caplog.records if r.name == EXECUTION_LOGGER]
    assert DJANGO_TASK_HANDLER in line.getMessage()
