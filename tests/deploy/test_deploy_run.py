"""The deploy kit's one entry point, ``tasklease.deploy.deploy.run``, called directly with a
loaded config (no argv), and ``tasklease deploy`` handing it the config it loaded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tasklease import cli
from tasklease.deploy import deploy as kit
from tasklease.deploy.config import DEFAULT_CONFIG, Config, load_config
from tasklease.deploy.errors import DeployError
from tasklease.deploy.gcloud import Gcloud
from tests.deploy.test_deploy import user_config, user_project


class RecordingGcloud(Gcloud):
    """An adapter that runs nothing: it records each change, and finds each resource it is
    asked about when ``existing`` (else none), as a project already deployed (or empty)."""

    def __init__(self, *, existing: bool = False) -> None:
        super().__init__(dry_run=False, executable="gcloud-not-run")
        self.existing = existing
        self.reads: list[tuple[str, ...]] = []
        self.changes: list[tuple[str, ...]] = []

    def read(self, *args: str) -> Any:
        self.reads.append(args)
        if args[:2] == ("projects", "describe"):
            return {"projectNumber": "123456789"}
        return {} if self.existing and "describe" in args else None

    def change(self, *args: str) -> None:
        self.changes.append(args)


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return load_config(user_config(tmp_path))


def test_run_called_directly_deploys_an_empty_project_in_order(
    config: Config, tmp_path: Path
) -> None:
    source = user_project(tmp_path)
    gcloud = RecordingGcloud()
    kit.run(config, source, gcloud)
    assert [" ".join(change[:3]) for change in gcloud.changes] == [
        "services enable run.googleapis.com",
        "firestore databases create",
        "firestore fields ttls",
        "firestore fields ttls",
        "firestore fields ttls",  # Runs, locks, and the delivery tally.
        "firestore fields ttls",
        "firestore fields ttls",
        "firestore fields ttls",  # The joins' roots, shards and entries.
        "firestore indexes composite",
        "firestore indexes composite",
        "iam service-accounts create",
        "iam service-accounts create",
        "projects add-iam-policy-binding my-project",
        "tasks queues create",
        "tasks queues add-iam-policy-binding",
        "iam service-accounts add-iam-policy-binding",
        "run deploy tasklease-worker",
        "run services add-iam-policy-binding",
        "scheduler jobs create",
    ]
    [deploy] = [change for change in gcloud.changes if change[:2] == ("run", "deploy")]
    assert f"--source={source.resolve()}" in deploy
    assert (source / "Procfile").exists()


def test_run_called_directly_tears_down_what_exists(config: Config, tmp_path: Path) -> None:
    gcloud = RecordingGcloud(existing=True)
    kit.run(config, user_project(tmp_path), gcloud, teardown=True)
    assert [" ".join(change[:3]) for change in gcloud.changes if "delete" in change] == [
        "scheduler jobs delete",
        "tasks queues delete",
        "run services delete",
        "iam service-accounts delete",
        "iam service-accounts delete",
    ]


def test_a_dry_run_called_directly_prints_the_commands_and_writes_no_procfile(
    config: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = user_project(tmp_path)
    kit.run(config, source, "/nonexistent/gcloud", dry_run=True)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("/")]
    assert printed[0].startswith("/nonexistent/gcloud services enable")
    assert printed[-1].startswith("/nonexistent/gcloud scheduler jobs create http")
    assert not (source / "Procfile").exists()


def test_run_refuses_a_source_the_worker_could_not_start_from_before_any_call(
    config: Config, tmp_path: Path
) -> None:
    gcloud = RecordingGcloud()
    with pytest.raises(DeployError, match="does not install tasklease"):
        kit.run(config, user_project(tmp_path, '"flask"'), gcloud)
    assert gcloud.reads == [] and gcloud.changes == []


def test_run_refuses_an_adapter_whose_dry_run_disagrees(config: Config, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dry_run"):
        kit.run(config, user_project(tmp_path), RecordingGcloud(), dry_run=True)


def test_tasklease_deploy_hands_run_the_loaded_config_and_its_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, ...]] = []

    def recording_run(*args: Any, **options: Any) -> None:
        calls.append((*args, options))

    monkeypatch.setattr(kit, "run", recording_run)
    source, config = user_project(tmp_path), user_config(tmp_path)
    status = cli.main(
        ["deploy", f"--source={source}", f"--config={config}", "--gcloud=/x/gcloud", "--teardown"]
    )
    assert status == 0
    assert calls == [
        (load_config(config), source, "/x/gcloud", {"dry_run": False, "teardown": True})
    ]


def test_tasklease_deploy_reports_a_deploy_error_as_the_script_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = user_project(tmp_path, '"flask"')
    status = cli.main(["deploy", f"--source={source}", f"--config={user_config(tmp_path)}"])
    assert status == 2
    assert capsys.readouterr().err.startswith("deploy: the worker built from")


def test_the_kit_imports_nothing_outside_the_standard_library_and_tasklease() -> None:
    """The script needs only Python and gcloud: no module of the kit loads a third-party one."""
    probe = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import tasklease.deploy.deploy\n"
        "loaded = {n.split('.')[0] for n in set(sys.modules) - before}\n"
        "print(sorted(loaded - set(sys.stdlib_module_names)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "['tasklease']"


def test_a_region_google_does_not_have_is_refused_unless_allowed(tmp_path: Path) -> None:
    text = DEFAULT_CONFIG.read_text().replace('region = "us-central1"', 'region = "mars-north1"', 1)
    config = tmp_path / "mars.toml"
    config.write_text(text)
    with pytest.raises(DeployError, match="'mars-north1' is not a Google Cloud region"):
        load_config(config)
    config.write_text("allow_unlisted_region = true\n" + text)
    assert load_config(config).region == "mars-north1"
