"""The commands a proxy job adds to a deploy and a teardown, judged by the real gcloud's
parser (offline, as in tests/deploy/test_deploy_gcloud.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.test_deploy import Cloud, user_config, user_project
from tests.deploy.test_deploy_proxy import LIBRARIES, PROXY_JOBS
from tests.support.gcloud_judge import GcloudBatch

pytestmark = pytest.mark.slow


def recorded(cloud: Cloud, config: Path, source: Path) -> list[list[str]]:
    calls: list[list[str]] = []
    for args in ([], ["--teardown"]):
        result = cloud.deploy(f"--source={source}", *args, config=config)
        assert result.returncode == 0, result.stderr
        calls += [call for call in cloud.calls() if call not in calls]
    return calls


def proxy_commands(tmp_path: Path) -> list[list[str]]:
    """Each command a proxy job adds to a deploy and its teardown (Scheduler jobs aside:
    tests/deploy/test_deploy_gcloud.py judges them)."""
    source = user_project(tmp_path, LIBRARIES)
    plain = user_config(tmp_path)
    config = tmp_path / "proxy.toml"
    config.write_text(plain.read_text() + PROXY_JOBS)
    (tmp_path / "base").mkdir()
    (tmp_path / "proxy").mkdir()
    base = recorded(Cloud(tmp_path / "base"), plain, source)
    return [
        call
        for call in recorded(Cloud(tmp_path / "proxy"), config, source)
        if call not in base and call[0] != "scheduler"
    ]


# The judge must reject a wrong one in the same batch, or a pass would prove nothing.
BAD = [["run", "jobs", "add-iam-policy-binding", "j", "--regio=us-east1", "--role=r"]]


def test_every_proxy_command_is_accepted_by_the_installed_gcloud(
    gcloud_verdicts: GcloudBatch,
) -> None:
    commands = gcloud_verdicts.planned["proxy"]
    heads = {" ".join(c[:3]) for c in commands}
    assert {
        "projects get-iam-policy data-project",
        "projects add-iam-policy-binding data-project",
        "projects remove-iam-policy-binding data-project",
        "run jobs get-iam-policy",
        "run jobs add-iam-policy-binding",
    } <= heads, heads
    gcloud_verdicts.assert_rejects_only_bad(commands, BAD, what="proxy")
