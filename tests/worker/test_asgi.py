"""The worker as an ASGI app under a real uvicorn process on 127.0.0.1: every outcome the
WSGI path answers, sync and async handlers, the event loop free while deliveries block in
the store, and the worker mounted inside FastAPI under a prefix with OIDC on."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from pytest_httpserver import HTTPServer

from tasklease.plumbing.serve import GunicornWorker, free_port
from tasklease.worker.serving.asgi_routes import read_body
from tasklease.worker.serving.wsgi_routes import BadBody
from tests.support.helpers import job_headers, task_headers
from tests.worker.test_security import Keys

pytestmark = pytest.mark.service

SA = "tasks@p.iam.gserviceaccount.com"
OPS = "ops@p.iam.gserviceaccount.com"
LIMIT = 1000  # TASKLEASE_MAX_TASK_BYTES of the servers here.


def uvicorn(
    tmp_path: Path, factory: str | None = None, auth: str = "none", **env: str
) -> GunicornWorker:
    options: dict[str, Any] = {} if factory is None else {"asgi_factory": factory}
    return GunicornWorker(
        "tests.support.asgi_apps:router",
        store=f"sqlite:///{tmp_path}/runs.db",
        auth=auth,
        server="uvicorn",
        workers=1,
        env={"TEST_DIR": str(tmp_path), "TASKLEASE_MAX_TASK_BYTES": str(LIMIT), **env},
        log_path=tmp_path / "uvicorn.log",
        **options,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GunicornWorker]:
    folder = tmp_path_factory.mktemp("asgi")
    with uvicorn(folder) as running:
        running.folder = folder  # type: ignore[attr-defined]
        yield running


def post(
    url: str, name: str, body: Any = b'{"n": 1}', kind: str = "tasks", **headers: Any
) -> requests.Response:
    sent = task_headers(**headers) if kind == "tasks" else job_headers(**headers)
    return requests.post(f"{url}/{kind}/{name}", data=body, headers=sent, timeout=30)


def outcome(response: requests.Response) -> tuple[int, str]:
    return response.status_code, response.headers["X-Tasklease-Outcome"]


def executions(folder: Path) -> list[str]:
    log = folder / "executions.log"
    return log.read_text().splitlines() if log.exists() else []


def test_a_first_delivery_is_processed_and_a_retry_answered_as_a_duplicate(
    server: GunicornWorker,
) -> None:
    first = post(server.url, "record", task="t-dup")
    again = post(server.url, "record", task="t-dup", retry=1)
    assert outcome(first) == (200, "processed")
    assert first.json()["result"]["n"] == 1
    assert outcome(again) == (200, "duplicate")
    assert again.json()["run_id"] == first.json()["run_id"]
    lines = [line for line in executions(server.folder) if first.json()["run_id"] in line]  # type: ignore[attr-defined]
    assert len(lines) == 1


def test_a_retry_while_the_first_attempt_runs_is_answered_409_in_progress(
    server: GunicornWorker,
) -> None:
    folder: Path = server.folder  # type: ignore[attr-defined]
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(post, server.url, "hold", task="t-hold")
        deadline = time.monotonic() + 20
        while not any(line.startswith("hold ") for line in executions(folder)):
            assert time.monotonic() < deadline, "the handler never started"
            time.sleep(0.02)
        during = post(server.url, "hold", task="t-hold", retry=1)
        (folder / "go").touch()
        assert outcome(first.result()) == (200, "processed")
    assert outcome(during) == (409, "in_progress")
    assert "Retry-After" in during.headers


def test_a_permanent_failure_is_a_dead_letter_and_a_raise_is_released_for_a_retry(
    server: GunicornWorker,
) -> None:
    assert outcome(post(server.url, "refuse", task="t-refuse")) == (200, "failed")
    assert outcome(post(server.url, "flaky", task="t-flaky")) == (500, "released")
    retried = post(server.url, "flaky", task="t-flaky", retry=1)
    assert outcome(retried) == (200, "processed")
    assert retried.json()["result"] == "sent"


def test_on_memory_store_retries_are_answered_from_the_record_and_a_released_run_runs_again(
    tmp_path: Path,
) -> None:
    # MemoryStore with auth off: read in a delivery thread, as every store is.
    memory = GunicornWorker(
        "tests.support.asgi_apps:router",
        store="memory://",
        auth="none",
        server="uvicorn",
        workers=1,
        env={"TEST_DIR": str(tmp_path)},
        log_path=tmp_path / "uvicorn.log",
    )
    with memory:
        first = post(memory.url, "record", task="t-mem")
        again = post(memory.url, "record", task="t-mem", retry=1)
        released = post(memory.url, "flaky", task="t-mem-flaky")
        retried = post(memory.url, "flaky", task="t-mem-flaky", retry=1)
        settled = post(memory.url, "flaky", task="t-mem-flaky", retry=2)
        awaited = post(memory.url, "async_record", body=b'{"n": 4}', task="t-mem-async")
    assert outcome(first) == (200, "processed")
    assert outcome(again) == (200, "duplicate")
    assert again.content.endswith(first.content[first.content.index(b',"result":') :])
    assert again.headers["X-Tasklease-Run-Id"] == first.headers["X-Tasklease-Run-Id"]
    assert [outcome(r) for r in (released, retried, settled)] == [
        (500, "released"),
        (200, "processed"),
        (200, "duplicate"),
    ]
    assert awaited.json()["result"] == {"n": 4, "thread": "tasklease-handler-loop"}
    assert len(executions(tmp_path)) == 2  # record and async_record ran once; flaky does not log.
    log = (tmp_path / "uvicorn.log").read_text()
    assert log.count('"task record: already completed"') == 1


def test_a_body_that_is_not_json_is_a_dead_letter(server: GunicornWorker) -> None:
    answer = post(server.url, "record", body=b"{not json", task="t-json")
    assert outcome(answer) == (200, "failed")
    assert "payload is not valid JSON" in answer.json()["message"]


def test_unknown_handlers_other_methods_and_other_paths_are_refused(
    server: GunicornWorker,
) -> None:
    assert outcome(post(server.url, "no_such_handler", task="t-404")) == (404, "rejected")
    got = requests.get(f"{server.url}/tasks/record", headers=task_headers(), timeout=10)
    assert outcome(got) == (405, "rejected")
    assert got.headers["Allow"] == "POST"
    other = requests.get(f"{server.url}/elsewhere", timeout=10)
    assert outcome(other) == (404, "rejected")
    assert requests.get(f"{server.url}/healthz", timeout=10).json() == {"status": "ok"}


def test_a_body_over_the_limit_is_answered_413_sized_or_chunked(server: GunicornWorker) -> None:
    big = b'{"n": "' + b"x" * LIMIT + b'"}'
    sized = post(server.url, "record", body=big, task="t-big")
    chunked = post(server.url, "record", body=iter([big[:600], big[600:]]), task="t-big2")
    fits = post(server.url, "record", body=iter([b'{"n":', b" 2}"]), task="t-chunks")
    assert outcome(sized) == (413, "rejected")
    assert outcome(chunked) == (413, "rejected")
    assert outcome(fits) == (200, "processed")
    assert fits.json()["result"]["n"] == 2


def test_async_handlers_run_on_taskleases_handler_loop_with_every_outcome(
    server: GunicornWorker,
) -> None:
    done = post(server.url, "async_record", body=b'{"n": 3}', task="t-async")
    assert outcome(done) == (200, "processed")
    assert done.json()["result"] == {"n": 3, "thread": "tasklease-handler-loop"}
    assert outcome(post(server.url, "async_record", task="t-async", retry=1)) == (
        200,
        "duplicate",
    )
    assert outcome(post(server.url, "async_refuse", task="t-async-refuse")) == (200, "failed")
    job = post(server.url, "nightly", kind="jobs", body=b"")
    assert outcome(job) == (200, "processed")
    assert job.json()["result"] == "ran"


def test_the_log_line_has_the_same_fields_as_under_gunicorn(
    server: GunicornWorker, tmp_path: Path
) -> None:
    gunicorn = GunicornWorker(
        "tests.support.asgi_apps:router",
        store=f"sqlite:///{tmp_path}/runs.db",
        workers=1,
        env={"TEST_DIR": str(tmp_path)},
        log_path=tmp_path / "gunicorn.log",
    )
    with gunicorn:
        assert outcome(post(gunicorn.url, "record", task="t-log")) == (200, "processed")
    assert outcome(post(server.url, "record", task="t-log")) == (200, "processed")

    def line(log: Path) -> dict[str, Any]:
        for text in log.read_text().splitlines():
            if text.startswith("{") and '"task record: processed"' in text and "t-log" in text:
                return dict(json.loads(text))
        raise AssertionError(f"no log line in {log}")

    wsgi = line(tmp_path / "gunicorn.log")
    asgi = line(server.folder / "uvicorn.log")  # type: ignore[attr-defined]
    assert sorted(asgi) == sorted(wsgi)
    same = ("handler", "kind", "queue", "task_name", "outcome", "status", "attempt", "auth")
    assert {k: asgi.get(k) for k in same} == {k: wsgi.get(k) for k in same}


def test_the_loop_keeps_serving_while_twenty_deliveries_block_in_the_store(
    tmp_path: Path,
) -> None:
    claims = tmp_path / "claims.log"
    with (
        uvicorn(tmp_path, "tests.support.asgi_apps:blocking_app") as blocked,
        ThreadPoolExecutor(20) as pool,
    ):
        # Sync and async handlers alike: a store that may block is never called on the loop.
        names = ["record", "async_record"]
        sent = [pool.submit(post, blocked.url, names[n % 2], task=f"t-{n}") for n in range(20)]
        deadline = time.monotonic() + 20
        while len(claims.read_text().splitlines() if claims.exists() else []) < 20:
            assert time.monotonic() < deadline, "the deliveries never reached the store"
            time.sleep(0.02)
        health = requests.get(f"{blocked.url}/healthz", timeout=5)
        elsewhere = requests.get(f"{blocked.url}/elsewhere", timeout=5)
        still_blocked = [future.done() for future in sent]
        (tmp_path / "go").touch()
        answers = [future.result() for future in sent]
    assert health.json() == {"status": "ok"}
    assert elsewhere.status_code == 404
    assert not any(still_blocked)
    assert [outcome(answer) for answer in answers] == [(200, "processed")] * 20


def test_mounted_in_fastapi_under_a_prefix_it_takes_the_prefixed_audience_and_its_dashboard(
    tmp_path: Path, httpserver: HTTPServer
) -> None:
    keys = Keys(httpserver)
    app = uvicorn(
        tmp_path,
        "tests.support.asgi_apps:fastapi_app",
        auth="oidc",
        TASKLEASE_ALLOWED_SERVICE_ACCOUNTS=SA,
        TASKLEASE_OIDC_CERTS_URL=keys.url,
    )
    with app:
        target = f"{app.url}/worker/tasks/record"

        def deliver(task: str, token: str | None) -> requests.Response:
            headers = task_headers(task=task)
            if token is not None:
                headers["Authorization"] = f"Bearer {token}"
            return requests.post(target, data=b'{"n": 5}', headers=headers, timeout=30)

        processed = deliver("t-mounted", keys.token(aud=target))
        unprefixed = deliver("t-other", keys.token(aud=f"{app.url}/tasks/record"))
        stranger = deliver("t-other", keys.token(aud=target, email="x@p.iam.gserviceaccount.com"))
        anonymous = deliver("t-other", None)
        hello = requests.get(f"{app.url}/hello", timeout=10)
        health = requests.get(f"{app.url}/worker/healthz", timeout=10)
        unmounted = requests.post(f"{app.url}/tasks/record", headers=task_headers(), timeout=10)
        board = f"{app.url}/worker/tasklease/"
        operator = {"Authorization": f"Bearer {keys.token(aud=app.url, email=OPS)}"}
        page = requests.get(board, headers=operator, timeout=10)
        board_anonymous = requests.get(board, timeout=10)
    assert outcome(processed) == (200, "processed")
    assert processed.json()["result"]["n"] == 5
    assert outcome(unprefixed) == (401, "unauthenticated")
    assert outcome(stranger) == (403, "forbidden")
    assert outcome(anonymous) == (401, "unauthenticated")
    assert hello.json() == {"hello": "world"}
    assert health.json() == {"status": "ok"}
    assert unmounted.status_code == 404  # FastAPI's own answer: outside the mount.
    # The dashboard, a Flask app, is served under the mount too, its links with the prefix.
    assert page.status_code == 200, page.text
    assert 'href="/worker/tasklease/runs/' in page.text
    assert board_anonymous.status_code == 401
    assert [line.split()[0] for line in executions(tmp_path)] == ["record"]


@pytest.mark.parametrize(
    "target", [["tasklease.worker.asgi:app"], ["--factory", "tasklease.worker.asgi:app_from_env"]]
)
def test_uvicorns_own_command_serves_the_router_the_environment_names(
    tmp_path: Path, target: list[str]
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "TASKLEASE_ROUTER": "tests.support.asgi_apps:router",
        "TASKLEASE_STORE": f"sqlite:///{tmp_path}/runs.db",
        "TASKLEASE_AUTH": "none",
        "TEST_DIR": str(tmp_path),
    }
    command = [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port)]
    with (tmp_path / "log").open("wb") as log:
        process = subprocess.Popen([*command, *target], env=env, stdout=log, stderr=log)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                answer = post(url, "record", task="t-cli")
                break
            except requests.ConnectionError:
                assert process.poll() is None, (tmp_path / "log").read_text()
                assert time.monotonic() < deadline, "uvicorn never answered"
                time.sleep(0.1)
    finally:
        process.terminate()
        process.wait(timeout=20)
    assert outcome(answer) == (200, "processed")


def test_a_body_cut_short_is_refused_and_an_oversized_one_is_not_read() -> None:
    """The streaming reader itself: what uvicorn hands the app when the client goes away."""

    def messages(*sent: dict[str, Any]) -> Any:
        queue = list(sent)

        async def receive() -> dict[str, Any]:
            return queue.pop(0)

        return receive

    cut = messages({"type": "http.request", "body": b"abc", "more_body": True},
                   {"type": "http.disconnect"})  # fmt: skip
    with pytest.raises(BadBody, match="ended after 3 of its 10 bytes"):
        asyncio.run(read_body({"content-length": ["10"]}, cut, LIMIT))
    never_read = messages()  # Popping from it would raise: nothing may be received.
    assert asyncio.run(read_body({"content-length": [str(LIMIT + 1)]}, never_read, LIMIT)) is None
    with pytest.raises(BadBody, match="not a number"):
        asyncio.run(read_body({"content-length": ["1", "1"]}, messages(), LIMIT))
