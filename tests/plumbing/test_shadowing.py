"""A user's project with its own worker.py, producer.py, emulator.py and deploy.py at its root
runs tasklease as any other project does: gunicorn from the Procfile, ``tasklease dev``,
``tasklease runs``, the pytest plugin and ``tasklease deploy --dry-run``, each a real process
started in that directory (which gunicorn, ``python -m`` and pytest put first on sys.path)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tasklease.plumbing.serve import free_port
from tasklease.producer import Producer
from tests.support.checkout import ROOT

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
SHADOWS = ("worker", "producer", "emulator", "deploy")
TASKS = """
import os
from pathlib import Path

from tasklease import Router, TaskContext

router = Router()


@router.task("record")
def record(payload: dict, ctx: TaskContext) -> dict:
    with Path(os.environ["EFFECTS"]).open("a") as effects:
        effects.write(f"{payload['n']}\\n")
    return {"recorded": payload["n"]}
"""
USER_TEST = """
from myapp.tasks import router
from tasklease import MemoryStore, create_app


def test_record_runs_once_under_duplicates(tasklease_queue, tmp_path, monkeypatch):
    monkeypatch.setenv("EFFECTS", str(tmp_path / "effects"))
    client = create_app(router, store=MemoryStore(), auth="none").test_client()
    tasklease_queue.producer.enqueue("record", {"n": 1}, key="one")
    tasklease_queue.drain(client, duplicate_every=1)
    assert (tmp_path / "effects").read_text() == "1\\n"
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The user's project: a module of each shadowing name, each failing loudly if imported."""
    source = tmp_path / "shop"
    (source / "myapp").mkdir(parents=True)
    (source / "tests").mkdir()
    for name in SHADOWS:
        (source / f"{name}.py").write_text(f"raise ImportError('the user\\'s own {name}.py')\n")
    (source / "myapp" / "__init__.py").write_text("")
    (source / "myapp" / "tasks.py").write_text(TASKS)
    (source / "tests" / "test_tasks.py").write_text(USER_TEST)
    (source / "pyproject.toml").write_text(
        '[project]\nname = "shop"\nversion = "1"\ndependencies = ["tasklease"]\n'
    )
    return source


def environment(project: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    return {
        **env,
        "PATH": f"{BIN}{os.pathsep}{env['PATH']}",
        "PYTHONPATH": "",
        "EFFECTS": str(project / "effects"),
        **extra,
    }


def wait_for(predicate: object, log: Path, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while not predicate():  # type: ignore[operator]
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def test_the_procfile_command_serves_the_users_router(project: Path) -> None:
    port = free_port()
    command = (ROOT / "Procfile").read_text().removeprefix("web:").strip()
    command = command.replace("--bind :$PORT", f"--bind 127.0.0.1:{port}")  # Loopback only.
    store = f"sqlite:///{project}/runs.db"
    env = environment(
        project,
        TASKLEASE_ROUTER="myapp.tasks:router",
        TASKLEASE_STORE=store,
        TASKLEASE_AUTH="none",
        WEB_CONCURRENCY="1",
    )
    log = project / "gunicorn.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            ["bash", "-c", f"exec {command}"],
            cwd=project,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        headers = {
            "X-CloudTasks-QueueName": "default",
            "X-CloudTasks-TaskName": "shadow-1",
            "X-CloudTasks-TaskRetryCount": "0",
            "X-CloudTasks-TaskExecutionCount": "0",
        }

        def answered() -> bool:
            try:
                url = f"http://127.0.0.1:{port}/tasks/record"
                return requests.post(url, json={"n": 5}, headers=headers, timeout=10).ok
            except requests.ConnectionError:
                return False

        wait_for(answered, log, process)
    finally:
        stop(process)
    assert (project / "effects").read_text() == "5\n"

    listed = subprocess.run(
        ["tasklease", "runs", "list", "--store", store],
        cwd=project,
        env=environment(project),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    assert "shadow-1" in listed.stdout and "completed" in listed.stdout


def test_the_dev_stack_runs_the_users_router(project: Path) -> None:
    ports = [free_port() for _ in range(4)]
    log = project / "dev.log"
    command = [
        "tasklease", "dev", "myapp.tasks:router",
        "--port", str(ports[0]), "--grpc-port", str(ports[1]), "--worker-port", str(ports[2]),
        "--dashboard-port", str(ports[3]), "--project", "p", "--workers", "1",
    ]  # fmt: skip
    with log.open("wb") as output:
        process = subprocess.Popen(
            command, cwd=project, env=environment(project), stdout=output, stderr=subprocess.STDOUT
        )
    try:
        wait_for(lambda: b"Enqueue from another shell" in log.read_bytes(), log, process)
        producer = Producer(
            "p",
            "us-central1",
            "default",
            f"http://127.0.0.1:{ports[2]}",
            "tasks@dev-project.iam.gserviceaccount.com",
            tasks_endpoint=f"http://127.0.0.1:{ports[0]}",
        )
        assert producer.enqueue("record", {"n": 7}, key="seven").created
        effects = project / "effects"
        wait_for(lambda: effects.exists() and effects.read_text() == "7\n", log, process)
    finally:
        stop(process)


def test_the_pytest_plugin_runs_the_users_tests(project: Path) -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=project,
        env=environment(project),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "1 passed" in ran.stdout


def test_deploy_plans_the_users_project(project: Path) -> None:
    env = environment(project)
    init = subprocess.run(
        ["tasklease", "deploy", "--init", "--project=acme-prod", "--router=myapp.tasks:router"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert init.returncode == 0, init.stderr
    planned = subprocess.run(
        ["tasklease", "deploy", "--dry-run"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert planned.returncode == 0, planned.stderr
    assert "gcloud run deploy" in planned.stdout
    assert "TASKLEASE_ROUTER=myapp.tasks:router" in planned.stdout
