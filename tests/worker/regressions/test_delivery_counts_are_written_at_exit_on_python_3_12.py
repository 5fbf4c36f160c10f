"""The last delivery counts are written at exit on Python 3.12 too: 3.12 refuses to start a
thread from an atexit callback ("can't create new thread at interpreter shutdown"), so an
exit flush on a thread of its own printed a traceback and dropped the counts."""

from __future__ import annotations

import subprocess
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from tasklease.worker.stores import SqliteStore
from tests.support.python312 import python312

ROOT = Path(__file__).resolve().parents[3]

# Stdlib only below tasklease's tally flusher and SQLite store: no venv needed.
SCRIPT = """
import sys
from datetime import UTC, datetime
sys.path.insert(0, sys.argv[1])
from tasklease.worker.stores import SqliteStore
from tasklease.worker.observe.tally_flusher import DeliveryCounter
counter = DeliveryCounter(SqliteStore(sys.argv[2]), lambda: datetime.now(UTC), interval=3600)
counter.count("task", "charge", "processed")
counter.count("task", "charge", "duplicate")
"""


def test_a_python_3_12_process_writes_its_delivery_counts_when_it_exits(tmp_path: Path) -> None:
    database = tmp_path / "runs.db"
    done = subprocess.run(
        [python312(), "-I", "-c", SCRIPT, ROOT, database],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "can't create new thread" not in done.stderr
    assert done.stderr == ""
    store = SqliteStore(database)
    try:
        counts: Counter[str] = Counter()
        for keyed in store.delivery_counts(datetime(2000, 1, 1, tzinfo=UTC)).values():
            for key, n in keyed.items():
                counts[key.outcome] += n
    finally:
        store.close()
    assert counts == Counter({"processed": 1, "duplicate": 1})
