"""The commands a proxy job adds to a deploy and a teardown, judged by the real gcloud's
parser (offline, as in tests/test_deploy_gcloud.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.test_deploy import Cloud, user_config, user_project
from tests.test_deploy_gcloud import judge, offline_env, refusing_port  # noqa: F401
from tests.test_deploy_proxy import LIBRARIES, PROXY_JOBS

pytestmark = pytest.mark.slow


def recorded(cloud: Cloud, config: Path, source: Path) -> list[list[str]]:
    calls: list[list[str]] = []
    for args in ([], ["--teardown"]):
        result = cloud.deploy(f"--source={source}", *args, config=config)
        assert result.returncode == 0, result.stderr
        calls += [call for call in cloud.calls() if call not in calls]
    return calls


def test_every_proxy_command_is_accepted_by_the_installed_gcloud(
    tmp_path: Path,
    refusing_port: int,  # noqa: F811
) -> None:
    source = user_project(tmp_path, LIBRARIES)
    plain = user_config(tmp_path)
    config = tmp_path / "proxy.toml"
    config.write_text(plain.read_text() + PROXY_JOBS)
    (tmp_path / "base").mkdir()
    (tmp_path / "proxy").mkdir()
    base = recorded(Cloud(tmp_path / "base"), plain, source)
    commands = [
        call
        for call in recorded(Cloud(tmp_path / "proxy"), config, source)
        if call not in base and call[0] != "scheduler"  # Scheduler jobs: judged elsewhere.
    ]
    heads = {" ".join(c[:3]) for c in commands}
    assert {
        "projects get-iam-policy data-project",
        "projects add-iam-policy-binding data-project",
        "projects remove-iam-policy-binding data-project",
        "run jobs get-iam-policy",
        "run jobs add-iam-policy-binding",
    } <= heads, heads
    # The judge must reject a wrong one in the same batch, or a pass would prove nothing.
    bad = ["run", "jobs", "add-iam-policy-binding", "j", "--regio=us-east1", "--role=r"]
    config_dir = tmp_path / "gcloud-config"
    config_dir.mkdir()
    rejected = judge([*commands, bad], offline_env(config_dir, refusing_port))
    assert shlex.join(["gcloud", *bad]) in rejected
    del rejected[shlex.join(["gcloud", *bad])]
    assert rejected == {}, "gcloud rejected proxy commands:\n" + "\n\n".join(
        f"{command}\n  -> {output}" for command, output in rejected.items()
    )
