"""Cold start: from spawning gunicorn to the first 2xx answer, bare Flask vs the tasklease worker.

Cloud Run pays this on every scale-up. Both apps (bench.cold.bare, a Flask route, and
bench.cold.worker, tasklease on a MemoryStore with authentication off, each in a module of its
own so neither pays for the other's imports) run under the same gunicorn settings
(1 worker, 4 threads), in interleaved rounds so that machine noise hits both alike. Each round
spawns a fresh server, sends one delivery as soon as the port accepts, and stops the server.

    python -m bench.cold_start [--rounds 15]

Prints the median and spread of each, and the ratio of medians (goal: <= 1.25x); the ratio of
minimums beside it is the steadier of the two on a busy machine.

tasklease's modules are byte-compiled first, as ``pip install`` does for a wheel and as
Flask's already are in the environment: where ``PYTHONDONTWRITEBYTECODE`` is set, an
editable checkout would otherwise compile tasklease's source on every start (about 20 ms
here), which no installed worker does. ``--source`` measures that case.
"""

from __future__ import annotations

import argparse
import compileall
import http.client
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid

from bench.common import BENCH_DIR, ROOT, free_port

APPS = {"bare": "bench.cold.bare:app", "tasklease": "bench.cold.worker:app"}
HEADERS = {
    "Content-Type": "application/json",
    "X-CloudTasks-QueueName": "bench",
    "X-CloudTasks-TaskETA": "1792152000.5",
    "X-CloudTasks-TaskRetryCount": "0",
    "X-CloudTasks-TaskExecutionCount": "0",
}


def first_answer_seconds(app: str) -> float:
    """Spawn gunicorn serving ``app``; seconds until its first answer, which must be 2xx."""
    port = free_port()
    command = [
        sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}",
        "--workers", "1", "--threads", "4", "--log-level", "warning",
        APPS[app],
    ]  # fmt: skip
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    with (BENCH_DIR / "cold_start.log").open("ab") as log:
        started = time.perf_counter()
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)
    try:
        while True:
            try:
                probe = socket.create_connection(("127.0.0.1", port), timeout=30)
                break
            except ConnectionRefusedError:
                if process.poll() is not None or time.perf_counter() - started > 30:
                    raise RuntimeError(f"{app} did not start; see {log.name}") from None
                time.sleep(0.002)
        # The arbiter listens before its worker has imported the app: the request waits in
        # the backlog until the worker accepts it, so its answer marks the end of the start.
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.sock = probe
        connection.request(
            "POST",
            "/tasks/noop",
            b'{"order_id": 42}',
            {**HEADERS, "X-CloudTasks-TaskName": f"cold-{uuid.uuid4().hex}"},
        )
        response = connection.getresponse()
        response.read()
        elapsed = time.perf_counter() - started
        connection.close()
        if not 200 <= response.status < 300:
            raise RuntimeError(f"{app} answered {response.status} to its first delivery")
        return elapsed
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--source", action="store_true", help="do not byte-compile tasklease first")
    args = parser.parse_args()
    if not args.source:
        compileall.compile_dir(ROOT / "tasklease", quiet=1)
    first_answer_seconds("bare")  # Warm the page cache for both before measuring.
    first_answer_seconds("tasklease")
    times: dict[str, list[float]] = {app: [] for app in APPS}
    for _ in range(args.rounds):
        for app in APPS:
            times[app].append(first_answer_seconds(app))
    compiled = "tasklease from source" if args.source else "tasklease byte-compiled"
    print(
        f"cold start, gunicorn 1 worker x 4 threads, {args.rounds} interleaved rounds, {compiled}"
    )
    for app in APPS:
        values = sorted(times[app])
        print(
            f"  {app:<10} median {statistics.median(values) * 1000:6.0f} ms"
            f"  (min {values[0] * 1000:.0f}, max {values[-1] * 1000:.0f})"
        )
    ratio = statistics.median(times["tasklease"]) / statistics.median(times["bare"])
    fastest = min(times["tasklease"]) / min(times["bare"])
    print(
        f"  ratio tasklease / bare: {ratio:.2f}x of medians (goal <= 1.25x), "
        f"{fastest:.2f}x of minimums"
    )


if __name__ == "__main__":
    main()
