"""The deploy kit's stores (``store = "firestore" | "postgresql" | "spanner"``): the dry-run
plan of each (the exact gcloud commands), the refusals, and the store URL the worker gets."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from tasklease.cli.deploy import template
from tasklease.deploy import deploy as kit
from tasklease.deploy.config import Config, load_config
from tasklease.deploy.errors import DeployError
from tasklease.deploy.gcloud import Gcloud
from tasklease.deploy.plan import worker_env
from tasklease.worker.stores import store_from_url
from tasklease.worker.stores.postgres.options import Options
from tasklease.worker.stores.spanner.store import SpannerStore
from tests.deploy.test_deploy import EXAMPLE, user_project

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tasklease" / "deploy" / "deploy.py"
WORKER = "serviceAccount:tasklease-worker@my-project.iam.gserviceaccount.com"
POSTGRES = """
[postgresql]
instance = "my-project:us-central1:main-db"
database = "appdb"
user = "tasklease"
password_secret = "tasklease-db-password"
"""
SPANNER = """
[spanner]
instance = "main"
database = "tasklease"
"""
TABLES = {"firestore": "", "postgresql": POSTGRES, "spanner": SPANNER}
REQUIREMENTS = {
    "firestore": '"tasklease"',
    "postgresql": '"tasklease[postgres]"',
    "spanner": '"tasklease[spanner]"',
}


def store_config(tmp_path: Path, store: str, tables: str | None = None) -> Path:
    """The kit's example with the user's router, ``store = STORE`` and the store's table."""
    text = EXAMPLE.read_text().replace('"tasklease.demo.shop:router"', '"myapp.tasks:router"')
    text = text.replace('region = "us-central1"\n', f'region = "us-central1"\nstore = "{store}"\n')
    path = tmp_path / f"{store}.toml"
    path.write_text(text + (TABLES[store] if tables is None else tables))
    return path


class Recorder(Gcloud):
    """A dry-run adapter that records each change instead of printing it."""

    def __init__(self) -> None:
        super().__init__(dry_run=True, executable="gcloud")
        self.changes: list[str] = []

    def read(self, *args: str) -> Any:
        return None

    def change(self, *args: str) -> None:
        line = " ".join(args)
        self.changes.append(re.sub(r"tasklease-digest=[0-9a-f]+", "tasklease-digest=D", line))


def planned(tmp_path: Path, store: str) -> list[str]:
    config = load_config(store_config(tmp_path, store))
    gcloud = Recorder()
    kit.run(config, user_project(tmp_path, REQUIREMENTS[store]), gcloud, dry_run=True)
    return gcloud.changes


def env_of(deploy: str) -> dict[str, str]:
    [flag] = [part for part in deploy.split(" ") if part.startswith("--set-env-vars=^|^")]
    return dict(item.split("=", 1) for item in flag.removeprefix("--set-env-vars=^|^").split("|"))


COMMON_APIS = (
    "services enable run.googleapis.com cloudbuild.googleapis.com "
    "artifactregistry.googleapis.com cloudtasks.googleapis.com cloudscheduler.googleapis.com"
)
ACCOUNTS = [
    "iam service-accounts create tasklease-worker "
    "--display-name=tasklease worker runtime --project=my-project",
    "iam service-accounts create tasklease-invoker "
    "--display-name=tasklease invoker (OIDC tokens) --project=my-project",
]


def test_a_postgres_dry_run_plans_the_cloud_sql_database_grants_and_socket(
    tmp_path: Path,
) -> None:
    changes = planned(tmp_path, "postgresql")
    assert changes[:7] == [
        f"{COMMON_APIS} sqladmin.googleapis.com secretmanager.googleapis.com --project=my-project",
        "sql databases create appdb --instance=main-db --project=my-project",
        *ACCOUNTS,
        f"projects add-iam-policy-binding my-project --member={WORKER} "
        "--role=roles/cloudsql.client --condition=None",
        f"secrets add-iam-policy-binding tasklease-db-password --member={WORKER} "
        "--role=roles/secretmanager.secretAccessor --project=my-project",
        "tasks queues create default --location=us-central1 --max-attempts=100 "
        "--max-retry-duration=0s --min-backoff=0.1s --max-backoff=3600s --max-doublings=16 "
        "--max-dispatches-per-second=500 --max-concurrent-dispatches=1000 --project=my-project",
    ]
    assert not [change for change in changes if "firestore" in change or "datastore" in change]
    [deploy] = [change for change in changes if change.startswith("run deploy")]
    assert "--add-cloudsql-instances=my-project:us-central1:main-db" in deploy.split(" ")
    assert "--set-secrets=PGPASSWORD=tasklease-db-password:latest" in deploy.split(" ")
    assert env_of(deploy)["TASKLEASE_STORE"] == (
        "postgresql://tasklease@/appdb?host=/cloudsql/my-project:us-central1:main-db"
    )


def test_a_spanner_dry_run_plans_the_database_and_a_grant_on_it_only(tmp_path: Path) -> None:
    changes = planned(tmp_path, "spanner")
    assert changes[:5] == [
        f"{COMMON_APIS} spanner.googleapis.com --project=my-project",
        "spanner databases create tasklease --instance=main --project=my-project",
        *ACCOUNTS,
        f"spanner databases add-iam-policy-binding tasklease --instance=main --member={WORKER} "
        "--role=roles/spanner.databaseUser --project=my-project",
    ]
    assert not [change for change in changes if "firestore" in change or "datastore" in change]
    assert not [change for change in changes if "projects add-iam-policy-binding" in change]
    [deploy] = [change for change in changes if change.startswith("run deploy")]
    assert "cloudsql" not in deploy and "--set-secrets" not in deploy
    assert env_of(deploy)["TASKLEASE_STORE"] == (
        "spanner://projects/my-project/instances/main/databases/tasklease"
    )


def test_a_firestore_dry_run_is_todays_plan_whether_store_is_given_or_not(
    tmp_path: Path,
) -> None:
    given = planned(tmp_path, "firestore")
    assert given[:2] == [
        f"{COMMON_APIS} firestore.googleapis.com --project=my-project",
        "firestore databases create --database=(default) --location=us-central1 "
        "--type=firestore-native --project=my-project",
    ]
    assert (
        f"projects add-iam-policy-binding my-project --member={WORKER} "
        + ("--role=roles/datastore.user --condition=None")
        in given
    )
    [deploy] = [change for change in given if change.startswith("run deploy")]
    assert env_of(deploy)["TASKLEASE_STORE"] == (
        "firestore://?collection=tasklease_runs&database=(default)"
    )
    default = load_config(EXAMPLE)
    assert default.store == "firestore" and default.store_url == env_of(deploy)["TASKLEASE_STORE"]


@pytest.mark.parametrize(
    ("store", "revoked"),
    [
        (
            "postgresql",
            [
                f"projects remove-iam-policy-binding my-project --member={WORKER} "
                "--role=roles/cloudsql.client --condition=None",
                "secrets remove-iam-policy-binding tasklease-db-password --project=my-project "
                f"--member={WORKER} --role=roles/secretmanager.secretAccessor",
            ],
        ),
        (
            "spanner",
            [
                "spanner databases remove-iam-policy-binding tasklease --instance=main "
                f"--project=my-project --member={WORKER} --role=roles/spanner.databaseUser",
            ],
        ),
    ],
)
def test_a_teardown_revokes_the_stores_grants_before_deleting_the_account(
    tmp_path: Path, store: str, revoked: list[str]
) -> None:
    class Deployed(Recorder):
        """Finds every resource, and every policy granting the worker the stores' roles."""

        def __init__(self) -> None:
            super().__init__()
            self.dry_run = False

        def read(self, *args: str) -> Any:
            if "get-iam-policy" in args:
                roles = ["roles/secretmanager.secretAccessor", "roles/spanner.databaseUser"]
                return {"bindings": [{"role": role, "members": [WORKER]} for role in roles]}
            return {}

    config = load_config(store_config(tmp_path, store))
    gcloud = Deployed()
    kit.run(config, user_project(tmp_path, REQUIREMENTS[store]), gcloud, teardown=True)
    grants = [change for change in gcloud.changes if "remove-iam-policy-binding" in change]
    assert grants == revoked
    first_account_deletion = next(
        n for n, change in enumerate(gcloud.changes) if change.startswith("iam service-accounts")
    )
    assert all(gcloud.changes.index(change) < first_account_deletion for change in revoked)
    assert not [change for change in gcloud.changes if "datastore" in change]


def test_the_postgres_url_the_kit_sets_is_read_by_the_store_as_the_cloud_sql_socket(
    tmp_path: Path,
) -> None:
    config = load_config(store_config(tmp_path, "postgresql"))
    url = worker_env(config, "https://w.run.app")["TASKLEASE_STORE"]
    conninfo, options = Options.from_url(url)
    params = conninfo_to_dict(options.libpq(conninfo))
    assert params["host"] == "/cloudsql/my-project:us-central1:main-db"
    assert (params["user"], params["dbname"]) == ("tasklease", "appdb")
    assert "password" not in params  # libpq reads PGPASSWORD, which --set-secrets mounts.
    assert "port" not in params


def test_the_spanner_url_the_kit_sets_names_the_database_the_store_opens(
    tmp_path: Path,
) -> None:
    config = load_config(store_config(tmp_path, "spanner"))
    store = store_from_url(worker_env(config, "https://w.run.app")["TASKLEASE_STORE"])
    assert isinstance(store, SpannerStore)
    assert store.database_path == "projects/my-project/instances/main/databases/tasklease"


def test_a_real_deploy_without_the_instance_is_refused_before_any_change(
    tmp_path: Path,
) -> None:
    class Empty(Gcloud):
        def __init__(self) -> None:
            super().__init__(dry_run=False, executable="gcloud-not-run")
            self.changes: list[tuple[str, ...]] = []

        def read(self, *args: str) -> Any:
            return [] if args[:2] == ("services", "list") else None

        def change(self, *args: str) -> None:
            self.changes.append(args)

    for store, message in [
        ("postgresql", "Cloud SQL instance my-project:us-central1:main-db does not exist"),
        ("spanner", "Spanner instance main does not exist"),
    ]:
        gcloud = Empty()
        config = load_config(store_config(tmp_path, store))
        with pytest.raises(DeployError, match=message):
            kit.run(config, user_project(tmp_path / store, REQUIREMENTS[store]), gcloud)
        assert [change[:2] for change in gcloud.changes] == [("services", "enable")]


@pytest.mark.parametrize(
    ("store", "tables", "message"),
    [
        ("mysql", "", "store = 'mysql' is not one of 'firestore', 'postgresql', 'spanner'"),
        ("postgresql", "", 'store = "postgresql" needs a [postgresql] table'),
        ("spanner", "", 'store = "spanner" needs a [spanner] table'),
        (
            "postgresql",
            POSTGRES.replace("my-project:us-central1:main-db", "main-db"),
            "postgresql.instance = 'main-db' is not an instance connection name "
            "PROJECT:REGION:INSTANCE",
        ),
        (
            "postgresql",
            POSTGRES.replace('"appdb"', '"app|TASKLEASE_AUTH=none"'),
            "postgresql.database = 'app|TASKLEASE_AUTH=none' is not a Postgres database name",
        ),
        (
            "postgresql",
            POSTGRES.replace('"tasklease"', '"ops@example"'),
            "postgresql.user = 'ops@example' is not a Postgres user name",
        ),
        (
            "postgresql",
            POSTGRES.replace('"tasklease-db-password"', '"pw,OTHER=x"'),
            "postgresql.password_secret = 'pw,OTHER=x' is not a Secret Manager secret ID",
        ),
        (
            "postgresql",
            POSTGRES + 'password_version = "newest"\n',
            "postgresql.password_version = 'newest' is not latest or a version number",
        ),
        ("postgresql", POSTGRES + 'password = "x"\n', "[postgresql]: unknown keys ['password']"),
        (
            "spanner",
            SPANNER.replace('"main"', '"-main"'),
            "spanner.instance = '-main' is not a Spanner instance ID",
        ),
        (
            "spanner",
            SPANNER.replace('"tasklease"', '"Tasklease"'),
            "spanner.database = 'Tasklease' is not a Spanner database ID",
        ),
    ],
)
def test_a_bad_store_setting_exits_non_zero_with_a_one_line_message(
    tmp_path: Path, store: str, tables: str, message: str
) -> None:
    config = store_config(tmp_path, store, tables)
    result = subprocess.run(
        [sys.executable, str(SCRIPT), f"--config={config}", "--dry-run"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert [line for line in result.stderr.splitlines() if message in line]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("store", "line"),
    [("postgresql", "tasklease[postgres]"), ("spanner", "tasklease[spanner]")],
)
def test_a_source_without_the_stores_extra_is_refused_naming_the_line_to_add(
    tmp_path: Path, store: str, line: str
) -> None:
    config = load_config(store_config(tmp_path, store))
    with pytest.raises(DeployError) as refused:
        kit.run(config, user_project(tmp_path, '"tasklease>=0.1"'), Recorder(), dry_run=True)
    assert f'add "{line}" to [project].dependencies' in str(refused.value)
    requirements = user_project(tmp_path / "req", requirements__txt="tasklease\nflask\n")
    with pytest.raises(DeployError) as refused:
        kit.run(config, requirements, Recorder(), dry_run=True)
    assert f"add the line {line} (in place of tasklease" in str(refused.value)


@pytest.mark.parametrize(
    ("store", "requirement"),
    [
        ("postgresql", "tasklease[postgres]"),
        ("postgresql", "TaskLease [ Postgres ] >= 0.1"),
        ("postgresql", "tasklease[spanner,postgres]==1.2; python_version >= '3.11'"),
        ("postgresql", "tasklease[otel, postgres]"),
        ("postgresql", "tasklease[postgres] @ https://example.com/tasklease-1-py3-none-any.whl"),
        ("spanner", "tasklease[spanner]"),
        ("spanner", "tasklease [spanner]~=1.0"),
        ("firestore", "tasklease"),
        ("firestore", "tasklease[firestore]>=0.1"),
    ],
)
def test_any_spelling_pip_accepts_of_the_stores_requirement_passes(
    tmp_path: Path, store: str, requirement: str
) -> None:
    config = load_config(store_config(tmp_path, store))
    for source in (
        user_project(tmp_path / "pyproject", json.dumps(requirement)),
        user_project(tmp_path / "requirements", requirements__txt=f"flask\n{requirement}\n"),
    ):
        kit.run(config, source, Recorder(), dry_run=True)


def test_a_local_project_with_the_extra_in_requirements_passes(tmp_path: Path) -> None:
    """``.[db]`` installs the local project with its ``db`` extra, which lists the store's."""
    config = load_config(store_config(tmp_path, "postgresql"))
    source = user_project(tmp_path, '"tasklease"', requirements__txt=".[db]\n")
    pyproject = source / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text() + '[project.optional-dependencies]\ndb = ["tasklease[postgres]"]\n'
    )
    kit.run(config, source, Recorder(), dry_run=True)
    (source / "requirements.txt").write_text(".\n")
    with pytest.raises(DeployError, match=r"tasklease\[postgres\]"):
        kit.run(config, source, Recorder(), dry_run=True)


def test_init_writes_the_store_keys_commented_and_uncommented_they_load(tmp_path: Path) -> None:
    text = template("myapp.tasks:router")
    assert '# store = "firestore"' in text
    assert "# [postgresql]" in text and "# [spanner]" in text
    assert load_config(written(tmp_path, text)).store == "firestore"
    postgres = re.sub(r'(?m)^# (store = )"firestore"', r'\1"postgresql"', text)
    postgres = re.sub(r"(?ms)^# (\[postgresql\]\n)(.*?)\n\n", uncomment, postgres)
    loaded: Config = load_config(written(tmp_path, postgres))
    assert loaded.postgresql is not None
    assert loaded.store_url == (
        "postgresql://tasklease@/tasklease?host=/cloudsql/my-project:us-central1:my-instance"
    )
    spanner = re.sub(r'(?m)^# (store = )"firestore"', r'\1"spanner"', text)
    spanner = re.sub(r"(?ms)^# (\[spanner\]\n)(.*?)\n\n", uncomment, spanner)
    assert load_config(written(tmp_path, spanner)).store_url == (
        "spanner://projects/my-project/instances/my-instance/databases/tasklease"
    )


def uncomment(match: re.Match[str]) -> str:
    return match.group(1) + re.sub(r"(?m)^# ", "", match.group(2)) + "\n\n"


def written(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "init.toml"
    path.write_text(text)
    return path


def test_the_readmes_store_examples_load_and_give_the_urls_it_names(tmp_path: Path) -> None:
    """README's "Cloud SQL for PostgreSQL or Spanner" tables, in the kit's example, as written
    (the how-to page repeats the section)."""
    section = (ROOT / "README.md").read_text().split("### Cloud SQL for PostgreSQL or Spanner")[1]
    section = section.split("\n## ", 1)[0]
    assert section in (ROOT / "docs" / "how-to" / "deploying.md").read_text()
    blocks = [block.split("```", 1)[0] for block in section.split("```toml\n")[1:]]
    assert len(blocks) == 2
    for block in blocks:
        top, _, tables = block.partition("\n[")
        text = EXAMPLE.read_text().replace('"tasklease.demo.shop:router"', '"myapp.tasks:router"')
        text = text.replace('region = "us-central1"\n', f'region = "us-central1"\n{top}\n')
        config = load_config(written(tmp_path, f"{text}\n[{tables}"))
        assert f"TASKLEASE_STORE={config.store_url}`" in section


def test_a_teardown_leaves_a_policy_alone_that_no_longer_grants_the_role(tmp_path: Path) -> None:
    """gcloud fails a remove-iam-policy-binding of a binding that is not there."""

    class Revoked(Recorder):
        def __init__(self) -> None:
            super().__init__()
            self.dry_run = False

        def read(self, *args: str) -> Any:
            return {"bindings": []} if "get-iam-policy" in args else {}

    config = load_config(store_config(tmp_path, "spanner"))
    gcloud = Revoked()
    kit.run(config, user_project(tmp_path, REQUIREMENTS["spanner"]), gcloud, teardown=True)
    assert not [change for change in gcloud.changes if "remove-iam-policy-binding" in change]
    assert (
        "iam service-accounts delete tasklease-worker@my-project.iam.gserviceaccount.com "
        + ("--project=my-project --quiet")
        in gcloud.changes
    )
