"""tasklease/deploy/deploy.py with proxy jobs: only the target's role for the worker, on the
narrowest resource (tests/deploy/test_deploy_proxy_gcloud.py puts the commands before the real
gcloud)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.test_deploy import EXAMPLE, Cloud, user_config, user_project

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


LIBRARIES = '"tasklease", "google-cloud-workflows", "google-cloud-run", "google-cloud-build"'


@pytest.fixture
def source(tmp_path: Path) -> str:
    """A user project whose dependencies install the three targets' client libraries."""
    return f"--source={user_project(tmp_path, LIBRARIES)}"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "proxy.toml"
    path.write_text(user_config(tmp_path).read_text() + PROXY_JOBS)
    return path


def grants(cloud: Cloud) -> list[list[str]]:
    return [
        c for c in cloud.changes() if "add-iam-policy-binding" in c and f"--member={WORKER}" in c
    ]


def test_each_proxy_target_gets_only_its_role_on_its_narrowest_resource(
    cloud: Cloud, config: Path, source: str, tmp_path: Path
) -> None:
    (tmp_path / "base").mkdir()
    base = Cloud(tmp_path / "base")
    assert base.deploy(source, config=user_config(tmp_path)).returncode == 0
    result = cloud.deploy(source, config=config)
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
    again = cloud.deploy(source, config=config)
    assert again.returncode == 0 and cloud.changes() == []


def test_teardown_removes_the_project_wide_proxy_grants(
    cloud: Cloud, config: Path, source: str
) -> None:
    cloud.deploy(source, config=config)
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


def test_a_source_without_a_targets_client_library_is_refused(
    cloud: Cloud, config: Path, tmp_path: Path
) -> None:
    source = user_project(tmp_path, '"tasklease", "google-cloud-run"')
    result = cloud.deploy(f"--source={source}", config=config)
    assert result.returncode == 2
    assert "does not install google-cloud-build, google-cloud-workflows" in result.stderr
    assert "no extras" in result.stderr
    assert cloud.changes() == []
