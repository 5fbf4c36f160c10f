"""``server = "uvicorn"`` in tasklease.toml: the Procfile the deploy kit writes serves
tasklease.worker.asgi, the source must install tasklease[asgi], and the command runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tasklease.deploy.source import UVICORN_PROCFILE
from tasklease.plumbing.serve import free_port
from tests.deploy.test_deploy import Cloud, user_config, user_project


@pytest.fixture
def cloud(tmp_path: Path) -> Cloud:
    return Cloud(tmp_path)


def uvicorn_config(tmp_path: Path, server: str = "uvicorn") -> Path:
    config = user_config(tmp_path)
    config.write_text(config.read_text().replace("[worker]\n", f'[worker]\nserver = "{server}"\n'))
    return config


def test_the_dry_run_plans_a_uvicorn_procfile_and_its_thread_count(
    cloud: Cloud, tmp_path: Path
) -> None:
    source = user_project(tmp_path, '"tasklease[asgi]>=0.1"')
    result = cloud.deploy("--dry-run", f"--source={source}", config=uvicorn_config(tmp_path))
    assert result.returncode == 0, result.stderr
    planned = f"# would write {source / 'Procfile'}: {UVICORN_PROCFILE.strip()}"
    assert planned in result.stdout
    assert "tasklease.worker.asgi_serve tasklease.worker.asgi:app_from_env" in planned
    assert "--port $PORT --workers ${WEB_CONCURRENCY:-2}" in planned
    assert "TASKLEASE_ASGI_THREADS=8" in result.stdout
    assert not (source / "Procfile").exists()


def test_a_deploy_writes_the_uvicorn_procfile(cloud: Cloud, tmp_path: Path) -> None:
    source = user_project(tmp_path, '"flask", "tasklease[otel, asgi]"')
    result = cloud.deploy(f"--source={source}", config=uvicorn_config(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (source / "Procfile").read_text() == UVICORN_PROCFILE


@pytest.mark.parametrize(
    "requirements", ["tasklease[asgi]>=0.1\n", "tasklease[asgi] @ git+https://x.test/t@v1\n"]
)
def test_requirements_with_the_asgi_extra_are_enough(
    cloud: Cloud, tmp_path: Path, requirements: str
) -> None:
    source = user_project(tmp_path, requirements__txt=requirements)
    result = cloud.deploy("--dry-run", f"--source={source}", config=uvicorn_config(tmp_path))
    assert result.returncode == 0, result.stderr


def test_a_source_without_the_asgi_extra_is_refused_before_any_gcloud_call(
    cloud: Cloud, tmp_path: Path
) -> None:
    source = user_project(tmp_path, '"tasklease"')
    result = cloud.deploy("--dry-run", f"--source={source}", config=uvicorn_config(tmp_path))
    assert result.returncode != 0
    assert "does not install uvicorn, anyio" in result.stderr
    assert "tasklease[asgi]" in result.stderr
    assert cloud.changes() == []


def test_an_unknown_server_is_refused(cloud: Cloud, tmp_path: Path) -> None:
    source = user_project(tmp_path, '"tasklease[asgi]"')
    result = cloud.deploy(
        "--dry-run", f"--source={source}", config=uvicorn_config(tmp_path, "hypercorn")
    )
    assert result.returncode != 0
    assert "worker.server = 'hypercorn'" in result.stderr


def test_the_uvicorn_procfile_command_serves_the_worker(tmp_path: Path) -> None:
    port = free_port()
    command = re.sub(r"^web: ", "", UVICORN_PROCFILE.strip()) + " --host 127.0.0.1"
    env = {
        **os.environ,
        "PORT": str(port),
        "WEB_CONCURRENCY": "2",
        "TASKLEASE_ROUTER": "tasklease.demo.shop:router",
        "TASKLEASE_STORE": f"sqlite:///{tmp_path}/runs.db",
        "TASKLEASE_AUTH": "none",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    with (tmp_path / "log").open("wb") as log:
        process = subprocess.Popen(
            ["bash", "-c", f"exec {command}"], env=env, stdout=log, stderr=log
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                health = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except requests.ConnectionError:
                assert process.poll() is None, (tmp_path / "log").read_text()
                assert time.monotonic() < deadline, "uvicorn never answered"
                time.sleep(0.1)
    finally:
        process.terminate()
        process.wait(timeout=20)
    assert health.json() == {"status": "ok"}
