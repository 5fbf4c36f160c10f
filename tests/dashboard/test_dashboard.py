"""The dashboard through Flask's test client: pages, CSRF, release and replay, and its auth
when mounted in the worker (the browser test is tests/dashboard/test_dashboard_browser.py)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import flask
import pytest
from flask.testing import FlaskClient
from pytest_httpserver import HTTPServer

from tasklease.errors import ConfigurationError
from tasklease.jobs import Job
from tasklease.producer import MemoryTransport, Producer
from tasklease.testing.operations_contract import seed_every_state
from tasklease.worker import OidcAuth, Router, TaskContext, create_app
from tasklease.worker.core.records import RunStatus
from tasklease.worker.dashboard import CSRF_COOKIE, create_dashboard_app
from tasklease.worker.stores import MemoryStore
from tests.worker.test_security import ROOT, SA, Keys

OPERATOR = "ops@p.iam.gserviceaccount.com"


@pytest.fixture
def store() -> MemoryStore:
    store = MemoryStore()
    seed_every_state(store, datetime.now(UTC) - timedelta(hours=1))
    return store


@pytest.fixture
def queue() -> MemoryTransport:
    return MemoryTransport()


@pytest.fixture
def client(store: MemoryStore, queue: MemoryTransport) -> FlaskClient:
    producer = Producer("p", "l", "q", "https://w.example", transport=queue)
    client = create_dashboard_app(store, producer=producer).test_client()
    client.environ_base["HTTP_ORIGIN"] = "http://localhost"  # What a browser sends on a POST.
    return client


def form(
    client: FlaskClient, run_id: str, action: str, prefix: str = "", **headers: str
) -> dict[str, str]:
    """Open the confirmation page; return its form's hidden fields (the client keeps the
    cookie)."""
    page = client.get(f"{prefix}/runs/{run_id}/{action}", headers=headers)
    assert page.status_code == 200, page.text
    return dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page.text))


def confirm(client: FlaskClient, run_id: str, action: str, **headers: str) -> str:
    """Open the confirmation page; return its CSRF token (the client keeps the cookie)."""
    return form(client, run_id, action, **headers)["csrf_token"]


def test_the_list_shows_every_state_and_highlights_the_stuck_run(client: FlaskClient) -> None:
    page = client.get("/")
    assert page.status_code == 200
    for status in RunStatus:
        assert f'class="status {status.value}"' in page.text or status is RunStatus.IN_PROGRESS
    assert page.text.count('<tr class="stuck">') == 1
    assert "t-stuck" in page.text and "· stuck" in page.text
    assert 'class="stuck">1</span>' in page.text  # The header's stuck count.
    assert page.headers["Content-Security-Policy"].startswith("default-src 'none'")


def test_filters_narrow_the_list(client: FlaskClient) -> None:
    page = client.get("/?status=failed")
    assert "t-failed" in page.text and "t-completed" not in page.text
    page = client.get("/?trigger=manual")
    assert page.text.count("run-link") == 1
    page = client.get("/?older_than=58m30s")
    assert page.text.count("run-link") == 4
    page = client.get("/?stuck=1")
    assert page.text.count("run-link") == 1 and "t-stuck" in page.text
    assert client.get("/?older_than=soon").status_code == 400
    page = client.get("/?limit=2")
    assert page.text.count("run-link") == 2 and 'id="next"' in page.text


def test_a_run_shows_its_details(client: FlaskClient) -> None:
    page = client.get("/runs/failed")
    assert page.status_code == 200
    assert "PermanentFailure: bad" in page.text
    assert 'id="fencing">1<' in page.text
    assert 'id="replay"' in page.text and 'id="release"' not in page.text
    assert client.get("/runs/nope").status_code == 404


def test_release_needs_the_csrf_token_and_force_for_a_live_lease(
    client: FlaskClient, store: MemoryStore
) -> None:
    assert client.post("/runs/live/release").status_code == 403
    fields = form(client, "live", "release")
    token = fields["csrf_token"]
    assert fields["force"] == "1"
    assert client.post("/runs/live/release", data={"csrf_token": "x" * 43}).status_code == 403
    unforced = {**fields, "force": ""}
    refused = client.post("/runs/live/release", data=unforced)
    assert refused.status_code == 409 and "live until" in refused.text
    assert store.get("live").status is RunStatus.IN_PROGRESS  # type: ignore[union-attr]
    released = client.post("/runs/live/release", data=fields)
    assert released.status_code == 200 and "holder is fenced out" in released.text
    record = store.get("live")
    assert record is not None
    assert (record.status, record.fencing_token) == (RunStatus.RELEASED, 2)
    other_site = client.post(
        "/runs/stuck/release",
        data={"csrf_token": token},
        headers={"Origin": "https://evil.example"},
    )
    assert other_site.status_code == 403


def test_replay_from_the_page_enqueues_once(
    client: FlaskClient, store: MemoryStore, queue: MemoryTransport
) -> None:
    token = confirm(client, "failed", "replay")
    first = client.post("/runs/failed/replay", data={"csrf_token": token})
    assert first.status_code == 200 and "Replay enqueued as task" in first.text
    second = client.post("/runs/failed/replay", data={"csrf_token": token})
    assert "Already replayed: pending as run" in second.text and "nothing enqueued" in second.text
    assert len(queue.tasks) == 1
    assert store.get("failed").replayed_as  # type: ignore[union-attr]
    refused = client.post("/runs/completed/replay", data={"csrf_token": token})
    assert refused.status_code == 409


def test_the_csrf_cookie_is_strict_and_http_only(client: FlaskClient) -> None:
    response = client.get("/runs/live/release")
    cookie = response.headers["Set-Cookie"]
    assert cookie.startswith(f"{CSRF_COOKIE}=")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert "Secure" not in cookie
    client.delete_cookie(CSRF_COOKIE)
    proxied = client.get("/runs/stuck/release", headers={"X-Forwarded-Proto": "https"})
    assert "Secure" in proxied.headers["Set-Cookie"]  # Cloud Run: https before the proxy.


# --- Mounted in the worker ---------------------------------------------------------------


def worker_app(keys: Keys, store: MemoryStore, **options: Any) -> flask.Flask:
    router = Router()

    @router.task("send_receipt")
    def send_receipt(payload: Any, ctx: TaskContext) -> None:
        pass

    auth = OidcAuth([SA], audience=ROOT, certs_url=keys.url)
    return create_app(router, store=store, auth=auth, **options)


@pytest.fixture
def keys(httpserver: HTTPServer) -> Keys:
    return Keys(httpserver)


def bearer(keys: Keys, email: str, audience: str = ROOT) -> dict[str, str]:
    return {"Authorization": f"Bearer {keys.token(email=email, aud=audience)}"}


def test_the_dashboard_is_off_unless_asked_for(keys: Keys, store: MemoryStore) -> None:
    client = worker_app(keys, store).test_client()
    assert client.get("/tasklease/", headers=bearer(keys, SA)).status_code == 404


def test_mounted_it_takes_its_operators_tokens_only(keys: Keys, store: MemoryStore) -> None:
    app = worker_app(keys, store, dashboard="/tasklease", dashboard_operators=[OPERATOR])
    client = app.test_client()
    anonymous = client.get("/tasklease/")
    assert anonymous.status_code == 401
    assert anonymous.headers["WWW-Authenticate"].startswith("Bearer")
    assert "t-failed" not in anonymous.text
    assert client.get("/tasklease/", headers=bearer(keys, SA)).status_code == 403
    wrong_audience = bearer(keys, OPERATOR, "https://other.example")
    assert client.get("/tasklease/", headers=wrong_audience).status_code == 401
    page = client.get("/tasklease/?status=failed", headers=bearer(keys, OPERATOR))
    assert page.status_code == 200 and "t-failed" in page.text
    assert 'href="/tasklease/runs/failed"' in page.text
    assert client.get("/healthz").status_code == 200


def test_mounted_with_operators_only_they_get_in_and_posts_need_csrf(
    keys: Keys, store: MemoryStore
) -> None:
    app = worker_app(keys, store, dashboard="/tasklease", dashboard_operators=[OPERATOR])
    client = app.test_client()
    assert client.get("/tasklease/", headers=bearer(keys, SA)).status_code == 403
    operator = bearer(keys, OPERATOR)
    page = client.get("/tasklease/runs/live/release", headers=operator)
    assert "Path=/tasklease/" in page.headers["Set-Cookie"]
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    client.environ_base["HTTP_ORIGIN"] = "http://localhost"
    assert client.post("/tasklease/runs/stuck/release", headers=operator).status_code == 403
    fields = form(client, "stuck", "release", "/tasklease", **operator) | {"csrf_token": token}
    denied = client.post("/tasklease/runs/stuck/release", data=fields)
    assert denied.status_code == 401  # The token is no login: the bearer token still is.
    done = client.post("/tasklease/runs/stuck/release", data=fields, headers=operator)
    assert done.status_code == 200
    assert store.get("stuck").status is RunStatus.RELEASED  # type: ignore[union-attr]


def test_operators_without_oidc_refuse_to_start(store: MemoryStore) -> None:
    with pytest.raises(ConfigurationError, match="OIDC"):
        create_app(
            Router(), store=store, auth="none", dashboard="/tasklease", dashboard_operators=["a"]
        )
    with pytest.raises(ConfigurationError, match="prefix"):
        create_app(Router(), store=store, auth="none", dashboard="/tasks")


def test_the_stuck_page_shows_crashed_runs_and_jobs_behind_their_schedule(
    store: MemoryStore,
) -> None:
    schedules = [Job("nightly", "*/5 * * * *")]
    page = create_dashboard_app(store, schedules=schedules).test_client().get("/stuck")
    assert page.status_code == 200
    assert page.text.count('<tr class="stuck">') == 2  # The crashed attempt, and the job.
    assert "t-stuck" in page.text
    assert "nightly" in page.text and "none on record" in page.text  # Manual runs do not count.
    unconfigured = create_dashboard_app(store).test_client().get("/stuck")
    assert "No schedules configured" in unconfigured.text
