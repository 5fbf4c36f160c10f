"""The transactional outbox's table, as ``tasklease outbox migrate`` creates it."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

from tasklease.outbox import ddl
from tasklease.outbox.entries import TABLE


def _create(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    if vendor not in ddl.DIALECTS:
        return  # No outbox on this database: an enqueue inside its atomic() is refused.
    for statement in ddl.statements(vendor):
        schema_editor.execute(statement)


def _drop(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor in ddl.DIALECTS:
        schema_editor.execute(f"DROP TABLE IF EXISTS {TABLE}")


class Migration(migrations.Migration):  # type: ignore[misc] # Django ships no types.
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [migrations.RunPython(_create, _drop)]
