"""A run belongs to the principal whose delivery created it.

With several allowed service accounts, one must not read, pre-empt or dead-letter another's
runs: a delivery for an existing run from another principal gets 403, changes nothing and
learns nothing.
"""

from __future__ import annotations

import time
from typing import Any

import flask
import pytest
from google.auth import jwt
from pytest_httpserver import HTTPServer

from tasklease.emulator.oidc import TokenIssuer
from tasklease.worker import OidcAuth, PermanentFailure, Router, TaskContext, create_app
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores import MemoryStore
from tests.support.helpers import task_headers

ALICE = "alice@p.iam.gserviceaccount.com"
BOB = "bob@p.iam.gserviceaccount.com"
AUDIENCE = "https://worker.example.com"


class Tokens:
    def __init__(self, server: HTTPServer) -> None:
        self.issuer = TokenIssuer()
        server.expect_request("/certs").respond_with_json(self.issuer.certs())
        self.url = server.url_for("/certs")

    def for_(self, email: str) -> str:
        now = int(time.time())
        claims = {
            "iss": "https://accounts.google.com",
            "aud": AUDIENCE,
            "email": email,
            "email_verified": True,
            "iat": now,
            "exp": now + 600,
            "sub": email,
        }
        return jwt.encode(self.issuer._signer, claims).decode()  # type: ignore[no-untyped-call,no-any-return]


@pytest.fixture
def tokens(httpserver: HTTPServer) -> Tokens:
    return Tokens(httpserver)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def ran() -> list[tuple[str, Any]]:
    return []


@pytest.fixture
def app(tokens: Tokens, store: MemoryStore, ran: list[tuple[str, Any]]) -> flask.Flask:
    router = Router()

    @router.task("pay")
    def pay(payload: Any, ctx: TaskContext) -> Any:
        ran.append((ctx.attempt_id, payload))
        if payload.get("fail"):
            raise PermanentFailure("refused")
        return {"secret": payload["amount"]}

    auth = OidcAuth([ALICE, BOB], audience=AUDIENCE, certs_url=tokens.url)
    return create_app(router, store=store, auth=auth)


def deliver(app: flask.Flask, token: str, body: bytes = b'{"amount": 100}') -> Any:
    headers = {**task_headers(task="invoice-7"), "Authorization": f"Bearer {token}"}
    return app.test_client().post("/tasks/pay", headers=headers, data=body)


def test_another_principal_cannot_read_a_completed_runs_result(
    app: flask.Flask, tokens: Tokens, store: MemoryStore, ran: list[tuple[str, Any]]
) -> None:
    first = deliver(app, tokens.for_(ALICE))
    assert first.headers["X-Tasklease-Outcome"] == "processed"
    before = store.list_runs()
    stolen = deliver(app, tokens.for_(BOB))
    assert (stolen.status_code, stolen.headers["X-Tasklease-Outcome"]) == (403, "forbidden")
    assert b"secret" not in stolen.data
    assert b"100" not in stolen.data
    assert set(stolen.json) == {"outcome", "message", "run_id"}
    assert store.list_runs() == before
    assert deliver(app, tokens.for_(ALICE)).headers["X-Tasklease-Outcome"] == "duplicate"
    assert len(ran) == 1


def test_another_principal_cannot_dead_letter_or_rerun_anothers_run(
    app: flask.Flask, tokens: Tokens, store: MemoryStore, ran: list[tuple[str, Any]]
) -> None:
    assert deliver(app, tokens.for_(ALICE), b'{"amount": 1, "fail": false}').status_code == 200
    run_id = store.list_runs()[0].run_id
    for body in (b"not json", b'{"amount": 1, "fail": true}'):
        hostile = deliver(app, tokens.for_(BOB), body)
        assert hostile.status_code == 403
    record = store.get(run_id)
    assert record is not None
    assert record.status is RunStatus.COMPLETED
    assert record.caller == ALICE
    assert len(ran) == 1


def test_a_run_pre_claimed_by_another_principal_is_not_theirs_to_finish(
    app: flask.Flask, tokens: Tokens, store: MemoryStore, ran: list[tuple[str, Any]]
) -> None:
    squatted = deliver(app, tokens.for_(BOB), b'{"amount": 1}')
    assert squatted.status_code == 200
    owner = deliver(app, tokens.for_(ALICE))
    assert owner.status_code == 403
    assert b"secret" not in owner.data
    assert [payload for _, payload in ran] == [{"amount": 1}]
    record = store.list_runs()[0]
    assert record.caller == BOB
