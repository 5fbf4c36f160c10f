"""Every error a public package exports is a TaskleaseError, so one ``except TaskleaseError``
catches whatever tasklease raises for a failure; only the handler's signals stand apart."""

from __future__ import annotations

import importlib

import pytest

from tasklease.errors import LeaseLost, PermanentFailure, TaskleaseError

PUBLIC = (
    "tasklease",
    "tasklease.worker",
    "tasklease.worker.stores",
    "tasklease.outbox",
    "tasklease.producer",
    "tasklease.emulator",
    "tasklease.testing",
)


def exported_errors(package: str) -> list[type[BaseException]]:
    module = importlib.import_module(package)
    exported = (getattr(module, name) for name in getattr(module, "__all__", ()))
    return [
        value for value in exported if isinstance(value, type) and issubclass(value, BaseException)
    ]


@pytest.mark.parametrize("package", PUBLIC)
def test_every_exported_error_derives_from_the_root(package: str) -> None:
    outside = [
        error.__name__
        for error in exported_errors(package)
        if not issubclass(error, TaskleaseError | PermanentFailure | LeaseLost)
    ]
    assert outside == []


def test_the_outbox_refusal_is_still_a_value_error() -> None:
    from tasklease.outbox import NotInTransaction  # noqa: PLC0415

    assert issubclass(NotInTransaction, TaskleaseError)
    assert issubclass(NotInTransaction, ValueError)
