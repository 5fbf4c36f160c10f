from __future__ import annotations

import logging
import os
import socket
from collections.abc import Generator, Iterator
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from tasklease.emulator import CloudTasksEmulator
from tests.support import firestore as firestore_support
from tests.support import postgres as postgres_support
from tests.support import spanner as spanner_support
from tests.support.emulator_target import Target
from tests.support.fake_cloud_tasks import FakeCloudTasks
from tests.support.gcloud_judge import GcloudBatch, offline_env
from tests.support.helpers import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(autouse=True)
def _tasklease_logs_propagate() -> Iterator[None]:
    """Let caplog see tasklease's records even if a test configured JSON logging."""
    logger = logging.getLogger("tasklease")
    saved = (logger.propagate, list(logger.handlers))
    logger.propagate = True
    yield
    logger.propagate, logger.handlers[:] = saved[0], saved[1]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``--dist loadgroup``), the tests of the gcloud batch run on one
    worker: each worker would otherwise start the whole batch of gcloud commands again."""
    for item in items:
        if "gcloud_verdicts" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("gcloud"))


@pytest.fixture(scope="session")
def gcloud_verdicts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcloudBatch]:
    """Every deploy test's gcloud commands, started at once (tests/support/gcloud_judge.py)."""
    # Imported here: these modules fail or skip at import where gcloud is missing.
    from tests.deploy import (  # noqa: PLC0415
        test_deploy_gcloud,
        test_deploy_proxy_gcloud,
        test_deploy_stores_gcloud,
    )

    planned = {
        "deploy": test_deploy_gcloud.planned_commands(tmp_path_factory.mktemp("deploy")),
        "stores": test_deploy_stores_gcloud.store_commands(tmp_path_factory.mktemp("stores")),
        "proxy": test_deploy_proxy_gcloud.proxy_commands(tmp_path_factory.mktemp("proxy")),
    }
    bad = [*test_deploy_gcloud.BAD, *test_deploy_stores_gcloud.BAD, *test_deploy_proxy_gcloud.BAD]
    config_dir = tmp_path_factory.mktemp("gcloud-config")
    # A loopback port bound but never listening: connections are refused, and nothing else
    # can take the port while the batch runs.
    with socket.socket() as refusing:
        refusing.bind(("127.0.0.1", 0))
        batch = GcloudBatch(
            {**planned, "bad": bad}, offline_env(config_dir, refusing.getsockname()[1])
        )
        try:
            yield batch
        finally:
            batch.close()


@pytest.fixture(scope="session")
def _cloud_tasks_server() -> Iterator[HTTPServer]:
    # One server for the session: stopping werkzeug's server takes half a second.
    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def cloud_tasks(_cloud_tasks_server: HTTPServer) -> Iterator[FakeCloudTasks]:
    _cloud_tasks_server.clear()
    yield FakeCloudTasks(_cloud_tasks_server)
    _cloud_tasks_server.clear()


@pytest.fixture(scope="session")
def _target_server() -> Iterator[HTTPServer]:
    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def target(_target_server: HTTPServer) -> Iterator[tuple[Target, str]]:
    """A recording HTTP target; yields it and its URL."""
    recorder = Target()
    _target_server.clear()
    _target_server.expect_request("/tasks/hit").respond_with_handler(recorder)
    yield recorder, _target_server.url_for("/tasks/hit")
    _target_server.clear()


@pytest.fixture
def emulator() -> Iterator[CloudTasksEmulator]:
    with CloudTasksEmulator() as running:
        yield running


@pytest.fixture(scope="session")
def firestore_host() -> Iterator[str | None]:
    """The Firestore emulator's host:port (FIRESTORE_EMULATOR_HOST set), or None when the
    tests run against a real project (TASKLEASE_FIRESTORE_LIVE=1)."""
    if firestore_support.LIVE:
        yield None
        return
    previous = os.environ.get("FIRESTORE_EMULATOR_HOST")
    for host in firestore_support.start_emulator():
        os.environ["FIRESTORE_EMULATOR_HOST"] = host  # Inherited by spawned test processes.
        try:
            yield host
        finally:
            if previous is None:
                os.environ.pop("FIRESTORE_EMULATOR_HOST", None)
            else:
                os.environ["FIRESTORE_EMULATOR_HOST"] = previous


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[postgres_support.Cluster]:
    """A private PostgreSQL cluster for the session (tests/support/postgres.py)."""
    with postgres_support.running_cluster() as cluster:
        yield cluster


@pytest.fixture
def postgres_url(postgres_cluster: postgres_support.Cluster) -> str:
    """A store URL on the session's cluster, in a schema of this test's own (empty)."""
    return postgres_cluster.url(schema=postgres_support.fresh_schema())


@pytest.fixture(scope="session")
def spanner_emulator() -> Iterator[spanner_support.Emulator]:
    """Google's Spanner emulator for the session, its instance created, with
    SPANNER_EMULATOR_HOST set (inherited by spawned test processes)."""
    previous = os.environ.get("SPANNER_EMULATOR_HOST")
    for emulator in spanner_support.start_emulator():
        os.environ["SPANNER_EMULATOR_HOST"] = emulator.host
        try:
            yield emulator
        finally:
            if previous is None:
                os.environ.pop("SPANNER_EMULATOR_HOST", None)
            else:
                os.environ["SPANNER_EMULATOR_HOST"] = previous


@pytest.fixture
def spanner_database(spanner_emulator: spanner_support.Emulator) -> Iterator[str]:
    """A fresh database on the session's emulator (its path), dropped after the test."""
    path = spanner_support.create_database(spanner_emulator.host)
    yield path
    spanner_support.drop_database(spanner_emulator.host, path)


@pytest.fixture(autouse=True)
def _firestore_emulator_gaps(request: pytest.FixtureRequest) -> None:
    """Tests marked firestore_emulator_gap skip, with their reason, on the npm fallback only:
    Google's emulator and a real project have the property they test."""
    mark = request.node.get_closest_marker("firestore_emulator_gap")
    if mark is None:
        return
    request.getfixturevalue("firestore_host")
    if firestore_support.session.backend == firestore_support.NPM:
        pytest.skip(f"npm Firestore emulator gap: {mark.args[0]}")


@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(report: Any) -> Generator[None, Any, Any]:
    """A report as pytest-xdist's worker sends it, with every lone surrogate escaped: the
    channel encodes text as strict UTF-8, and a test's captured log may quote a name decoded
    with surrogateescape (``os.fsdecode(b"\\xff")``), which stopped the whole run."""
    data = yield
    return _encodable(data)


def _encodable(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_encodable(key): _encodable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_encodable(item) for item in value)
    return value


# Why a pytest-xdist worker's Firestore tests ran on the npm fallback, as the workers told the
# controlling process (which starts no emulator itself, so it cannot know).
_WORKERS_ON_NPM: list[str] = []


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On a pytest-xdist worker, pass on to the controller whether it fell back to npm."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None and firestore_support.session.backend == firestore_support.NPM:
        workeroutput["firestore_fallback"] = firestore_support.session.fallback_reason


class _WorkerReports:
    """pytest-xdist's hooks, registered only where it is installed: this conftest also runs in
    the fresh environments of the examples' own tests, which have no pytest-xdist."""

    @staticmethod
    def pytest_testnodedown(node: Any, error: Any) -> None:
        """On the controller, hear a worker's fallback."""
        if "firestore_fallback" in getattr(node, "workeroutput", {}):
            _WORKERS_ON_NPM.append(str(node.workeroutput["firestore_fallback"]))


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_WorkerReports(), "tasklease-worker-reports")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say at the end of the run, too, that the Firestore tests ran on the weaker fallback."""
    reasons = list(_WORKERS_ON_NPM)
    if firestore_support.session.backend == firestore_support.NPM:
        reasons.append(str(firestore_support.session.fallback_reason))
    if reasons:
        terminalreporter.section("Firestore emulator", sep="!", red=True, bold=True)
        terminalreporter.line(
            "Firestore tests ran on the npm fallback emulator, NOT Google's: "
            f"{reasons[0]}. Tests needing preconditions were skipped.",
            red=True,
            bold=True,
        )
