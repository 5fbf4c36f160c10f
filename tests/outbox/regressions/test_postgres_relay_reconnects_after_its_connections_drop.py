"""Finding: a following relay on Postgres (``RelayThread``, ``tasklease outbox relay --follow``,
the relay of ``tasklease dev``) kept the two connections it opened for good. When the server
dropped them (a restart, a failover, an idle-connection reaper, ``pg_terminate_backend``),
every later round failed on the closed connection, and a failed LISTEN ended the relay's
thread: entries committed after that were never relayed by it, while the process looked
alive. A dropped connection is opened again on the next round."""

from __future__ import annotations

import time

from tasklease.emulator import CloudTasksEmulator
from tasklease.outbox import RelayThread, relay_producer
from tasklease.producer import task_id
from tests.support import postgres as postgres_support
from tests.support.outbox import pg_connect, producer, relay_env, task_names


def _wait_created(emulator: CloudTasksEmulator, name: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if name in task_names(emulator):
            return True
        time.sleep(0.1)
    return False


def _drop_other_connections(cluster: postgres_support.Cluster) -> int:
    """What a server restart or a proxy does to the relay: its sessions end under it."""
    rows = cluster.sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
    )
    return len(rows or [])


def test_a_following_postgres_relay_relays_entries_committed_after_its_connections_dropped(
    pg_url: str, tasks: CloudTasksEmulator, postgres_cluster: postgres_support.Cluster
) -> None:
    make = producer(tasks.url)
    with RelayThread(pg_url, relay_producer(relay_env(tasks.url)), poll=0.2):
        with pg_connect(pg_url) as conn:
            make.enqueue("send_receipt", {}, key="before", transaction=conn)
        assert _wait_created(tasks, task_id("send_receipt", "before"), timeout=20)
        assert _drop_other_connections(postgres_cluster) >= 2  # The relay's two.
        with pg_connect(pg_url) as conn:
            make.enqueue("send_receipt", {}, key="after", transaction=conn)
        assert _wait_created(tasks, task_id("send_receipt", "after"), timeout=20)
