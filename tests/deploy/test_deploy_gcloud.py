"""Every command deploy.py can issue, judged by the real gcloud's argument parser.

The stub gcloud (tests/deploy/test_deploy.py) checks the idempotency logic but accepts any flag;
this runs each distinct command of a first deploy, an updating deploy and a teardown through the
installed gcloud, offline, in the session's one batch of gcloud commands
(tests/support/gcloud_judge.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.deploy.test_deploy import Cloud, user_config, user_project
from tests.support.gcloud_judge import GCLOUD, GcloudBatch

pytestmark = pytest.mark.slow

IN_CI = os.environ.get("CI") == "true"

if GCLOUD is None:
    reason = "gcloud is not installed: deploy commands were NOT checked against its parser"
    if IN_CI:
        pytest.fail(f"CI=true, but {reason}", pytrace=False)
    pytest.skip(f"SKIPPED LOUDLY: {reason}", allow_module_level=True)

# The judge itself, checked in the same batch: a misspelt flag and a bad value must be
# rejected, or a passing run would prove nothing.
BAD = [
    ["tasks", "queues", "create", "q", "--location=us-central1", "--max-atempts=3"],
    [
        "scheduler",
        "jobs",
        "create",
        "http",
        "j",
        "--location=us-central1",
        "--schedule=0 3 * * *",
        "--uri=https://x",
        "--attempt-deadline=soon",
    ],
]


def planned_commands(tmp_path: Path) -> list[list[str]]:
    """Every distinct gcloud command of a first deploy, a deploy that updates the queue and
    the job, and a teardown, as deploy.py issues them (recorded by the stub)."""
    cloud = Cloud(tmp_path)
    source = user_project(tmp_path)
    first = user_config(tmp_path)
    changed = tmp_path / "changed.toml"
    changed.write_text(
        first.read_text()
        .replace("max_attempts = 100", "max_attempts = 20")
        .replace('schedule = "0 3 * * *"', 'schedule = "30 4 * * 1-5"')
    )
    commands: list[list[str]] = []
    for config, args in [(first, []), (changed, []), (changed, ["--teardown"])]:
        result = cloud.deploy(f"--source={source}", *args, config=config)
        assert result.returncode == 0, result.stderr
        commands += [call for call in cloud.calls() if call not in commands]
    return commands


def test_every_planned_command_is_accepted_by_the_installed_gcloud(
    gcloud_verdicts: GcloudBatch,
) -> None:
    commands = gcloud_verdicts.planned["deploy"]
    heads = {" ".join([word for word in c if not word.startswith("--")][:3]) for c in commands}
    assert {
        "run deploy tasklease-worker",
        "tasks queues update",
        "scheduler jobs update",
        "run services delete",
    } <= heads
    gcloud_verdicts.assert_rejects_only_bad(commands, BAD)
