"""What the emulator promises under load: a task whose create returned survives a crash, and a
task name stays taken, exactly, while creates race the dispatches that delete the tasks.

The creates and the dispatch records share transactions (a group commit), so these run many
of them at once: a batch that answered before it committed, or a create that slipped between a
dispatch's delete and its tombstone, would show here.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import grpc
import pytest
from google.api_core import exceptions as api
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import tasks_v2
from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport

from tasklease.emulator import CloudTasksEmulator
from tests.emulator.test_emulator_cli import free_port
from tests.support.emulator_target import Target

QUEUE = "projects/p/locations/us-central1/queues/q"


def http_task(url: str, task_id: str) -> tasks_v2.Task:
    return tasks_v2.Task(name=f"{QUEUE}/tasks/{task_id}", http_request={"url": url})


def test_every_created_task_survives_a_kill_mid_load(tmp_path: Path) -> None:
    port, grpc_port = free_port(), free_port()
    command = [
        *(sys.executable, "-m", "tasklease.cli", "emulator"),
        *("--port", str(port), "--grpc-port", str(grpc_port)),
        *("--data-dir", str(tmp_path / "data")),
    ]
    log = tmp_path / "emulator.log"
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    created: list[str] = []
    try:
        deadline = time.monotonic() + 30
        while f"gRPC on 127.0.0.1:{grpc_port}" not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        rest = tasks_v2.CloudTasksClient(
            transport="rest",
            client_options=ClientOptions(api_endpoint=f"http://127.0.0.1:{port}"),
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        )
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        grpc_client = tasks_v2.CloudTasksClient(transport=CloudTasksGrpcTransport(channel=channel))
        rest.create_queue(parent=QUEUE.rsplit("/queues/", 1)[0], queue=tasks_v2.Queue(name=QUEUE))
        rest.pause_queue(name=QUEUE)  # Kept, not dispatched: all must be there after the kill.

        def create(n: int) -> None:
            client = grpc_client if n % 2 else rest
            client.create_task(parent=QUEUE, task=http_task("http://127.0.0.1:9/x", f"t{n}"))
            created.append(f"t{n}")  # Only once the create returned.

        with ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(create, n) for n in range(400)]
            while len(created) < 200:
                time.sleep(0.001)
            process.send_signal(signal.SIGKILL)  # Creates still in flight: some fail, fine.
            for future in futures:
                future.exception()
    finally:
        process.kill()
        process.wait()
    with CloudTasksEmulator(data_dir=tmp_path / "data") as emulator:
        stored = {name.rsplit("/", 1)[1] for name in _task_names(emulator)}
    assert len(created) >= 200
    assert set(created) <= stored


def _task_names(emulator: CloudTasksEmulator) -> list[str]:
    return [row.name for row in emulator.db.list_tasks(QUEUE, 10_000, 0)]


@pytest.mark.parametrize("transport", ["grpc", "rest"])
def test_a_name_stays_taken_while_creates_race_its_dispatch(
    target: tuple[Target, str], transport: str
) -> None:
    recorder, url = target
    names = [f"race-{n}" for n in range(150)]
    refused: Counter[str] = Counter()
    accepted: Counter[str] = Counter()
    with CloudTasksEmulator() as emulator:
        emulator.create_queue(QUEUE)
        client = emulator.client(transport)

        def create(task_id: str) -> None:
            try:
                client.create_task(parent=QUEUE, task=http_task(url, task_id))
                accepted[task_id] += 1
            except api.Conflict:  # AlreadyExists over gRPC is a Conflict too.
                refused[task_id] += 1

        # Each name created 4 times at once, while the first of them is being dispatched.
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(create, [name for name in names for _ in range(4)]))
            emulator.join()
            list(pool.map(create, names))  # After they ran: still taken (tombstones).
        emulator.join()
    assert accepted == Counter(names)
    assert refused == Counter({name: 4 for name in names})
    delivered = Counter(hit.headers["X-Cloudtasks-Taskname"] for hit in recorder.hits)
    assert delivered == Counter(names)


def test_kill_leaves_no_write_half_done(tmp_path: Path) -> None:
    """A killed writer leaves a batch committed whole or not at all: no task is both pending
    and tombstoned (a dispatch's tombstone and delete are one change of one transaction)."""
    code = (
        "import os, sys, threading\n"
        "from pathlib import Path\n"
        "from tasklease.emulator.db import EmulatorDB\n"
        "from tasklease.emulator.rows import TaskRow\n"
        "db = EmulatorDB(Path(sys.argv[1]) / 'emulator.db')\n"
        f"queue = {QUEUE!r}\n"
        "def work(k):\n"
        "    for n in range(100000):\n"
        "        name = f'{queue}/tasks/w{k}-{n}'\n"
        "        row = TaskRow(name, queue, {'name': name}, 0, 0, 0, 0, None, None, None, None,"
        " None, False)\n"
        "        db.insert_task(row, 0)\n"
        "        db.finish_attempt(name, delete=n % 2 == 0, now_us=1, schedule_us=1,"
        " responded=True, attempt={}, previous_response=None, retry_reason=None)\n"
        "for k in range(8):\n"
        "    threading.Thread(target=work, args=(k,)).start()\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=_root())
    try:
        deadline = time.monotonic() + 60
        while _count(tmp_path, "tombstones") < 500:  # Well into its writes.
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        os.kill(process.pid, signal.SIGKILL)
    process.wait()
    with closing(sqlite3.connect(tmp_path / "emulator.db")) as db:
        pending = {name for (name,) in db.execute("SELECT name FROM tasks")}
        tombstoned = {name for (name,) in db.execute("SELECT name FROM tombstones")}
    assert pending and tombstoned
    assert not pending & tombstoned


def _count(folder: Path, table: str) -> int:
    try:  # Read-only: a connection that created the file would plant a 0644 database.
        with closing(sqlite3.connect(f"file:{folder / 'emulator.db'}?mode=ro", uri=True)) as db:
            return int(db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
    except sqlite3.OperationalError:  # Not created yet.
        return 0


def _root() -> Path:
    return Path(__file__).resolve().parents[2]
