"""The simulation on every store: at least 2,000 lifecycles each under every fault kind, and
no violation. Each store's service (Postgres, the Firestore and Spanner emulators) is the real
one, started for the session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasklease.testing.simulation import FAULT_KINDS, simulate
from tasklease.testing.simulation.stores import store_factory

# The seed each store runs; its replay command is in any violation's text.
SEED = 2026
LIFECYCLES = int(os.environ.get("TASKLEASE_SIMULATION_LIFECYCLES", "2000"))

STORES = [
    "memory",
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.service),
    pytest.param("firestore", marks=pytest.mark.service),
    pytest.param("spanner", marks=pytest.mark.service),
]


@pytest.fixture(params=STORES)
def store_name(request: pytest.FixtureRequest) -> Iterator[str]:
    """A store kind, its service running and the environment pointing at it."""
    name: str = request.param
    with pytest.MonkeyPatch.context() as env:
        if name == "postgres":
            env.setenv("TASKLEASE_STORE", request.getfixturevalue("postgres_cluster").url())
        elif name == "firestore" and request.getfixturevalue("firestore_host") is None:
            pytest.skip("the simulation runs on the Firestore emulator only")
        elif name == "spanner":
            request.getfixturevalue("spanner_emulator")
        yield name


def test_thousands_of_lifecycles_under_every_fault_break_nothing(
    store_name: str, tmp_path: Path
) -> None:
    report = simulate(
        store_factory(store_name, tmp_path), seed=SEED, lifecycles=LIFECYCLES, store_name=store_name
    )

    assert report.violations == (), "\n".join(report.violations[:5])
    assert report.lifecycles == LIFECYCLES
    assert set(report.faults) == set(FAULT_KINDS)
