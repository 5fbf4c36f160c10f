"""``POST /signals/<run_id>/<name>``: authenticated as a delivery to the run's handler."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import flask
import pytest
from pytest_httpserver import HTTPServer

from tasklease import protocol
from tasklease.emulator.oidc import ISSUER, TokenIssuer
from tasklease.testing.contract_support import claim_request
from tasklease.testing.stubs import StubQueue
from tasklease.worker import OidcAuth, Router, TaskContext, create_app
from tasklease.worker.core import waits
from tasklease.worker.core.waits import Wait
from tasklease.worker.stores import MemoryStore

SA = "tasks@p.iam.gserviceaccount.com"
OTHER_SA = "intruder@p.iam.gserviceaccount.com"
ROOT = "http://localhost"
RUN, PRIVATE, DONE = "a" * 64, "b" * 64, "c" * 64


class Keys:
    def __init__(self, server: HTTPServer) -> None:
        self.issuer = TokenIssuer()
        server.expect_request("/certs").respond_with_json(
            self.issuer.certs(), headers={"Cache-Control": "public, max-age=3600"}
        )
        self.url = server.url_for("/certs")

    def token(self, email: str = SA) -> str:
        return self.issuer.mint(email, ROOT)


@pytest.fixture
def keys(httpserver: HTTPServer) -> Keys:
    return Keys(httpserver)


@pytest.fixture
def store() -> MemoryStore:
    made = MemoryStore()
    now = datetime.now(UTC)
    for run_id, handler in ((RUN, "approve"), (PRIVATE, "private"), (DONE, "approve")):
        identity = {"queue": "default", "task_name": f"t-{run_id[0]}"}
        made.claim(claim_request(run_id, handler=handler, identity=identity), now)
        wait = Wait("approval", 0, now, now + timedelta(hours=1), queue="default")
        made.suspend(run_id, "attempt-1", wait, None, now)
    made.cancel_run(DONE, "ops@example.com", now)
    return made


@pytest.fixture
def worker(keys: Keys, store: MemoryStore) -> tuple[flask.Flask, StubQueue]:
    router = Router()

    @router.task("approve")
    def approve(payload: Any, ctx: TaskContext) -> Any:
        return ctx.wait_for("approval")

    @router.task("private", allowed_service_accounts=[OTHER_SA])
    def private(payload: Any, ctx: TaskContext) -> Any:
        return ctx.wait_for("approval")

    queue = StubQueue().bind(router)
    auth = OidcAuth([SA], audience=ROOT, certs_url=keys.url, issuers=(ISSUER,))
    return create_app(router, store=store, auth=auth), queue


def post(app: flask.Flask, path: str, token: str | None, data: bytes = b'{"ok": true}') -> Any:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return app.test_client().post(path, headers=headers, data=data)


def test_an_allowed_caller_signals_the_run_once(
    worker: tuple[flask.Flask, StubQueue], keys: Keys, store: MemoryStore
) -> None:
    app, queue = worker
    answer = post(app, f"/signals/{RUN}/approval", keys.token())
    assert answer.status_code == 200
    assert answer.json["outcome"] == "resumes" and answer.json["accepted"] is True
    assert post(app, f"/signals/{RUN}/approval", keys.token()).json["outcome"] == "duplicate"
    (task,) = queue.tasks
    assert task.request.headers[protocol.RESUME_HEADER] == f"{RUN}:0:signal:approval"
    record = store.get(RUN)
    assert record is not None
    assert waits.waits_of(record).signals["approval"].payload_json == '{"ok":true}'


def test_callers_that_may_not_deliver_to_the_handler_may_not_signal_its_runs(
    worker: tuple[flask.Flask, StubQueue], keys: Keys, store: MemoryStore
) -> None:
    app, queue = worker
    assert post(app, f"/signals/{RUN}/approval", None).status_code == 401
    assert post(app, f"/signals/{RUN}/approval", keys.token(OTHER_SA)).status_code == 403
    # The handler's own allow-list decides for its runs: the worker's caller is refused there.
    assert post(app, f"/signals/{PRIVATE}/approval", keys.token()).status_code == 403
    assert post(app, f"/signals/{PRIVATE}/approval", keys.token(OTHER_SA)).status_code == 200
    # A run the store does not keep: a caller that is not allowed learns nothing of it.
    assert post(app, f"/signals/{'f' * 64}/approval", None).status_code == 401
    assert post(app, f"/signals/{'f' * 64}/approval", keys.token()).status_code == 404
    record = store.get(RUN)
    assert record is not None and waits.waits_of(record).signals == {}
    assert [task.request.headers[protocol.RESUME_HEADER][:64] for task in queue.tasks] == [PRIVATE]


def test_an_ended_run_and_bad_bodies_are_refused(
    worker: tuple[flask.Flask, StubQueue], keys: Keys
) -> None:
    app, queue = worker
    ended = post(app, f"/signals/{DONE}/approval", keys.token())
    assert ended.status_code == 409 and ended.json["accepted"] is False
    broken = post(app, f"/signals/{RUN}/approval", keys.token(), data=b"{not json")
    assert broken.status_code == 400 and "not JSON" in broken.json["message"]
    named = post(app, f"/signals/{RUN}/{'x' * 201}", keys.token())
    assert named.status_code == 400 and "at most 200" in named.json["message"]
    assert queue.tasks == []
