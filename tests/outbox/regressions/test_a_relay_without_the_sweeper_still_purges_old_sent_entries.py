"""Finding: only the sweeper job deleted sent outbox entries, so a deployment relaying with
``tasklease outbox relay --follow`` or a ``RelayThread`` and no sweeper kept every entry it
ever sent: the table grew forever. The relay itself now deletes sent entries older than
``keep_sent`` (7 days), at most ``purge_limit`` per delete, every ``purge_every`` seconds (at
once again while a purge finds a full batch)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from tasklease.outbox import Relay, open_outbox, relay_producer
from tests.support.fake_cloud_tasks import FakeCloudTasks
from tests.support.outbox import producer, relay_env, sqlite_app_db

DAY = 24 * 3600.0


def _rows(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT state, COUNT(*) FROM tasklease_outbox GROUP BY state")
        counts = dict(rows.fetchall())
    conn.close()
    return counts


def test_a_following_relay_deletes_sent_entries_past_their_retention_in_bounded_batches(
    tmp_path: Path, cloud_tasks: FakeCloudTasks
) -> None:
    path = tmp_path / "app.db"
    url = sqlite_app_db(path)
    conn = sqlite3.connect(path)
    conn.execute("BEGIN")
    items: list[tuple[str, Any]] = [(f"k{n}", {}) for n in range(7)]
    producer(cloud_tasks.endpoint).enqueue_many("x", items, transaction=conn)
    conn.commit()
    conn.close()
    now = [time.time()]
    db = open_outbox(url)
    try:
        relay = Relay(
            db,
            relay_producer(relay_env(cloud_tasks.endpoint)),
            clock=lambda: now[0],
            purge_limit=2,
            purge_every=600.0,
        )
        assert relay.drain().sent == 7
        with sqlite3.connect(path) as raw:  # Five of them sent more than a week ago.
            raw.execute(
                "UPDATE tasklease_outbox SET sent_at = ? WHERE rowid IN "
                "(SELECT rowid FROM tasklease_outbox LIMIT 5)",
                (now[0] - 8 * DAY,),
            )
        raw.close()
        now[0] += 600  # The first drain purged (nothing yet): the next purge is due now.
        purged = [relay.drain().purged for _ in range(4)]  # Full batches: again at once.
        now[0] += 60  # Not yet due: the last purge found less than a full batch.
        purged.append(relay.drain().purged)
        fresh_sent = _rows(path)
        now[0] += 8 * DAY  # The two sent a moment ago are old now, and a purge is due.
        purged.append(relay.drain().purged)
    finally:
        db.close()
    assert purged == [2, 2, 1, 0, 0, 2]
    assert fresh_sent == {"sent": 2}
    assert _rows(path) == {}
