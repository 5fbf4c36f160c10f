"""Fixtures of the fault suite: the reduced scale by default, ``TASKLEASE_FAULTS=full`` for
``make faults``; each scenario prints its counts line."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.faults.harness import FULL, Backend, Tally
from tests.support import firestore as firestore_support
from tests.support import postgres as postgres_support

REPORT_FILE = os.environ.get("TASKLEASE_FAULTS_REPORT")


@pytest.fixture
def report(capsys: pytest.CaptureFixture[str]) -> Callable[[str, Tally], None]:
    """Print a scenario's counts line (past pytest's capture), and append it to
    ``TASKLEASE_FAULTS_REPORT`` if set."""

    def emit(name: str, counts: Tally) -> None:
        line = counts.line(f"{name}{'' if FULL else ' (reduced)'}")
        with capsys.disabled():
            print(f"\n{line}")
        if REPORT_FILE:
            with Path(REPORT_FILE).open("a") as out:
                out.write(line + "\n")

    return emit


# The storm and kill scenarios run on Firestore only where transactions are isolated and
# preconditions enforced (Google's emulator, a real project): not on the npm fallback.
NEEDS_ISOLATION = pytest.mark.firestore_emulator_gap(
    "the npm Firestore emulator neither isolates transactions nor enforces preconditions, so "
    "two claims of one run can both succeed there"
)


@pytest.fixture(params=["gunicorn", "uvicorn"])
def server_kind(request: pytest.FixtureRequest) -> str:
    """The server a parametrized scenario's workers run under: gunicorn (tasklease.worker.
    wsgi) or uvicorn (tasklease.worker.asgi). Outside the full suite uvicorn runs on SQLite
    only: name this fixture before ``backend`` so the skip comes before any store starts."""
    callspec = getattr(request.node, "callspec", None)
    params = callspec.params if callspec is not None else {}
    store = params.get("backend", params.get("backend_sql", "sqlite"))
    if request.param == "uvicorn" and store != "sqlite" and not FULL:
        pytest.skip("uvicorn runs on SQLite only outside the full suite (TASKLEASE_FAULTS=full)")
    return str(request.param)


def _stores(*reduced: str) -> list[Any]:
    """The four stores as fixture params; those not in ``reduced`` run in the full suite
    only (``make faults``), to keep ``make test`` within its time."""
    params = []
    for store in ("sqlite", "firestore", "postgres", "spanner"):
        marks = [NEEDS_ISOLATION] if store == "firestore" else []
        if store not in reduced:
            reason = f"on {store.capitalize()} in the full suite only"
            marks.append(pytest.mark.skipif(not FULL, reason=reason))
        params.append(pytest.param(store, marks=marks))
    return params


@pytest.fixture(params=_stores("sqlite", "firestore", "postgres", "spanner"))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """The store a parametrized scenario runs on: a SQLite file, a fresh Firestore
    collection on the session's emulator (FIRESTORE_EMULATOR_HOST is inherited), a fresh
    schema on the session's private PostgreSQL cluster, or a fresh database on the session's
    Spanner emulator (SPANNER_EMULATOR_HOST likewise)."""
    return _backend(request, tmp_path)


@pytest.fixture(params=_stores("sqlite", "postgres"))
def backend_sql(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Like ``backend``, with the Firestore and Spanner variants left to ``make faults``:
    the storm and kill scenarios on Google's emulators are the slowest of the reduced run."""
    return _backend(request, tmp_path)


@pytest.fixture(params=_stores("sqlite"))
def backend_full(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Like ``backend``, with the Firestore, Postgres and Spanner variants left to ``make
    faults`` (time)."""
    return _backend(request, tmp_path)


def _backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return Backend("sqlite", f"sqlite:///{tmp_path}/runs.db")
    if request.param == "postgres":
        cluster: postgres_support.Cluster = request.getfixturevalue("postgres_cluster")
        return Backend("postgres", cluster.url(schema=postgres_support.fresh_schema()))
    if request.param == "spanner":
        database = request.getfixturevalue("spanner_database")
        return Backend("spanner", f"spanner://{database}")
    request.getfixturevalue("firestore_host")
    project = os.environ.get("GOOGLE_CLOUD_PROJECT", firestore_support.PROJECT)
    # For the test's own reads of the records; undone after the test.
    request.getfixturevalue("monkeypatch").setenv("GOOGLE_CLOUD_PROJECT", project)
    collection = f"faults_{uuid.uuid4().hex[:12]}"
    return Backend(
        "firestore",
        f"firestore://?collection={collection}",
        {"GOOGLE_CLOUD_PROJECT": project},
    )
