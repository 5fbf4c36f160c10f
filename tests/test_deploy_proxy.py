"""deploy/deploy.py with proxy jobs: only the target's role for the worker, on the narrowest
resource, and commands the real gcloud parser accepts."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.test_deploy import EXAMPLE, Cloud

WORKER = "serviceAccount:tasklease-worker@my-project.iam.gserviceaccount.com"
PROXY_JOBS = """
[[job]]
name = "nightly_export"
schedule = "0 4 * * *"
[job.proxy]
workflow = "projects/data-project/locations/europe-west1/workflows/nightly-export"

[[job]]
name = "reindex"
schedule = "30 4 * * *"
[job.proxy]
run_job = "projects/my-project/locations/us-east1/jobs/reindex"

[[job]]
name = "release"
schedule = "0 5 * * 1"
[job.proxy]
build_trigger = "projects/my-project/locations/global/triggers/release-main"
"""


@pytest.fixture
def cloud(tmp_path: Path) -> Cloud:
    return Cloud(tmp_path)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "proxy.toml"
    path.write_text(EXAMPLE.read_text() + PROXY_JOBS)
    return path


def grants(cloud: Cloud) -> list[list[str]]:
    return [
        c for c in cloud.changes() if "add-iam-policy-binding" in c and f"--member={WORKER}" in c
    ]


def test_each_proxy_target_gets_only_its_role_on_its_narrowest_resource(
    cloud: Cloud, config: Path, tmp_path: Path
) -> None:
    (tmp_path / "base").mkdir()
    base = Cloud(tmp_path / "base")
    assert base.deploy().returncode == 0
    result = cloud.deploy(config=config)
    assert result.returncode == 0, result.stderr
    proxy = [c for c in grants(cloud) if c not in grants(base)]
    assert proxy == [
        [
            "projects",
            "add-iam-policy-binding",
            "data-project",
            f"--member={WORKER}",
            "--role=roles/workflows.invoker",
            "--condition=None",
        ],
        [
            "run",
            "jobs",
            "add-iam-policy-binding",
            "reindex",
            "--region=us-east1",
            "--project=my-project",
            f"--member={WORKER}",
            "--role=roles/run.jobsExecutorWithOverrides",
        ],
        [
            "run",
            "jobs",
            "add-iam-policy-binding",
            "reindex",
            "--region=us-east1",
            "--project=my-project",
            f"--member={WORKER}",
            "--role=roles/run.viewer",
        ],
        [
            "projects",
            "add-iam-policy-binding",
            "my-project",
            f"--member={WORKER}",
            "--role=roles/cloudbuild.builds.editor",
            "--condition=None",
        ],
    ]
    uris = [a for c in cloud.changes() for a in c if a.startswith("--uri=")]
    assert [u.rsplit("/", 2)[-2:] for u in uris][-3:] == [
        ["jobs", "nightly_export"],
        ["jobs", "reindex"],
        ["jobs", "release"],
    ]  # Scheduler calls the worker's proxy handlers, never *.googleapis.com.
    again = cloud.deploy(config=config)
    assert again.returncode == 0 and cloud.changes() == []


def test_teardown_removes_the_project_wide_proxy_grants(cloud: Cloud, config: Path) -> None:
    cloud.deploy(config=config)
    assert cloud.deploy("--teardown", config=config).returncode == 0
    removed = [
        next(a for a in c if a.startswith("--role="))
        for c in cloud.changes()
        if "remove-iam-policy-binding" in c
    ]
    assert removed == [
        "--role=roles/datastore.user",
        "--role=roles/workflows.invoker",
        "--role=roles/cloudbuild.builds.editor",
    ]


@pytest.mark.parametrize(
    ("proxy", "message"),
    [
        ('workflow = "workflows/w"', "proxy.workflow = "),
        ('run_job = "projects/my-project/locations/us-east1/jobs/Bad_Name"', "proxy.run_job = "),
        (
            'build_trigger = "projects/my-project/locations/global/triggers/t --impersonate=x"',
            "proxy.build_trigger = ",
        ),
        ('workflow = "projects/p/locations/l/jobs/j"', "proxy.workflow = "),
        ('service = "projects/my-project/locations/l/services/s"', "exactly one of"),
        ('workflow = "a"\nrun_job = "b"', "exactly one of"),
    ],
)
def test_a_proxy_target_that_is_not_a_resource_name_is_refused_before_any_call(
    cloud: Cloud, tmp_path: Path, proxy: str, message: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        EXAMPLE.read_text()
        + f'\n[[job]]\nname = "x"\nschedule = "0 4 * * *"\n[job.proxy]\n{proxy}\n'
    )
    result = cloud.deploy(config=path)
    assert result.returncode == 2
    assert message in result.stderr
    assert cloud.calls() == []


PARSER_REJECTIONS = ("unrecognized arguments", "Invalid value", "Invalid choice", "argument ")


def test_the_real_gcloud_parses_every_proxy_command(
    cloud: Cloud, config: Path, tmp_path: Path
) -> None:
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        if os.environ.get("CI") == "true":
            pytest.fail("gcloud is required in CI")
        pytest.skip("gcloud is not installed")
    result = cloud.deploy("--dry-run", config=config)
    assert result.returncode == 0, result.stderr
    base = set(cloud.deploy("--dry-run").stdout.splitlines())
    lines = sorted(
        {
            line
            for line in result.stdout.splitlines()
            if line not in base and "scheduler" not in line
        }
    )
    commands = [shlex.split(line.removeprefix("# check: "))[1:] for line in lines]
    # Grants of 4 roles; look-ups of data-project's policy and the job's (my-project's is not new).
    assert len(commands) == 6, lines
    # gcloud parses, then fails on the connection: a closed proxy port, no credentials.
    settings = tmp_path / "gcloud-config"
    env = {**os.environ, "CLOUDSDK_CONFIG": str(settings)}
    for key, value in [
        ("proxy/type", "http"),
        ("proxy/address", "127.0.0.1"),
        ("proxy/port", "9"),
        ("auth/disable_credentials", "true"),
        ("core/disable_usage_reporting", "true"),
    ]:
        subprocess.run(
            [gcloud, "config", "set", key, value, "-q"], env=env, capture_output=True, check=False
        )

    def parse(command: list[str]) -> str:
        done = subprocess.run(
            [gcloud, *command], env=env, capture_output=True, text=True, timeout=120, check=False
        )
        return done.stderr

    with ThreadPoolExecutor(len(commands)) as pool:
        errors = list(pool.map(parse, commands))
    for command, stderr in zip(commands, errors, strict=True):
        assert not any(marker in stderr for marker in PARSER_REJECTIONS), (command, stderr)
        assert stderr, command  # It did fail: on the connection, after parsing.
