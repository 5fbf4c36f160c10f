"""tasklease without Django never imports it; tasklease.django without Django's Tasks
framework says what to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_importing_tasklease_the_worker_and_the_producer_imports_no_django() -> None:
    done = _python(
        "import sys, tasklease, tasklease.worker.serving.app, tasklease.producer,"
        " tasklease.django\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('django', 'django_tasks')]"
    )
    assert done.returncode == 0, done.stderr


def test_the_backend_without_djangos_tasks_framework_names_the_extra_to_install() -> None:
    done = _python(
        "import sys\n"
        "sys.modules['django.tasks'] = sys.modules['django_tasks'] = None\n"
        "from tasklease.django import CloudTasksBackend"
    )
    assert done.returncode != 0
    assert "pip install 'tasklease[django]'" in done.stderr
