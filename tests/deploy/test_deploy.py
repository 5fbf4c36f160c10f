"""tasklease/deploy/deploy.py against a stub gcloud that records its calls and keeps what it
creates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasklease.deploy.config import load_config
from tasklease.worker.stores.firestore import fan_ins
from tasklease.worker.stores.firestore.store import FirestoreStore

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tasklease" / "deploy" / "deploy.py"
STUB = ROOT / "tests" / "services" / "stub_gcloud.py"
EXAMPLE = ROOT / "tasklease" / "deploy" / "tasklease.toml"
INVOKER = "tasklease-invoker@my-project.iam.gserviceaccount.com"

MUTATING = (
    "create",
    "update",
    "enable",
    "deploy",
    "add-iam-policy-binding",
    "delete",
    "remove-iam-policy-binding",
)


class Cloud:
    """A directory with a `gcloud` on PATH that logs to calls.jsonl and keeps state.json."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        gcloud = bin_dir / "gcloud"
        gcloud.write_text(
            f"#!{sys.executable}\nimport runpy, sys\n"
            f"sys.argv[0] = {str(STUB)!r}\nrunpy.run_path({str(STUB)!r}, run_name='__main__')\n"
        )
        gcloud.chmod(0o755)
        self.log = tmp / "calls.jsonl"
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "STUB_GCLOUD_LOG": str(self.log),
            "STUB_GCLOUD_STATE": str(tmp / "state.json"),
        }

    def deploy(self, *args: str, config: Path = EXAMPLE) -> subprocess.CompletedProcess[str]:
        self.log.unlink(missing_ok=True)
        return subprocess.run(
            [sys.executable, str(SCRIPT), f"--config={config}", *args],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def changes(self) -> list[list[str]]:
        return [call for call in self.calls() if any(word in MUTATING for word in call[:5])]


@pytest.fixture
def cloud(tmp_path: Path) -> Cloud:
    return Cloud(tmp_path)


def test_first_run_sets_up_everything_in_order(cloud: Cloud) -> None:
    result = cloud.deploy()
    assert result.returncode == 0, result.stderr
    heads = [" ".join([w for w in call if not w.startswith("--")][:4]) for call in cloud.changes()]
    assert heads == [
        "services enable run.googleapis.com cloudbuild.googleapis.com",
        "firestore databases create",
        "firestore fields ttls update",
        "firestore fields ttls update",
        "firestore fields ttls update",
        "firestore fields ttls update",
        "firestore fields ttls update",
        "firestore fields ttls update",
        "firestore indexes composite create",
        "firestore indexes composite create",
        "iam service-accounts create tasklease-worker",
        "iam service-accounts create tasklease-invoker",
        "projects add-iam-policy-binding my-project",
        "tasks queues create default",
        "tasks queues add-iam-policy-binding default",
        "iam service-accounts add-iam-policy-binding " + INVOKER,
        "run deploy tasklease-worker",
        "run services add-iam-policy-binding tasklease-worker",
        "scheduler jobs create http",
    ]


def test_exact_commands_for_the_worker_queue_and_job(cloud: Cloud) -> None:
    cloud.deploy()
    changes = cloud.changes()
    [deploy] = [c for c in changes if c[:2] == ["run", "deploy"]]
    assert "--no-allow-unauthenticated" in deploy
    assert "--service-account=tasklease-worker@my-project.iam.gserviceaccount.com" in deploy
    assert "--timeout=900" in deploy and "--concurrency=16" in deploy
    env = next(a for a in deploy if a.startswith("--set-env-vars=^|^"))[len("--set-env-vars=^|^") :]
    variables = dict(pair.split("=", 1) for pair in env.split("|"))
    url = "https://tasklease-worker-123456789.us-central1.run.app"
    assert (
        variables["TASKLEASE_STORE"] == "firestore://?collection=tasklease_runs&database=(default)"
    )
    assert (
        variables["TASKLEASE_ALLOWED_SERVICE_ACCOUNTS"]
        == "tasklease-invoker@my-project.iam.gserviceaccount.com"
    )
    assert variables["TASKLEASE_AUDIENCE"] == url == variables["TASKLEASE_WORKER_URL"]
    assert variables["TASKLEASE_DISPATCH_DEADLINE"] == "600"
    [queue] = [c for c in changes if c[:3] == ["tasks", "queues", "create"]]
    assert queue == [
        "tasks",
        "queues",
        "create",
        "default",
        "--location=us-central1",
        "--max-attempts=100",
        "--max-retry-duration=0s",
        "--min-backoff=0.1s",
        "--max-backoff=3600s",
        "--max-doublings=16",
        "--max-dispatches-per-second=500",
        "--max-concurrent-dispatches=1000",
        "--project=my-project",
    ]
    [job] = [c for c in changes if c[:3] == ["scheduler", "jobs", "create"]]
    assert "--schedule=0 3 * * *" in job
    assert f"--uri={url}/jobs/nightly_reports" in job
    assert (
        "--oidc-service-account-email=tasklease-invoker@my-project.iam.gserviceaccount.com" in job
    )
    assert f"--oidc-token-audience={url}" in job
    assert "--attempt-deadline=180s" in job and "--max-retry-attempts=3" in job


def test_second_run_changes_nothing(cloud: Cloud) -> None:
    assert cloud.deploy().returncode == 0
    second = cloud.deploy()
    assert second.returncode == 0, second.stderr
    assert cloud.changes() == []
    assert "up to date" in second.stdout


def test_a_changed_setting_updates_only_that_resource(cloud: Cloud, tmp_path: Path) -> None:
    cloud.deploy()
    config = tmp_path / "changed.toml"
    config.write_text(EXAMPLE.read_text().replace("max_attempts = 100", "max_attempts = 20"))
    assert cloud.deploy(config=config).returncode == 0
    assert [c[:4] for c in cloud.changes()] == [["tasks", "queues", "update", "default"]]


def test_no_role_is_granted_project_wide_where_a_resource_grant_exists(cloud: Cloud) -> None:
    cloud.deploy()
    grants = [c for c in cloud.changes() if "add-iam-policy-binding" in c]
    project_roles = [
        next(a for a in c if a.startswith("--role=")) for c in grants if c[0] == "projects"
    ]
    assert project_roles == ["--role=roles/datastore.user"]  # Firestore has no narrower resource.

    def scope(role: str) -> list[str]:
        return [" ".join(c[:2]) for c in grants if f"--role={role}" in c]

    assert scope("roles/run.invoker") == ["run services"]
    assert scope("roles/cloudtasks.enqueuer") == ["tasks queues"]
    assert scope("roles/iam.serviceAccountUser") == ["iam service-accounts"]
    [act_as] = [c for c in grants if "--role=roles/iam.serviceAccountUser" in c]
    assert act_as[3] == "tasklease-invoker@my-project.iam.gserviceaccount.com"


def test_dry_run_prints_every_command_and_calls_nothing(cloud: Cloud) -> None:
    result = cloud.deploy("--dry-run")
    assert result.returncode == 0, result.stderr
    assert cloud.calls() == []
    printed = [line for line in result.stdout.splitlines() if line.startswith("gcloud ")]
    # Six TTL policies (runs, locks, tally, and the joins' roots, shards and entries), two indexes.
    assert len(printed) == 19
    assert printed[0].startswith("gcloud services enable")
    assert printed[-1].startswith("gcloud scheduler jobs create http nightly_reports")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ("dispatch_deadline = 600", "dispatch_deadline = 1200"),
            "longer than worker.request_timeout",
        ),
        (
            ("dispatch_deadline = 600", "dispatch_deadline = 5"),
            "dispatch_deadline must be 15 to 1800",
        ),
        (("gunicorn_timeout = 0", "gunicorn_timeout = 60"), "would kill a request"),
        (("attempt_deadline = 180", "attempt_deadline = 1000"), "attempt_deadline is longer"),
        (("lease = 300", "lease = 5"), "lease must be at least 30"),
        (
            ("max_retry_duration = 0", "max_retry_duration = 1000000"),
            "outlives worker.retention_days",
        ),
        (('schedule = "0 3 * * *"', 'schedule = "every 5 minutes"'), "unix-cron"),
        (('schedule = "0 3 * * *"', 'schedule = "0 0 31 2 *"'), "never fires"),
        (("attempt_deadline = 180", "attempt_deadline = 5"), "job nightly_reports: attempt_dead"),
        (("retry_count = 3", "retry_count = 9"), "job nightly_reports: retry.retry_count must"),
        (("[job.retry]\n", "retry_count = 1\n[job.retry]\n"), "it belongs in [job.retry]"),
        (
            ('time_zone = "Etc/UTC"', 'time_zone = "Etc/UTC"\nurl = "http://127.0.0.1/"'),
            "job nightly_reports: url: not applied by a deploy",
        ),
        (
            ("max_dispatches_per_second = 500", "max_dispatches_per_second = 501"),
            "max_dispatches_per_second",
        ),
    ],
)
def test_inconsistent_settings_are_refused_with_a_message_before_any_call(
    cloud: Cloud, tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(EXAMPLE.read_text().replace(*change))
    result = cloud.deploy(config=config)
    assert result.returncode == 2
    assert message in result.stderr
    assert cloud.calls() == []


def test_teardown_deletes_what_deploy_created_and_keeps_the_data(cloud: Cloud) -> None:
    cloud.deploy()
    result = cloud.deploy("--teardown")
    assert result.returncode == 0, result.stderr
    deleted = [" ".join(c[:3]) for c in cloud.changes() if "delete" in c]
    assert deleted == [
        "scheduler jobs delete",
        "tasks queues delete",
        "run services delete",
        "iam service-accounts delete",
        "iam service-accounts delete",
    ]
    assert "kept: the Firestore database" in result.stdout
    again = cloud.deploy("--teardown")
    assert [c for c in cloud.changes() if "delete" in c] == []
    assert again.returncode == 0


def test_a_failing_gcloud_call_stops_with_its_error(cloud: Cloud, tmp_path: Path) -> None:
    broken = tmp_path / "bin" / "gcloud"
    broken.write_text(
        "#!/bin/sh\necho 'ERROR: (gcloud) PERMISSION_DENIED: caller lacks access' >&2\nexit 1\n"
    )
    result = cloud.deploy()
    assert result.returncode == 2
    assert "PERMISSION_DENIED" in result.stderr


# The source the worker is built from: checked before any gcloud call.


def user_project(tmp_path: Path, dependencies: str = '"tasklease"', **files: str) -> Path:
    """A user's app in its own directory: a pyproject, a router module, and ``files``."""
    source = tmp_path / "userapp"
    (source / "myapp").mkdir(parents=True)
    (source / "myapp" / "__init__.py").write_text("")
    (source / "myapp" / "tasks.py").write_text(
        "from tasklease.worker import Router\nrouter = Router()\n"
        'router.scheduled("nightly_reports")(lambda ctx: None)\n'
    )
    (source / "pyproject.toml").write_text(
        f'[project]\nname = "myapp"\nversion = "1"\ndependencies = [{dependencies}]\n'
    )
    for name, text in files.items():
        (source / name.replace("__", ".")).write_text(text)
    return source


def user_config(tmp_path: Path) -> Path:
    config = tmp_path / "user.toml"
    config.write_text(
        EXAMPLE.read_text().replace('"tasklease.demo.shop:router"', '"myapp.tasks:router"')
    )
    return config


def test_the_checkout_itself_installs_what_the_worker_needs(cloud: Cloud) -> None:
    result = cloud.deploy("--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"--source={ROOT}" in result.stdout


def test_a_user_project_deploys_from_its_own_source(cloud: Cloud, tmp_path: Path) -> None:
    source = user_project(tmp_path)
    result = cloud.deploy(f"--source={source}", config=user_config(tmp_path))
    assert result.returncode == 0, result.stderr
    [deploy] = [c for c in cloud.changes() if c[:2] == ["run", "deploy"]]
    assert f"--source={source}" in deploy
    assert "TASKLEASE_ROUTER=myapp.tasks:router" in next(
        a for a in deploy if a.startswith("--set-env-vars=")
    )
    assert (source / "Procfile").read_text().startswith("web: gunicorn --bind :$PORT")
    assert "'tasklease.worker.wsgi:app'" in (source / "Procfile").read_text()


def test_dry_run_says_it_would_write_the_procfile_and_writes_nothing(
    cloud: Cloud, tmp_path: Path
) -> None:
    source = user_project(tmp_path)
    result = cloud.deploy("--dry-run", f"--source={source}", config=user_config(tmp_path))
    assert result.returncode == 0, result.stderr
    assert f"# would write {source / 'Procfile'}" in result.stdout
    assert not (source / "Procfile").exists()


def test_a_procfile_of_the_users_own_is_kept(cloud: Cloud, tmp_path: Path) -> None:
    source = user_project(tmp_path, Procfile="web: gunicorn myown:app\n")
    assert cloud.deploy(f"--source={source}", config=user_config(tmp_path)).returncode == 0
    assert (source / "Procfile").read_text() == "web: gunicorn myown:app\n"


@pytest.mark.parametrize(
    "requirements",
    [
        "tasklease>=0.1\n",
        "flask  # web\ntasklease[firestore] ; python_version >= '3.11'\n",
        "tasklease @ git+https://github.com/example/tasklease@v1\n",
        "-e git+https://github.com/example/tasklease#egg=tasklease\n",
        "-r base.txt\n",
    ],
)
def test_requirements_that_install_tasklease_are_accepted(
    cloud: Cloud, tmp_path: Path, requirements: str
) -> None:
    source = user_project(tmp_path, dependencies="", requirements__txt=requirements)
    (source / "base.txt").write_text("tasklease\n")
    result = cloud.deploy("--dry-run", f"--source={source}", config=user_config(tmp_path))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("dependencies", "files", "message"),
    [
        ('"flask"', {}, "does not install tasklease"),
        # An extra of the user's own project is never installed by the buildpack.
        ('"flask"', {"requirements__txt": "gunicorn\n"}, "requirements.txt does not install"),
        ('"tasklease"', {"Procfile": "worker: python x.py\n"}, "has no web: line"),
    ],
)
def test_a_source_the_worker_could_not_start_from_is_refused_before_any_call(
    cloud: Cloud, tmp_path: Path, dependencies: str, files: dict[str, str], message: str
) -> None:
    source = user_project(tmp_path, dependencies, **files)
    result = cloud.deploy(f"--source={source}", config=user_config(tmp_path))
    assert result.returncode == 2
    assert "could not start" in result.stderr and message in result.stderr
    assert cloud.calls() == []


def test_tasklease_only_as_an_optional_extra_is_refused(cloud: Cloud, tmp_path: Path) -> None:
    source = user_project(tmp_path, '"flask"')
    with (source / "pyproject.toml").open("a") as pyproject:
        pyproject.write('[project.optional-dependencies]\nworker = ["tasklease"]\n')
    result = cloud.deploy(f"--source={source}", config=user_config(tmp_path))
    assert result.returncode == 2 and "does not install tasklease" in result.stderr


def test_a_router_module_missing_from_the_source_is_refused(cloud: Cloud, tmp_path: Path) -> None:
    source = user_project(tmp_path)
    config = tmp_path / "other.toml"
    config.write_text(
        EXAMPLE.read_text().replace('"tasklease.demo.shop:router"', '"other.jobs:router"')
    )
    result = cloud.deploy(f"--source={source}", config=config)
    assert result.returncode == 2 and "no module other.jobs" in result.stderr
    assert cloud.calls() == []


def test_tasklease_with_its_worker_packages_as_extras_would_be_refused(
    cloud: Cloud, tmp_path: Path
) -> None:
    """The check guards this repository too: deployed from its own checkout, tasklease must
    list gunicorn and google-cloud-firestore as plain dependencies."""
    source = tmp_path / "checkout"
    (source / "tasklease" / "demo").mkdir(parents=True)
    (source / "tasklease" / "demo" / "shop.py").write_text("")
    pyproject = (ROOT / "pyproject.toml").read_text()
    (source / "pyproject.toml").write_text(pyproject.replace('    "gunicorn>=22",\n', "", 1))
    result = cloud.deploy(f"--source={source}")
    assert result.returncode == 2
    assert "does not install gunicorn" in result.stderr


# `tasklease deploy`: the kit for a project of the user's own, run from any directory.


def tasklease_deploy(cloud: Cloud, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cloud.log.unlink(missing_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "tasklease.cli", "deploy", *args],
        cwd=cwd,
        env=cloud.env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_init_writes_a_commented_config_that_plans_a_deploy_of_the_users_router(
    cloud: Cloud, tmp_path: Path
) -> None:
    source = user_project(tmp_path)
    init = tasklease_deploy(cloud, source, "--init", "--project=acme-prod")
    assert init.returncode == 0, init.stderr
    written = (source / "tasklease.toml").read_text()
    assert 'router = "myapp.tasks:router"' in written and 'project = "acme-prod"' in written
    assert "\n# [[job]]\n" in written  # The example job is there, commented out.
    plan = tasklease_deploy(cloud, source, "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert cloud.calls() == []
    [deploy] = [line for line in plan.stdout.splitlines() if line.startswith("gcloud run deploy")]
    assert f"--source={source}" in deploy and "TASKLEASE_ROUTER=myapp.tasks:router" in deploy
    assert "--project=acme-prod" in deploy
    assert "# would write" in plan.stdout and not (source / "Procfile").exists()


def test_init_does_not_overwrite_a_config(cloud: Cloud, tmp_path: Path) -> None:
    source = user_project(tmp_path, tasklease__toml="mine\n")
    result = tasklease_deploy(cloud, source, "--init")
    assert result.returncode == 2 and "not overwritten" in result.stderr
    assert (source / "tasklease.toml").read_text() == "mine\n"


def test_deploy_without_a_config_points_to_init(cloud: Cloud, tmp_path: Path) -> None:
    result = tasklease_deploy(cloud, tmp_path, "--dry-run")
    assert result.returncode == 2 and "tasklease deploy --init" in result.stderr


def test_tasklease_deploy_deploys_and_tears_down_a_source_given_by_path(
    cloud: Cloud, tmp_path: Path
) -> None:
    source = user_project(tmp_path)
    config = user_config(tmp_path)
    result = tasklease_deploy(cloud, tmp_path, f"--source={source}", f"--config={config}")
    assert result.returncode == 0, result.stderr
    assert (source / "Procfile").exists()
    assert [c[:3] for c in cloud.changes() if c[:2] == ["run", "deploy"]] == [
        ["run", "deploy", "tasklease-worker"]
    ]
    down = tasklease_deploy(
        cloud, tmp_path, f"--source={source}", f"--config={config}", "--teardown"
    )
    assert down.returncode == 0, down.stderr
    assert ["run", "services", "delete"] in [c[:3] for c in cloud.changes()]


def test_a_source_that_cannot_start_is_refused_by_tasklease_deploy(
    cloud: Cloud, tmp_path: Path
) -> None:
    source = user_project(tmp_path, '"flask"')
    result = tasklease_deploy(cloud, source, f"--config={user_config(tmp_path)}")
    assert result.returncode == 2 and "does not install tasklease" in result.stderr
    assert cloud.calls() == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            ('router = "tasklease.demo.shop:router"',
             'router = "tasklease.demo.shop:router|TASKLEASE_OIDC_CERTS_URL=http://evil.example/c"'),
            "worker.router",
        ),
        (('router = "tasklease.demo.shop:router"', "router = 5"), "worker.router"),
        (('service = "tasklease-worker"', 'service = "w --allow-unauthenticated"'),
         "worker.service"),
        (('project = "my-project"', 'project = "my-project --impersonate-service-account=x"'),
         "project"),
        (('region = "us-central1"', 'region = "us-central1,evil"'), "region"),
        (('name = "default"', 'name = "--help"'), "queue.name"),
        (('name = "nightly_reports"', 'name = "nightly reports"'), "job.name"),
        (('time_zone = "Etc/UTC"', 'time_zone = "Etc/UTC --uri=https://evil.example"'),
         "job.time_zone"),
        (('schedule = "0 3 * * *"', 'schedule = "0 3 * * *|x"'), "job.schedule"),
        (('worker = "tasklease-worker"', 'worker = "evil@other.iam"'), "accounts.worker"),
        (('invoker = "tasklease-invoker"', 'invoker = "x"'), "accounts.invoker"),
        (("enqueuers = []", 'enqueuers = ["serviceAccount:a@b.example|X=1"]'),
         "accounts.enqueuers"),
        (('collection = "tasklease_runs"', 'collection = "runs&database=other"'),
         "firestore.collection"),
        (('database = "(default)"', 'database = "(default)|X=1"'), "firestore.database"),
        (('location = "us-central1"', 'location = "us central1"'), "firestore.location"),
    ],
)  # fmt: skip
def test_values_outside_their_targets_character_set_are_refused_naming_the_field(
    cloud: Cloud, tmp_path: Path, change: tuple[str, str], field: str
) -> None:
    config = tmp_path / "hostile.toml"
    text = EXAMPLE.read_text()
    assert change[0] in text
    config.write_text(text.replace(*change, 1))
    result = cloud.deploy(config=config)
    assert result.returncode == 2
    assert f"{field} = " in result.stderr
    assert cloud.calls() == []


def test_the_example_configuration_passes_the_name_checks(cloud: Cloud) -> None:
    result = cloud.deploy("--dry-run")
    assert result.returncode == 0, result.stderr
    assert "TASKLEASE_ROUTER=tasklease.demo.shop:router|" in result.stdout


def test_both_listing_indexes_are_created_once(cloud: Cloud) -> None:
    cloud.deploy()
    creates = [
        c for c in cloud.changes() if c[:4] == ["firestore", "indexes", "composite", "create"]
    ]
    firsts = [next(a for a in c if a.startswith("--field-config=")) for c in creates]
    assert firsts == [
        "--field-config=field-path=status,order=ascending",
        "--field-config=field-path=handler,order=ascending",
    ]
    assert all("--field-config=field-path=claimed_at,order=descending" in c for c in creates)
    assert cloud.deploy().returncode == 0
    assert cloud.changes() == []  # The second run finds both and creates neither.


def test_the_locks_collection_gets_a_ttl_policy_on_lapses_at_once(cloud: Cloud) -> None:
    """Firestore deletes lapsed lock documents as it deletes expired runs, so locks do not
    pile up where nothing calls purge_expired."""
    cloud.deploy()
    ttls = [c for c in cloud.changes() if c[:4] == ["firestore", "fields", "ttls", "update"]]
    assert [(c[4], next(a for a in c if a.startswith("--collection-group="))) for c in ttls] == [
        ("expire_at", "--collection-group=tasklease_runs"),
        ("lapses_at", "--collection-group=tasklease_runs_locks"),
        ("expire_at", "--collection-group=tasklease_runs_tally"),
        ("expire_at", "--collection-group=tasklease_runs_fan_ins"),
        ("expire_at", "--collection-group=tasklease_runs_fan_in_shards"),
        ("expire_at", "--collection-group=tasklease_runs_fan_in_entries"),
    ]
    assert all("--enable-ttl" in c and "--database=(default)" in c for c in ttls)
    assert cloud.deploy().returncode == 0
    assert cloud.changes() == []  # The second run finds the policies.


def test_the_ttl_policy_is_on_the_collection_the_firestore_store_keeps_locks_in() -> None:
    config = load_config(EXAMPLE)
    assert FirestoreStore(collection=config.collection).lock_collection == config.lock_collection


def test_the_ttl_policies_are_on_the_collection_groups_the_firestore_store_keeps_joins_in() -> None:
    config = load_config(EXAMPLE)
    assert config.fan_in_collections == (
        fan_ins.root_collection(config.collection),
        fan_ins.shard_collection(config.collection),
        fan_ins.entry_collection(config.collection),
    )
