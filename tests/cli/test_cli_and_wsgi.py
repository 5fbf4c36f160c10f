"""The command line (scheduler run, dev stack) and the WSGI entry point."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import flask
import pytest
import requests

from tasklease.cli import main
from tasklease.demo.ledger import Ledger
from tasklease.emulator import CloudTasksEmulator
from tasklease.emulator.scheduler import Job
from tasklease.errors import ConfigurationError
from tasklease.plumbing.serve import free_port
from tasklease.producer import Producer
from tasklease.worker.serving.router_reference import load_router
from tasklease.worker.wsgi import app_from_env
from tests.support.emulator_target import Target
from tests.support.helpers import task_headers


def test_scheduler_run_triggers_a_job_through_the_emulator(
    target: tuple[Target, str], capsys: pytest.CaptureFixture[str]
) -> None:
    recorder, url = target
    job = Job(name="nightly", schedule="0 3 * * *", url=url)
    with CloudTasksEmulator(jobs=[job], scheduler_on_schedule=False) as emulator:
        assert main(["scheduler", "run", "nightly", "--emulator", emulator.url]) == 0
        assert emulator.scheduler.join(timeout=10)
        assert main(["scheduler", "run", "missing", "--emulator", emulator.url]) == 1
    assert len(recorder.hits) == 1
    captured = capsys.readouterr()
    assert (
        captured.out == "job nightly triggered: the emulator delivers its run to the worker now\n"
    )
    assert captured.err == (
        "tasklease scheduler: no job 'missing' in the emulator; the jobs are: nightly\n"
    )


def test_scheduler_run_without_an_emulator_says_what_to_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    assert main(["scheduler", "run", "nightly", "--emulator", nobody]) == 1
    assert f"no emulator answers on {nobody}: start tasklease dev" in capsys.readouterr().err


def test_wsgi_builds_the_app_for_the_router_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TASKLEASE_ROUTER", "tests.support.apps:router")
    monkeypatch.setenv("TASKLEASE_STORE", "memory://")
    monkeypatch.setenv("TASKLEASE_AUTH", "none")
    app = app_from_env()
    assert isinstance(app, flask.Flask)
    answer = app.test_client().post("/tasks/no_such_handler", headers=task_headers())
    assert (answer.status_code, answer.headers["X-Tasklease-Outcome"]) == (404, "rejected")
    assert app.test_client().get("/healthz").json == {"status": "ok"}


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("tests.support.apps", "module:attribute"),
        (
            "tests.support.apps:missing",
            "module tests.support.apps found, but it has no attribute 'missing'",
        ),
        (":router", "module:attribute"),
    ],
)
def test_wsgi_refuses_a_bad_router_reference(reference: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        load_router(reference)


def test_wsgi_without_a_router_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TASKLEASE_ROUTER", raising=False)
    with pytest.raises(ConfigurationError, match="TASKLEASE_ROUTER"):
        app_from_env()


def test_dev_stack_runs_emulator_and_worker_with_oidc_end_to_end(tmp_path: Path) -> None:
    emulator_port, worker_port, dashboard_port = free_port(), free_port(), free_port()
    grpc_port = free_port()  # Not the default (--port + 1): that one may be taken.
    env = {**os.environ, "TEST_LEDGER": str(tmp_path / "ledger.db")}
    command = [
        sys.executable,
        "-m",
        "tasklease.cli",
        "dev",
        "tests.support.apps:router",
        "--port",
        str(emulator_port),
        "--worker-port",
        str(worker_port),
        "--grpc-port",
        str(grpc_port),
        "--data-dir",
        str(tmp_path / "emulator"),
        "--store",
        f"sqlite:///{tmp_path}/runs.db",
        "--project",
        "p",
        "--queue",
        "default",
        "--dashboard-port",
        str(dashboard_port),
    ]
    with (tmp_path / "dev.log").open("wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while b"Enqueue from another shell" not in (tmp_path / "dev.log").read_bytes():
            assert process.poll() is None, (tmp_path / "dev.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "dev.log").read_text()
            time.sleep(0.1)
        producer = Producer(
            "p",
            "us-central1",
            "default",
            f"http://127.0.0.1:{worker_port}",
            "tasks@dev-project.iam.gserviceaccount.com",
            tasks_endpoint=f"http://127.0.0.1:{emulator_port}",
        )
        assert producer.enqueue("record", {"n": 7}, key="seven").created
        ledger = Ledger(tmp_path / "ledger.db")
        while not ledger.path.exists() or not ledger.counts():
            assert time.monotonic() < deadline, (tmp_path / "dev.log").read_text()
            time.sleep(0.1)
        assert dict(ledger.counts()) == {"record:7": 1}
        forged = requests.post(
            f"http://127.0.0.1:{worker_port}/tasks/record",
            json={"n": 8},
            headers={"X-CloudTasks-QueueName": "default", "X-CloudTasks-TaskName": "forged"},
            timeout=10,
        )
        assert forged.status_code == 401  # The dev stack runs with authentication on.
        dashboard = f"http://127.0.0.1:{dashboard_port}/"
        assert (
            f"Dashboard (runs, stuck, release, replay): {dashboard}"
            in (tmp_path / "dev.log").read_text()
        )
        page = requests.get(dashboard, params={"status": "completed"}, timeout=10)
        assert page.status_code == 200
        assert "record" in page.text and "completed" in page.text
    finally:
        process.terminate()
        process.wait(timeout=20)
