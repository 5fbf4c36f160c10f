"""The commands a Postgres or Spanner deploy adds (tests/deploy/test_deploy_stores.py), judged by
the real gcloud's argument parser offline, as tests/deploy/test_deploy_gcloud.py judges the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tasklease.deploy import deploy as kit
from tasklease.deploy.config import load_config
from tasklease.deploy.gcloud import Gcloud
from tests.deploy.test_deploy import user_project
from tests.deploy.test_deploy_stores import REQUIREMENTS, store_config
from tests.support.gcloud_judge import GcloudBatch

pytestmark = pytest.mark.slow
STORE_WORDS = ("sql", "secrets", "spanner", "deploy")
# The judge must reject a wrong one in the same batch, or a pass would prove nothing.
BAD = [["run", "deploy", "s", "--region=us-central1", "--add-cloudsql-instance=p:r:i"]]


class Calls(Gcloud):
    """Records every read (as gcloud would be called, ``--format=json`` added) and change;
    finds nothing, as a dry run does."""

    def __init__(self) -> None:
        super().__init__(dry_run=True, executable="gcloud")
        self.calls: list[list[str]] = []

    def read(self, *args: str) -> Any:
        self.calls.append([*args, "--format=json"])
        return None

    def change(self, *args: str) -> None:
        self.calls.append(list(args))


def store_commands(tmp_path: Path) -> list[list[str]]:
    """Each distinct command of a Postgres and a Spanner deploy and teardown that names the
    store's resources (and the worker's deploy, which carries the Cloud SQL flags)."""
    commands: list[list[str]] = []
    for store in ("postgresql", "spanner"):
        config = load_config(store_config(tmp_path, store))
        source = user_project(tmp_path / store, REQUIREMENTS[store])
        for teardown in (False, True):
            gcloud = Calls()
            kit.run(config, source, gcloud, dry_run=True, teardown=teardown)
            commands += [
                call
                for call in gcloud.calls
                if call not in commands
                and (call[0] in STORE_WORDS[:3] or call[:2] == ["run", "deploy"]
                     or "--role=roles/cloudsql.client" in call)
            ]  # fmt: skip
    return commands


def test_every_command_a_database_store_adds_is_accepted_by_the_installed_gcloud(
    gcloud_verdicts: GcloudBatch,
) -> None:
    commands = gcloud_verdicts.planned["stores"]
    heads = {" ".join(c[:3]) for c in commands}
    assert {
        "sql instances describe",
        "sql databases create",
        "secrets add-iam-policy-binding tasklease-db-password",
        "spanner databases create",
        "spanner databases add-iam-policy-binding",
        "run deploy tasklease-worker",
    } <= heads
    gcloud_verdicts.assert_rejects_only_bad(commands, BAD)
