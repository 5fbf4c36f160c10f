"""tasklease's test helpers, and its pytest plugin: test your handlers as Cloud Tasks and
Cloud Scheduler call them.

Installed with tasklease (entry point ``pytest11``), so the fixtures are there in any project
that depends on it:

- ``tasklease_queue``: a :class:`~tasklease.testing.stubs.StubQueue`. Enqueue with its
  ``producer`` (or by reference, ``handler.enqueue(...)``, after ``bind(router)``), look at
  ``tasks``, and ``drain(client, duplicate_every=0,
  lose_response_every=0)`` to deliver every pending task (and those they create) to a Flask
  test client.
- ``tasklease_scheduler``: a :class:`~tasklease.testing.stubs.StubScheduler`, with the
  ``[[job]]`` schedules of the project's ``tasklease.toml``; ``bind(router)`` adds the
  schedules declared in code (``@router.scheduled(..., schedule=...)``, the toml's tables
  over them); ``fire(client, job, at=..., manual=False)``.
- ``tasklease_simulation``: a :class:`~tasklease.testing.simulation.user_router.UserSimulation`,
  the seeded simulation over your own router: handlers report each step of their effect with
  ``tasklease_simulation.effect(ctx, "resource", final=...)``;
  ``run(router, tasks=[(name, payload)], jobs=[name], seed=, lifecycles=, store="memory",
  faults=None)`` runs them under kills, stalls, duplicates, lost answers, store faults and
  clock skew on virtual time, and returns a report whose violations (fencing, idempotency
  keys, effects after acknowledgement, lifecycles never settled) each say how to replay it;
  ``assert_clean(report)`` fails the test listing the first.

The package's modules: :mod:`.stubs` (the stub queue and scheduler, usable without pytest),
:mod:`.google_apis` (``FakeGoogleApis``: Workflows, Cloud Run and Cloud Build on loopback gRPC,
for the proxy targets) and :mod:`.store_contract` (the suites a store of your own inherits to
prove itself: ``class TestMyStore(StoreContract): ...`` with a ``store`` fixture).

Importing this package has no side effects and imports neither Flask nor Google's clients: the
fixtures do, when a test asks for them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tasklease.testing.simulation.user_router import UserSimulation
    from tasklease.testing.stubs import StubQueue, StubScheduler

# pytest rewrites the asserts of plugin modules only: the contract suites' failures should
# say what differed in a user's store too.
pytest.register_assert_rewrite(
    "tasklease.testing.store_contract",
    "tasklease.testing.lock_contract",
    "tasklease.testing.operations_contract",
)

CONFIG_INI = "tasklease_config"
CONFIG_NAME = "tasklease.toml"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        CONFIG_INI,
        f"the {CONFIG_NAME} whose [[job]] schedules tasklease_scheduler knows "
        f"(default: {CONFIG_NAME} in the rootdir, if there is one)",
        default="",
    )


@pytest.fixture
def tasklease_queue() -> Iterator[StubQueue]:
    """An in-memory Cloud Tasks queue with a producer, delivering to a Flask test client."""
    from tasklease.testing.stubs import StubQueue  # noqa: PLC0415 - only tests that use it pay.

    queue = StubQueue()
    yield queue
    queue.close()


@pytest.fixture
def tasklease_scheduler(request: pytest.FixtureRequest) -> StubScheduler:
    """Cloud Scheduler deliveries (scheduled and manual runs) to a Flask test client."""
    from tasklease.testing.stubs import StubScheduler  # noqa: PLC0415

    scheduler = StubScheduler()
    configured = str(request.config.getini(CONFIG_INI))
    root = request.config.rootpath
    config = root / configured if configured else root / CONFIG_NAME
    if configured and not config.is_file():
        raise pytest.UsageError(f"{CONFIG_INI} = {configured!r}: no file {config}")
    if config.is_file():
        scheduler.load(Path(config))
    return scheduler


@pytest.fixture
def tasklease_simulation(request: pytest.FixtureRequest, tmp_path: Path) -> UserSimulation:
    """The seeded simulation over the test's own router (its SQLite files in tmp_path)."""
    from tasklease.testing.simulation.user_router import UserSimulation  # noqa: PLC0415

    return UserSimulation(tmp_path, test=request.node.nodeid)
