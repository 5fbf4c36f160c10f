"""The Django app's tests again on PostgreSQL: Django's psycopg 3 backend, its raw
connection inside ``atomic()`` staging the outbox entry, the relay reading it back."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg

from tests.support import postgres as postgres_support

ROOT = Path(__file__).resolve().parents[2]


def test_the_django_apps_tests_pass_on_postgres(
    postgres_cluster: postgres_support.Cluster,
) -> None:
    database = f"django_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_cluster.url(), autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{database}"')
    env = {**os.environ, "TASKLEASE_DJANGO_TEST_POSTGRES": postgres_cluster.url(database)}
    done = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "tests/django_project/test_django_app.py",
        ],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout
