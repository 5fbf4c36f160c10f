"""Authentication by default, and hostile or broken requests that change nothing.

Tokens are real RS256 ID tokens signed with a test key; the worker verifies them through
google-auth's own code, fetching the public keys from a local server.
"""

from __future__ import annotations

import base64
import json
import socket
import time
from typing import Any

import flask
import pytest
from google.auth import jwt
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pytest_httpserver import HTTPServer

from tasklease.emulator.oidc import TokenIssuer
from tasklease.worker import ConfigurationError, OidcAuth, Router, TaskContext, create_app
from tasklease.worker.auth.authenticators import UNAUTHENTICATED
from tasklease.worker.stores import MemoryStore
from tests.support.helpers import job_headers, task_headers

SA = "tasks@p.iam.gserviceaccount.com"
OTHER_SA = "intruder@p.iam.gserviceaccount.com"
ROOT = "http://localhost"  # The worker's configured audience: its root URL.
AUDIENCE = "http://localhost/tasks/send_receipt"


class Keys:
    """A signing key whose certificate a local server publishes, Google-style."""

    def __init__(self, server: HTTPServer) -> None:
        self.issuer = TokenIssuer()
        self.server = server
        server.expect_request("/certs").respond_with_json(
            self.issuer.certs(), headers={"Cache-Control": "public, max-age=3600"}
        )
        self.url = server.url_for("/certs")

    def token(self, **claims: Any) -> str:
        now = int(time.time())
        payload = {
            "iss": "https://accounts.google.com",
            "aud": AUDIENCE,
            "email": SA,
            "email_verified": True,
            "iat": now,
            "exp": now + 600,
            "sub": "1",
        }
        payload.update(claims)
        payload = {k: v for k, v in payload.items() if v is not None}
        signer = self.issuer._signer
        return jwt.encode(signer, payload).decode()  # type: ignore[no-untyped-call,no-any-return]


@pytest.fixture
def keys(httpserver: HTTPServer) -> Keys:
    return Keys(httpserver)


@pytest.fixture
def runs() -> list[str]:
    return []


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def app(keys: Keys, runs: list[str], store: MemoryStore) -> flask.Flask:
    router = Router()

    @router.task("send_receipt")
    def send_receipt(payload: Any, ctx: TaskContext) -> None:
        runs.append(ctx.run_id)

    @router.scheduled("nightly", allowed_service_accounts=["scheduler@p.iam.gserviceaccount.com"])
    def nightly(ctx: TaskContext) -> None:
        runs.append(ctx.run_id)

    return create_app(router, store=store, auth=OidcAuth([SA], audience=ROOT, certs_url=keys.url))


def post(
    app: flask.Flask,
    token: str | None,
    headers: dict[str, str] | None = None,
    path: str = "/tasks/send_receipt",
    data: bytes = b'{"order_id": 1}',
    **kw: Any,
) -> Any:
    sent = dict(task_headers() if headers is None else headers)
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    return app.test_client().post(path, headers=sent, data=data, **kw)


def assert_refused(response: Any, status: int, runs: list[str], store: MemoryStore) -> None:
    assert response.status_code == status, response.json
    assert runs == []
    assert store.list_runs() == []


def test_valid_token_from_an_allowed_service_account_runs(
    app: flask.Flask, keys: Keys, runs: list[str]
) -> None:
    response = post(app, keys.token())
    assert response.status_code == 200
    assert len(runs) == 1


def test_root_url_audience_is_accepted_like_cloud_run(
    app: flask.Flask, keys: Keys, runs: list[str]
) -> None:
    assert post(app, keys.token(aud="http://localhost")).status_code == 200


def test_token_for_another_service_replayed_with_a_spoofed_host_is_refused(
    app: flask.Flask, keys: Keys, runs: list[str], store: MemoryStore
) -> None:
    for audience in ("https://billing.example.com/", "https://billing.example.com"):
        spoofed = {
            **task_headers(),
            "Host": "billing.example.com",
            "X-Forwarded-Proto": "https",
        }
        assert_refused(post(app, keys.token(aud=audience), spoofed), 401, runs, store)


def test_forwarded_scheme_does_not_change_the_expected_audience(
    app: flask.Flask, keys: Keys
) -> None:
    token = keys.token(aud="https://localhost/tasks/send_receipt")
    headers = {**task_headers(), "X-Forwarded-Proto": "https"}
    assert post(app, token, headers).status_code == 401


QUERY = "project=shop-prod&location=europe-west1"


def test_the_default_audience_with_the_query_string_the_delivery_carries_is_accepted(
    app: flask.Flask, keys: Keys, runs: list[str]
) -> None:
    """Cloud Tasks' and Scheduler's default audience is the target's whole URL, query included:
    project and location passed as query parameters must not make every delivery a 401."""
    token = keys.token(aud=f"{AUDIENCE}?{QUERY}")
    response = post(app, token, path=f"/tasks/send_receipt?{QUERY}")
    assert response.status_code == 200, response.json
    assert len(runs) == 1


@pytest.mark.parametrize(
    ("audience", "path"),
    [
        (f"{AUDIENCE}?{QUERY}", "/tasks/send_receipt?project=other&location=europe-west1"),
        (f"{AUDIENCE}?{QUERY}", "/tasks/send_receipt"),
        (f"{AUDIENCE}?{QUERY}", f"/tasks/send_receipt?{QUERY}&extra=1"),
        (f"http://localhost/jobs/nightly?{QUERY}", f"/tasks/send_receipt?{QUERY}"),
        (f"https://billing.example.com/tasks/send_receipt?{QUERY}", f"/tasks/send_receipt?{QUERY}"),
    ],
    ids=["other-query", "no-query", "longer-query", "other-path", "other-service"],
)
def test_a_token_with_a_query_string_is_accepted_only_for_the_exact_url_it_was_minted_for(
    app: flask.Flask, keys: Keys, runs: list[str], store: MemoryStore, audience: str, path: str
) -> None:
    assert_refused(post(app, keys.token(aud=audience), path=path), 401, runs, store)


def test_a_401_answer_names_no_configured_audience_and_the_log_line_says_why(
    app: flask.Flask, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="tasklease")
    response = post(app, keys.token(aud="https://another-service.a.run.app"))
    assert response.status_code == 401
    assert response.json["message"] == UNAUTHENTICATED
    assert "localhost" not in response.get_data(as_text=True)  # Nor "expected one of [...]".
    [line] = [r for r in caplog.records if r.name == "tasklease.execution"]
    assert "another-service" in line.tasklease["auth_error"]  # type: ignore[attr-defined]
    assert "localhost" not in line.getMessage()


def test_an_unauthenticated_request_does_not_put_its_log_line_in_the_callers_trace(
    app: flask.Flask, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="tasklease")
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    traced = {**task_headers(), "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    assert post(app, None, traced).status_code == 401
    assert post(app, keys.token(), traced).status_code == 200  # Authenticated: joins it.
    refused, allowed = [
        r.tasklease  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == "tasklease.execution"
    ]
    assert trace_id not in json.dumps(refused)
    assert allowed["logging.googleapis.com/trace"].endswith(trace_id)


def test_oidc_without_an_audience_refuses_to_start_naming_the_variable(
    keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TASKLEASE_AUDIENCE", raising=False)
    monkeypatch.setenv("TASKLEASE_ALLOWED_SERVICE_ACCOUNTS", SA)
    router = Router()
    router.task("t")(lambda payload, ctx: None)
    with pytest.raises(ConfigurationError, match="TASKLEASE_AUDIENCE"):
        create_app(router, store="memory://", auth=OidcAuth([SA], certs_url=keys.url))
    with pytest.raises(ConfigurationError, match="TASKLEASE_AUDIENCE"):
        create_app(router, store="memory://", auth="oidc")


def test_audience_from_the_environment_argument_or_every_handler_satisfies_startup(
    keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TASKLEASE_AUDIENCE", raising=False)
    monkeypatch.setenv("TASKLEASE_ALLOWED_SERVICE_ACCOUNTS", SA)
    monkeypatch.setenv("TASKLEASE_OIDC_CERTS_URL", keys.url)
    router = Router()
    router.task("send_receipt")(lambda payload, ctx: None)
    app = create_app(router, store="memory://", auth="oidc", audience=ROOT)
    assert post(app, keys.token()).status_code == 200
    per_handler = Router()
    per_handler.task("send_receipt", audience="https://svc.example/x")(lambda payload, ctx: None)
    app = create_app(per_handler, store="memory://", auth="oidc")
    assert post(app, keys.token(aud="https://svc.example/x")).status_code == 200
    assert post(app, keys.token()).status_code == 401
    monkeypatch.setenv("TASKLEASE_AUDIENCE", ROOT)
    assert post(create_app(router, store="memory://"), keys.token()).status_code == 200


@pytest.mark.parametrize(
    ("claims", "status", "reason"),
    [
        ({}, 401, "missing Authorization"),
        ({"exp": int(time.time()) - 3600, "iat": int(time.time()) - 7200}, 401, "invalid ID token"),
        ({"aud": "https://another-service.a.run.app"}, 401, "wrong audience"),
        ({"iss": "https://evil.example.com"}, 401, "issuer"),
        ({"email": OTHER_SA}, 403, f"{OTHER_SA} may not call"),
        ({"email_verified": False}, 403, "no verified email"),
        ({"email": None}, 403, "no verified email"),
    ],
)
def test_bad_tokens_are_refused_and_nothing_is_claimed(
    app: flask.Flask,
    keys: Keys,
    runs: list[str],
    store: MemoryStore,
    claims: dict[str, Any],
    status: int,
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="tasklease")
    token = None if not claims else keys.token(**claims)
    response = post(app, token)
    assert_refused(response, status, runs, store)
    assert response.headers["X-Tasklease-Outcome"] in ("unauthenticated", "forbidden")
    if status == 401:  # The answer says nothing more; the log line says why.
        assert response.json["message"] == UNAUTHENTICATED
        [line] = [r for r in caplog.records if r.name == "tasklease.execution"]
        assert reason in line.tasklease["auth_error"]  # type: ignore[attr-defined]
    else:
        assert reason in response.json["message"]


def test_forged_cloud_tasks_headers_without_a_token_are_refused(
    app: flask.Flask, runs: list[str], store: MemoryStore
) -> None:
    assert_refused(post(app, None), 401, runs, store)
    assert_refused(post(app, "not-a-jwt"), 401, runs, store)
    assert_refused(
        post(app, None, {**task_headers(), "Authorization": "Basic dXNlcjpwYXNz"}), 401, runs, store
    )


def test_token_signed_by_an_unknown_key_is_refused(
    app: flask.Flask, runs: list[str], store: MemoryStore
) -> None:
    stranger = TokenIssuer()
    forged = stranger.mint(SA, AUDIENCE)
    assert_refused(post(app, forged), 401, runs, store)


def test_token_with_a_tampered_payload_is_refused(
    app: flask.Flask, keys: Keys, runs: list[str], store: MemoryStore
) -> None:
    header, _, signature = keys.token(email=OTHER_SA).split(".")
    claims = json.loads(base64.urlsafe_b64decode(keys.token().split(".")[1] + "=="))
    payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    assert_refused(post(app, f"{header}.{payload}.{signature}"), 401, runs, store)


def test_handler_allow_list_overrides_the_app_wide_one(
    app: flask.Flask, keys: Keys, runs: list[str]
) -> None:
    token = keys.token(aud="http://localhost/jobs/nightly")
    assert post(app, token, job_headers(), path="/jobs/nightly").status_code == 403
    scheduler = keys.token(
        aud="http://localhost/jobs/nightly", email="scheduler@p.iam.gserviceaccount.com"
    )
    assert post(app, scheduler, job_headers(), path="/jobs/nightly").status_code == 200


def test_public_keys_are_fetched_once_not_per_request(app: flask.Flask, keys: Keys) -> None:
    for n in range(5):
        assert post(app, keys.token(), task_headers(task=f"t{n}")).status_code == 200
    assert len([r for r, _ in keys.server.log if r.path == "/certs"]) == 1


def test_key_server_down_is_503_and_nothing_runs(runs: list[str], store: MemoryStore) -> None:
    router = Router()
    router.task("send_receipt")(lambda payload, ctx: runs.append("ran"))
    auth = OidcAuth([SA], audience=ROOT, certs_url="http://127.0.0.1:9/certs")
    app = create_app(router, store=store, auth=auth)
    response = post(app, TokenIssuer().mint(SA, AUDIENCE))
    assert_refused(response, 503, runs, store)
    assert response.headers["Retry-After"]


def test_failed_key_fetches_are_remembered_so_junk_tokens_do_not_hammer_the_key_server(
    httpserver: HTTPServer, runs: list[str], store: MemoryStore
) -> None:
    httpserver.expect_request("/certs").respond_with_data("down", status=500)
    router = Router()
    router.task("send_receipt")(lambda payload, ctx: runs.append("ran"))
    auth = OidcAuth([SA], audience=ROOT, certs_url=httpserver.url_for("/certs"))
    app = create_app(router, store=store, auth=auth)
    junk = TokenIssuer().mint(SA, AUDIENCE)  # One key: making one per request takes seconds.
    for n in range(20):
        response = post(app, junk, task_headers(task=f"t{n}"))
        assert_refused(response, 503, runs, store)
        assert int(response.headers["Retry-After"]) > 0
    assert len([r for r, _ in httpserver.log if r.path == "/certs"]) == 1


def test_a_hanging_key_server_is_given_up_on_within_seconds(
    runs: list[str], store: MemoryStore
) -> None:
    with socket.socket() as silent:  # Accepts connections (the backlog), never answers.
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/certs"
        router = Router()
        router.task("send_receipt")(lambda payload, ctx: runs.append("ran"))
        app = create_app(router, store=store, auth=OidcAuth([SA], audience=ROOT, certs_url=url))
        token = TokenIssuer().mint(SA, AUDIENCE)
        started = time.monotonic()
        assert_refused(post(app, token), 503, runs, store)
        assert 2.5 < time.monotonic() - started < 10  # The 3 s read timeout, not 120 s.
        started = time.monotonic()
        assert_refused(post(app, token, task_headers(task="t2")), 503, runs, store)
        assert time.monotonic() - started < 2  # Remembered: no second 3 s wait.


@pytest.mark.parametrize(
    "url",
    [
        "http://keys.example.com/certs",
        "http://127.0.0.1.attacker.example/certs",
        "ftp://127.0.0.1/certs",
        "/certs",
    ],
)
def test_keys_over_plain_http_are_refused_unless_from_loopback(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigurationError, match="TASKLEASE_OIDC_CERTS_URL"):
        OidcAuth([SA], audience=ROOT, certs_url=url)
    monkeypatch.setenv("TASKLEASE_OIDC_CERTS_URL", url)
    with pytest.raises(ConfigurationError, match="TASKLEASE_OIDC_CERTS_URL"):
        OidcAuth.from_env()


@pytest.mark.parametrize(
    "url",
    [
        "https://keys.example.com/certs",
        "http://127.0.0.1:8123/oauth2/v1/certs",
        "http://localhost:8123/certs",
        "http://[::1]:8123/certs",
    ],
)
def test_keys_over_https_or_from_loopback_are_accepted(url: str) -> None:
    assert OidcAuth([SA], audience=ROOT, certs_url=url).certs_url == url


def test_tokens_that_are_not_jwts_are_refused_without_fetching_keys(
    app: flask.Flask, keys: Keys, runs: list[str], store: MemoryStore
) -> None:
    for junk in ("not-a-jwt", "a.b", "a.b.c.d", "é.b.c", "a." + "b" * 20_000 + ".c"):
        assert_refused(post(app, junk), 401, runs, store)
    assert [r for r, _ in keys.server.log if r.path == "/certs"] == []


def test_log_line_says_why_without_echoing_the_token(
    app: flask.Flask, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="tasklease")
    secret = keys.token(email=OTHER_SA)
    post(app, secret)
    post(app, "garbage." + secret.split(".")[1] + ".sig")
    lines = [r for r in caplog.records if r.name == "tasklease.execution"]
    assert [r.tasklease["outcome"] for r in lines] == ["forbidden", "unauthenticated"]  # type: ignore[attr-defined]
    text = " ".join(r.getMessage() + json.dumps(r.tasklease) for r in lines)  # type: ignore[attr-defined]
    assert secret not in text
    assert secret.split(".")[1] not in text


def test_oidc_is_the_default_and_refuses_to_start_unconfigured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TASKLEASE_AUTH", raising=False)
    monkeypatch.delenv("TASKLEASE_ALLOWED_SERVICE_ACCOUNTS", raising=False)
    monkeypatch.setenv("TASKLEASE_AUDIENCE", ROOT)
    router = Router()
    router.task("t")(lambda payload, ctx: None)
    with pytest.raises(ConfigurationError, match="TASKLEASE_ALLOWED_SERVICE_ACCOUNTS"):
        create_app(router, store="memory://")
    monkeypatch.setenv("TASKLEASE_ALLOWED_SERVICE_ACCOUNTS", SA)
    app = create_app(router, store="memory://")
    assert post(app, None, path="/tasks/t").status_code == 401


@pytest.mark.parametrize("mode", ["basic", "off", "false", " none", "none ", "no ne", "non\u0435"])
def test_unknown_auth_mode_is_a_configuration_error(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigurationError, match="unknown auth"):
        create_app(Router(), store="memory://", auth=mode)
    monkeypatch.setenv("TASKLEASE_AUTH", mode)
    with pytest.raises(ConfigurationError, match="unknown auth"):
        create_app(Router(), store="memory://")


@pytest.mark.parametrize("mode", ["none", "None", "NONE"])
def test_auth_none_is_accepted_in_any_case_and_every_log_line_says_so(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="tasklease")
    router = Router()
    router.task("send_receipt")(lambda payload, ctx: None)
    client = create_app(router, store="memory://", auth=mode).test_client()
    client.post("/tasks/send_receipt", headers=task_headers(), data=b"{}")
    client.post("/tasks/send_receipt", headers={}, data=b"{}")
    client.post("/tasks/nothing", headers=task_headers(), data=b"{}")
    lines = [r for r in caplog.records if r.name in ("tasklease.execution", "tasklease.app")]
    assert len(lines) == 4
    assert all(r.tasklease.get("auth") == "none" for r in lines)  # type: ignore[attr-defined]


# Hostile input from an authenticated caller: still refused, still nothing claimed.


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        (task_headers(retry=-1), 400),
        ({**task_headers(), "X-CloudTasks-TaskRetryCount": "1e3"}, 400),
        ({**task_headers(), "X-CloudTasks-TaskExecutionCount": "NaN"}, 400),
        (task_headers(task="../../etc/passwd"), 400),
        (task_headers(task="tâche"), 400),
        (task_headers(task="x" * 501), 400),
        (task_headers(task="x" * 10_240), 400),
        ({**task_headers(), "X-CloudTasks-QueueName": "q" * 10_240}, 400),
        ({**task_headers(), "X-CloudTasks-TaskETA": "-1"}, 400),
        ({**task_headers(), "X-CloudTasks-TaskETA": "inf"}, 400),
    ],
)
def test_malformed_task_headers_are_400(
    app: flask.Flask,
    keys: Keys,
    runs: list[str],
    store: MemoryStore,
    headers: dict[str, str],
    status: int,
) -> None:
    response = post(app, keys.token(), headers)
    assert_refused(response, status, runs, store)
    assert response.headers["X-Tasklease-Outcome"] == "rejected"


def test_duplicated_identity_headers_with_conflicting_values_are_400(
    app: flask.Flask, keys: Keys, runs: list[str], store: MemoryStore
) -> None:
    headers = [(k, v) for k, v in task_headers().items()] + [("X-CloudTasks-TaskName", "other")]
    headers.append(("Authorization", f"Bearer {keys.token()}"))
    response = app.test_client().post("/tasks/send_receipt", headers=headers, data=b"{}")
    assert_refused(response, 400, runs, store)


@pytest.mark.parametrize(
    "schedule_time",
    [
        "tomorrow",
        "2026-10-16T12:00:00",
        "0001-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
        "2026-10-16T25:00:00Z",
        "2026-10-16T12:00:00+99:00",
        "2026-10-16T12:00:00Z\x00",
        "9999-12-31T23:59:59-23:59",  # Past datetime.max once in UTC: OverflowError.
        "0001-01-01T00:00:00+23:59",
    ],
)
def test_malformed_or_absurd_schedule_times_are_400(
    app: flask.Flask, keys: Keys, runs: list[str], store: MemoryStore, schedule_time: str
) -> None:
    token = keys.token(
        aud="http://localhost/jobs/nightly", email="scheduler@p.iam.gserviceaccount.com"
    )
    response = post(app, token, job_headers(schedule_time=schedule_time), path="/jobs/nightly")
    assert_refused(response, 400, runs, store)


@pytest.mark.parametrize(
    "path",
    [
        "/tasks/../jobs/nightly",
        "/tasks/%2e%2e%2fjobs%2fnightly",
        "/tasks/send_rec%C3%A9ipt",
        "/tasks/send\u0440eceipt",
        "/tasks/send_receipt%00",
        "/tasks/SEND_RECEIPT",
        "/tasks/",
    ],
)
def test_handler_names_with_traversal_or_unicode_tricks_are_404(
    app: flask.Flask, keys: Keys, runs: list[str], store: MemoryStore, path: str
) -> None:
    response = post(app, keys.token(aud="http://localhost"), path=path)
    assert_refused(response, 404, runs, store)


def test_oversized_body_is_413_before_authentication(
    app: flask.Flask, runs: list[str], store: MemoryStore
) -> None:
    assert_refused(post(app, None, data=b"x" * (1024 * 1024 + 1)), 413, runs, store)


def test_wrong_method_is_405_and_claims_nothing(
    app: flask.Flask, keys: Keys, runs: list[str], store: MemoryStore
) -> None:
    response = app.test_client().get(
        "/tasks/send_receipt", headers={**task_headers(), "Authorization": f"Bearer {keys.token()}"}
    )
    assert_refused(response, 405, runs, store)


header_names = st.sampled_from(
    [
        "X-CloudTasks-QueueName",
        "X-CloudTasks-TaskName",
        "X-CloudTasks-TaskRetryCount",
        "X-CloudTasks-TaskExecutionCount",
        "X-CloudTasks-TaskETA",
        "X-CloudTasks-TaskPreviousResponse",
        "X-CloudTasks-TaskRetryReason",
        "X-CloudScheduler-JobName",
        "X-CloudScheduler-ScheduleTime",
        "X-Tasklease-Project",
        "X-Tasklease-Location",
    ]
)
header_values = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=600)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    headers=st.dictionaries(header_names, header_values, max_size=11),
    body=st.binary(max_size=2000),
    path=st.sampled_from(["/tasks/send_receipt", "/jobs/nightly"]),
)
def test_random_headers_and_bodies_never_500_and_never_claim_without_identity(
    headers: dict[str, str], body: bytes, path: str
) -> None:
    runs: list[str] = []
    store = MemoryStore()
    router = Router()
    router.task("send_receipt")(lambda payload, ctx: runs.append("task"))
    router.scheduled("nightly")(lambda ctx: runs.append("job"))
    app = create_app(router, store=store, auth="none")
    response = app.test_client().post(path, headers=headers, data=body)
    assert response.status_code in (200, 400), response.json
    if response.status_code == 400:
        assert store.list_runs() == [] and runs == []
    else:
        kind = "task" if path.startswith("/tasks") else "job"
        required = (
            ["X-CloudTasks-QueueName", "X-CloudTasks-TaskName"]
            if kind == "task"
            else ["X-CloudScheduler-JobName", "X-CloudScheduler-ScheduleTime"]
        )
        assert all(headers.get(name, "").strip() for name in required)
        assert len(store.list_runs()) == 1
