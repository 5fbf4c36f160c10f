"""The simulation's ledgers and stores: a transactional handler's (or step's) ledger row,
written through ``ctx.transaction`` by the real app, is there exactly when its transaction
committed, on each store with transactions; and each kind of store a simulation asks for.

One store per backend for the module (its service started once for the session); each test
empties its ledger first and delivers tasks of its own."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from werkzeug.test import TestResponse

from tasklease.errors import ConfigurationError
from tasklease.testing.simulation.ledgers import EffectLedger, LedgerRow, ledger_for
from tasklease.testing.simulation.stores import STORE_NAMES, store_factory
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.stores import LeaseStore, MemoryStore, PostgresStore, SqliteStore
from tests.support.helpers import task_headers

BACKENDS = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.service),
    pytest.param("firestore", marks=pytest.mark.service),
    pytest.param("spanner", marks=pytest.mark.service),
]


@pytest.fixture(scope="module", params=BACKENDS)
def backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LeaseStore, EffectLedger]]:
    """A fresh store of the kind, made by the simulation's own factory, and its ledger."""
    name: str = request.param
    with pytest.MonkeyPatch.context() as env:
        if name == "postgres":
            cluster = request.getfixturevalue("postgres_cluster")
            env.setenv("TASKLEASE_STORE", cluster.url())
        elif name == "firestore" and request.getfixturevalue("firestore_host") is None:
            pytest.skip("the simulation runs on the Firestore emulator only")
        elif name == "spanner":
            request.getfixturevalue("spanner_emulator")
        store = store_factory(name, tmp_path_factory.mktemp("stores"))()
        ledger = ledger_for(store)
        assert ledger is not None
        try:
            yield store, ledger
        finally:
            ledger.close()
            store.close()


@pytest.fixture
def store(backend: tuple[LeaseStore, EffectLedger]) -> LeaseStore:
    return backend[0]


@pytest.fixture
def ledger(backend: tuple[LeaseStore, EffectLedger]) -> EffectLedger:
    ledger = backend[1]
    ledger.prepare()  # Empty: what earlier tests of the module left is gone.
    return ledger


def _deliver(store: LeaseStore, router: Router, task: str, retry: int = 0) -> TestResponse:
    client = create_app(router, store=store, auth="none").test_client()
    return client.post(
        "/tasks/charge", headers=task_headers(task=task, retry=retry, execution=retry), data=b"{}"
    )


def _task() -> str:
    return f"task-{uuid.uuid4().hex[:8]}"


def test_a_committed_handler_leaves_one_row_however_often_delivered(
    store: LeaseStore, ledger: EffectLedger
) -> None:
    router = Router()
    attempts: list[LedgerRow] = []

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        row = LedgerRow(ctx.run_id, ctx.attempt_id, "charge")
        attempts.append(row)
        ledger.write(ctx.transaction, row)

    task = _task()
    answer = _deliver(store, router, task)
    assert answer.status_code == 200
    assert answer.headers["X-Tasklease-Outcome"] == "processed"
    assert ledger.rows() == attempts
    assert _deliver(store, router, task, retry=1).headers["X-Tasklease-Outcome"] == "duplicate"
    assert ledger.rows() == attempts  # One attempt ran, one row: the duplicate wrote none.


def test_a_handler_that_writes_then_raises_leaves_no_row(
    store: LeaseStore, ledger: EffectLedger
) -> None:
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        ledger.write(ctx.transaction, LedgerRow(ctx.run_id, ctx.attempt_id, "charge"))
        raise RuntimeError("after the ledger's row")

    answer = _deliver(store, router, _task())
    assert answer.headers["X-Tasklease-Outcome"] == "released"
    assert ledger.rows() == []


def test_a_transactional_steps_row_commits_with_its_step_and_a_raising_one_leaves_none(
    store: LeaseStore, ledger: EffectLedger
) -> None:
    router = Router()
    written: list[LedgerRow] = []

    @router.task("charge")
    def charge(payload: Any, ctx: TaskContext) -> None:
        def step(tx: Any, name: str) -> None:
            row = LedgerRow(ctx.run_id, ctx.attempt_id, f"step:{name}")
            ledger.write(tx, row)
            if name == "b":
                raise RuntimeError("after the step's row")
            written.append(row)

        ctx.step("a", step, "a", transactional=True)
        ctx.step("b", step, "b", transactional=True)

    answer = _deliver(store, router, _task())
    assert answer.headers["X-Tasklease-Outcome"] == "released"
    assert [row.effect for row in written] == ["step:a"]
    assert ledger.rows() == written


def test_rows_come_back_sorted_and_prepare_empties_them(
    store: LeaseStore, ledger: EffectLedger
) -> None:
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        for effect in ("z", "a", "a"):  # The same effect twice is two rows.
            ledger.write(ctx.transaction, LedgerRow(ctx.run_id, ctx.attempt_id, effect))

    assert _deliver(store, router, _task()).headers["X-Tasklease-Outcome"] == "processed"
    assert [row.effect for row in ledger.rows()] == ["a", "a", "z"]
    ledger.prepare()
    ledger.prepare()
    assert ledger.rows() == []


def test_a_store_without_transactions_has_no_ledger() -> None:
    assert ledger_for(MemoryStore()) is None


def test_each_store_of_a_kind_is_a_new_one(tmp_path: Path) -> None:
    assert isinstance(store_factory("memory", tmp_path)(), MemoryStore)
    fresh = store_factory("sqlite", tmp_path / "sims")
    first, second = fresh(), fresh()
    assert isinstance(first, SqliteStore) and isinstance(second, SqliteStore)
    assert first.path != second.path and first.path.parent == tmp_path / "sims"
    first.close()
    second.close()


def test_postgres_stores_decide_by_the_clock_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TASKLEASE_STORE", "postgresql://u@127.0.0.1:1/db?schema=mine")
    fresh = store_factory("postgres", tmp_path)
    first, second = fresh(), fresh()  # Nothing connects before a store's first call.
    assert isinstance(first, PostgresStore) and isinstance(second, PostgresStore)
    assert first.options.schema != second.options.schema != "mine"
    assert not first.options.server_clock and not first.options.group_commit
    first.close()
    second.close()


def test_an_unknown_store_names_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown store 'mysql': choose one of memory, sqlite"):
        store_factory("mysql", tmp_path)
    assert STORE_NAMES == ("memory", "sqlite", "postgres", "firestore", "spanner")


@pytest.mark.parametrize(
    ("name", "variable", "how"),
    [
        ("postgres", "TASKLEASE_STORE", "pg_ctlcluster"),
        ("firestore", "FIRESTORE_EMULATOR_HOST", "gcloud emulators firestore start"),
        ("spanner", "SPANNER_EMULATOR_HOST", "gcloud emulators spanner start"),
    ],
)
def test_a_missing_service_names_its_variable_and_how_to_start_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, variable: str, how: str
) -> None:
    monkeypatch.delenv(variable, raising=False)
    with pytest.raises(ConfigurationError, match=variable) as raised:
        store_factory(name, tmp_path)
    assert how in str(raised.value)


def test_a_store_url_of_another_kind_is_no_postgres(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TASKLEASE_STORE", "sqlite:///runs.db")
    with pytest.raises(ConfigurationError, match=re.escape("it is 'sqlite:///runs.db'")):
        store_factory("postgres", tmp_path)
