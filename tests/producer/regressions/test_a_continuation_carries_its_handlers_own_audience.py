"""A handler may set its own OIDC ``audience`` (its Scheduler job, or its tasks' senders, mint
tokens for it). The continuation task ``continue_later`` creates is the worker's own: its token
must be for that audience too, or every delivery of it is refused (401) until the queue gives
up, and the run never goes on."""

from __future__ import annotations

import time
from typing import Any

import pytest
from google.auth import jwt
from pytest_httpserver import HTTPServer

from tasklease import protocol
from tasklease.emulator.oidc import TokenIssuer
from tasklease.producer import Producer
from tasklease.producer.memory import MemoryTransport
from tasklease.worker import OidcAuth, Router, TaskContext, create_app
from tasklease.worker.stores import MemoryStore
from tests.support.helpers import job_headers, task_headers

WORKER = "https://worker.example.com"  # TASKLEASE_AUDIENCE, and the producer's worker URL.
OWN = "https://reports.example.com"  # The handler's own audience.
ACCOUNT = "jobs@p.iam.gserviceaccount.com"


def _token(issuer: TokenIssuer, audience: str) -> str:
    now = int(time.time())
    claims = {
        "iss": "https://accounts.google.com",
        "aud": audience,
        "email": ACCOUNT,
        "email_verified": True,
        "iat": now,
        "exp": now + 600,
        "sub": ACCOUNT,
    }
    return jwt.encode(issuer._signer, claims).decode()  # type: ignore[no-untyped-call,no-any-return]


@pytest.mark.parametrize("kind", ["scheduled", "task"])
def test_a_continuation_of_a_handler_with_its_own_audience_is_accepted_by_it(
    httpserver: HTTPServer, kind: str
) -> None:
    issuer = TokenIssuer()
    httpserver.expect_request("/certs").respond_with_json(issuer.certs())
    router = Router()

    def work(ctx: TaskContext) -> Any:
        if ctx.continuation == 0:
            ctx.continue_later({"page": 1}, delay=0)
            return None
        return {"pages": 2}

    if kind == "scheduled":
        router.scheduled("nightly", audience=OWN)(work)
    else:
        router.task("nightly", audience=OWN)(lambda payload, ctx: work(ctx))
    transport = MemoryTransport()
    router.use_producer(
        Producer("p", "l", worker_url=WORKER, service_account=ACCOUNT, transport=transport)
    )
    auth = OidcAuth([ACCOUNT], audience=WORKER, certs_url=httpserver.url_for("/certs"))
    client = create_app(router, store=MemoryStore(), auth=auth).test_client()

    # The first delivery, with a token for the handler's audience (as its sender mints it).
    first = (
        {**job_headers(), "Authorization": f"Bearer {_token(issuer, OWN)}"}
        if kind == "scheduled"
        else {**task_headers(task="t-1"), "Authorization": f"Bearer {_token(issuer, OWN)}"}
    )
    route = "/jobs/nightly" if kind == "scheduled" else "/tasks/nightly"
    reply = client.post(route, headers=first, data=b"{}")
    assert reply.headers[protocol.OUTCOME_HEADER] == "processed"

    # Cloud Tasks delivers the continuation with a token for the task's OIDC audience (the
    # target URL when the task names none).
    (queued,) = transport.tasks
    request = queued.request
    audience = request.audience or request.url
    headers = {
        **task_headers(task=request.task_id.rsplit("/", 1)[-1]),
        **request.headers,
        "Authorization": f"Bearer {_token(issuer, audience)}",
    }
    path = request.url.removeprefix(WORKER)
    resumed = client.post(path, headers=headers, data=request.body)
    assert (resumed.status_code, resumed.headers[protocol.OUTCOME_HEADER]) == (200, "processed")
