"""The dev stack cannot be driven from a web page.

A page open in the developer's browser can POST ``text/plain`` to 127.0.0.1 without a CORS
preflight, and DNS rebinding lets it send any request under its own host name. Either way it
could create tasks and have the emulator mint OIDC tokens for any account and audience.
"""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import pytest
import requests

from tasklease.emulator import CloudTasksEmulator

QUEUE = "projects/p/locations/us-central1/queues/q"
TASK = {"task": {"httpRequest": {"url": "http://127.0.0.1:9/x", "oidcToken": {
    "serviceAccountEmail": "admin@p.iam.gserviceaccount.com", "audience": "https://bank.example"
}}}}  # fmt: skip


def raw_request(url: str, method: str, path: str, headers: dict[str, str], body: bytes) -> int:
    """Send a request exactly as given (requests would normalise the Host header)."""
    parts = urlsplit(url)
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items())]
    lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    with socket.create_connection((parts.hostname, parts.port), timeout=5) as connection:
        connection.sendall("\r\n".join(lines).encode() + body)
        answer = connection.makefile("rb").readline()
    return int(answer.split()[1])


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "text/plain; charset=utf-8", "application/x-www-form-urlencoded",
     "multipart/form-data; boundary=x", "application/jsonp"],
)  # fmt: skip
def test_a_post_a_web_page_can_send_without_preflight_creates_no_task(
    emulator: CloudTasksEmulator, content_type: str | None
) -> None:
    emulator.create_queue(QUEUE)
    headers = {"Content-Type": content_type} if content_type else {}
    response = requests.post(
        f"{emulator.url}/v2/{QUEUE}/tasks", data=json.dumps(TASK), headers=headers, timeout=5
    )
    assert response.status_code == 415
    assert response.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert emulator.db.count_tasks(QUEUE) == 0


@pytest.mark.parametrize("verb", ["pause", "purge"])
def test_other_post_calls_need_json_too(emulator: CloudTasksEmulator, verb: str) -> None:
    emulator.create_queue(QUEUE)
    response = requests.post(f"{emulator.url}/v2/{QUEUE}:{verb}", data=b"{}", timeout=5)
    assert response.status_code == 415
    queue = emulator.db.get_queue(QUEUE)
    assert queue is not None
    assert queue["state"] == "RUNNING"
    assert "purgeTime" not in queue


def test_a_delete_without_content_type_is_served_as_gcloud_sends_it(
    emulator: CloudTasksEmulator,
) -> None:
    # Browsers preflight every cross-origin DELETE; gcloud sends it with no content type.
    emulator.create_queue(QUEUE)
    assert requests.delete(f"{emulator.url}/v2/{QUEUE}", timeout=5).status_code == 200


@pytest.mark.parametrize(
    "host",
    ["attacker.example", "attacker.example:8123", "127.0.0.1.attacker.example", "localhost.",
     "0.0.0.0", "[::ffff:127.0.0.1]:1", "", "127.0.0.1 evil"],
)  # fmt: skip
def test_requests_under_a_foreign_host_name_are_refused_like_dns_rebinding(
    emulator: CloudTasksEmulator, host: str
) -> None:
    emulator.create_queue(QUEUE)
    body = json.dumps(TASK).encode()
    headers = {"Host": host, "Content-Type": "application/json"}
    assert raw_request(emulator.url, "POST", f"/v2/{QUEUE}/tasks", headers, body) in (400, 403)
    assert raw_request(emulator.url, "GET", f"/v2/{QUEUE}/tasks", headers, b"") in (400, 403)
    assert emulator.db.count_tasks(QUEUE) == 0


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost", "LocalHost", "[::1]"])
def test_loopback_host_names_with_or_without_a_port_are_served(
    emulator: CloudTasksEmulator, name: str
) -> None:
    port = urlsplit(emulator.url).port
    for host in (name, f"{name}:{port}"):
        headers = {"Host": host}
        assert raw_request(emulator.url, "GET", "/oauth2/v1/certs", headers, b"") == 200


def test_a_configured_host_name_is_served() -> None:
    with CloudTasksEmulator(allowed_hosts=["tasks.internal"]) as emulator:
        headers = {"Host": "tasks.internal"}
        assert raw_request(emulator.url, "GET", "/oauth2/v1/certs", headers, b"") == 200
        headers = {"Host": "other.internal"}
        assert raw_request(emulator.url, "GET", "/oauth2/v1/certs", headers, b"") == 403


def test_the_emulators_keys_are_served_with_cache_control_max_age(
    emulator: CloudTasksEmulator,
) -> None:
    response = requests.get(emulator.certs_url, timeout=5)
    assert "max-age=" in response.headers["Cache-Control"]
