"""Queue-level httpTarget overrides: pure rules, then end to end over both transports."""

from __future__ import annotations

import base64

import pytest
from google.api_core import exceptions as api
from google.cloud import tasks_v2

from tasklease.emulator import CloudTasksEmulator
from tasklease.emulator.routing import override_url, route
from tests.support.emulator_target import Target

PARENT = "projects/p/locations/us-central1"
QUEUE = f"{PARENT}/queues/routed"
SA = "queue@p.iam.gserviceaccount.com"
IF_NOT_EXISTS = "IF_NOT_EXISTS"


@pytest.mark.parametrize(
    ("url", "override", "expected"),
    [
        ("https://a.example/x?q=1", {"host": "b.example"}, "https://b.example/x?q=1"),
        ("https://a.example/x", {"scheme": "HTTP", "port": "8080"}, "http://a.example:8080/x"),
        ("https://a.example:8443/x", {"port": "0"}, "https://a.example/x"),  # 0 clears it.
        ("https://a.example/x?q=1", {"pathOverride": {"path": "/y"}}, "https://a.example/y?q=1"),
        ("https://a.example/x?q=1", {"queryOverride": {}}, "https://a.example/x"),
        (
            "https://a.example/x",
            {
                "uriOverrideEnforceMode": "IF_NOT_EXISTS",
                "host": "b",
                "pathOverride": {"path": "/y"},
            },
            "https://a.example/x",  # The task has both: nothing is replaced.
        ),
        (
            "https://a.example/",
            {
                "uriOverrideEnforceMode": "IF_NOT_EXISTS",
                "pathOverride": {"path": "/y"},
                "port": "9",
            },
            "https://a.example:9/y",
        ),
    ],
)
def test_uri_override_replaces_the_parts_it_names(
    url: str, override: dict[str, object], expected: str
) -> None:
    assert override_url(url, override) == expected


def test_method_headers_and_token_of_the_queue_win_and_a_get_has_no_body() -> None:
    http = {
        "url": "https://a.example/x",
        "httpMethod": "POST",
        "headers": {"x-tenant": "task", "Content-Type": "application/json"},
        "body": base64.b64encode(b"{}").decode(),
        "oidcToken": {"serviceAccountEmail": "task@p.iam.gserviceaccount.com"},
    }
    target = {
        "httpMethod": "GET",
        "headerOverrides": [{"header": {"key": "X-Tenant", "value": "queue"}}],
        "oidcToken": {"serviceAccountEmail": SA, "audience": "https://aud.example"},
    }
    request = route(http, target)
    assert request.method == "GET" and request.body == b""
    assert request.headers == {"Content-Type": "application/json", "X-Tenant": "queue"}
    assert (request.service_account, request.audience) == (SA, "https://aud.example")
    plain = route(http, None)
    assert (plain.method, plain.body, plain.audience) == ("POST", b"{}", "https://a.example/x")


@pytest.mark.parametrize("transport", ["rest", "grpc"])
def test_a_queues_http_target_routes_its_tasks(
    emulator: CloudTasksEmulator, target: tuple[Target, str], transport: str
) -> None:
    recorder, url = target
    host_and_port = url.split("/")[2]
    client = emulator.client(transport)
    queue = tasks_v2.Queue(
        name=QUEUE,
        http_target=tasks_v2.HttpTarget(
            uri_override=tasks_v2.UriOverride(
                host=host_and_port.split(":")[0],
                port=int(host_and_port.split(":")[1]),
                path_override=tasks_v2.PathOverride(path="/tasks/hit"),
            ),
            header_overrides=[
                tasks_v2.HttpTarget.HeaderOverride(
                    header=tasks_v2.HttpTarget.Header(key="X-Route", value="queue")
                )
            ],
            oidc_token=tasks_v2.OidcToken(service_account_email=SA, audience="https://aud"),
        ),
    )
    created = client.create_queue(parent=PARENT, queue=queue)
    assert created.http_target.uri_override.path_override.path == "/tasks/hit"
    task = tasks_v2.Task(http_request=tasks_v2.HttpRequest(url="http://nowhere.invalid/elsewhere"))
    client.create_task(parent=QUEUE, task=task)
    emulator.join(timeout=10)
    [hit] = recorder.hits
    assert hit.headers["X-Route"] == "queue"
    assert hit.headers["Authorization"].startswith("Bearer ")


def test_a_queue_level_oidc_token_needs_an_audience(emulator: CloudTasksEmulator) -> None:
    queue = tasks_v2.Queue(
        name=QUEUE,
        http_target=tasks_v2.HttpTarget(oidc_token=tasks_v2.OidcToken(service_account_email=SA)),
    )
    with pytest.raises(api.BadRequest, match="audience"):
        emulator.client().create_queue(parent=PARENT, queue=queue)
