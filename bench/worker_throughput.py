"""Throughput of the exactly-once route against a bare Flask route, under real gunicorn.

Three servers, one gunicorn configuration (2 workers, 4 threads each, or ``--threads``): a bare
Flask route doing a trivial handler's work, and tasklease serving the same work on MemoryStore
and on SqliteStore (durable: synchronous=FULL), and with ``--stores postgres`` on PostgresStore
(a private PostgreSQL cluster on the same cores, fsync on, started and stopped by the
benchmark; ``postgres_solo``: the same with group commit off, each statement its own commit;
a pool of one connection per gunicorn thread). Each is driven by wrk (Debian's package;
``make bench`` installs it) with a new task name per request (first executions) and one
repeated name marked as a retry (duplicates).
Servers are measured one after another within each round, so machine noise hits them all; quote
the ratios of one round. A server is stopped, and has exited, before the next starts (a SQLite
server checkpoints its WAL while it shuts down).

    python -m bench.worker_throughput [--rounds 2] [--seconds 8] [--stores memory,sqlite]

Without wrk a Python load generator stands in, with a warning: it is slower than the servers
it drives, so its ratios understate the differences.
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from bench.common import BENCH_DIR, ROOT, free_port, wait_for_port
from bench.postgres_floor import private_postgres

WRK_SCRIPTS = ROOT / "bench" / "wrk"
HEADERS = {
    "Content-Type": "application/json",
    "X-CloudTasks-QueueName": "bench",
    "X-CloudTasks-TaskETA": "1792152000.5",
}
BODY = b'{"order_id": 42}'


@dataclass(frozen=True)
class Load:
    """What one load run measured."""

    rate: float  # Requests per second.
    p50_ms: float
    p99_ms: float
    failures: int  # Answers that were not 2xx (in_progress races for duplicates, ...).
    requests: int = 0
    cpu_us: float = 0.0  # CPU (user + system) the server's workers spent per request.


# Threads per gunicorn worker, the same for every server of a run (``--threads``).
THREADS = 4


class Server:
    """One gunicorn server of bench.throughput_apps, started and fully stopped."""

    def __init__(self, app: str, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [
            sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{self.port}",
            "--workers", "2", "--threads", str(THREADS), "--log-level", "warning",
            f"bench.throughput_apps:{app}",
        ]  # fmt: skip
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as output:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env={**os.environ, **env}, stdout=output, stderr=output
            )
        wait_for_port(self.port)
        for index in range(20):  # Every worker imported the app and answers.
            post(self.port, f"warm-{uuid.uuid4().hex}-{index}", retry=0)
        time.sleep(1.0)

    def worker_cpu_seconds(self) -> float:
        """CPU time (user + system) the server's worker processes have used so far."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        total = 0
        for pid in children.read_text().split():
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (stat fields 14, 15).
        return total / os.sysconf("SC_CLK_TCK")

    def measure(self, drive: Drive, script: str, seconds: int) -> Load:
        """Drive the server; the load it sustained, with its workers' CPU per request."""
        before = self.worker_cpu_seconds()
        load = drive(self.url, script, seconds)
        spent = self.worker_cpu_seconds() - before
        return replace(load, cpu_us=spent / max(load.requests, 1) * 1e6)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        time.sleep(1.0)


Drive = Callable[[str, str, int], Load]


def post(port: int, task: str, retry: int, token: str | None = None) -> int:
    """One delivery of ``task``; ``token``, when given, as its OIDC ID token."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {
            **HEADERS,
            "X-CloudTasks-TaskName": task,
            "X-CloudTasks-TaskRetryCount": str(retry),
            "X-CloudTasks-TaskExecutionCount": str(retry),
            **_bearer(token),
        }
        connection.request("POST", "/tasks/noop", BODY, headers)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def _bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def run_wrk(url: str, script: str, seconds: int, token: str | None = None) -> Load:
    """wrk on ``script`` (bench/wrk/), sending ``token`` as every request's OIDC ID token."""
    script_path = str(WRK_SCRIPTS / script)
    nonce = uuid.uuid4().hex[:12]
    command = ["wrk", "-t2", "-c16", f"-d{seconds}s", "--latency", "-s", script_path, url]
    output = subprocess.run(
        [*command, "--", nonce, *([token] if token else [])],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rate = float(_field(output, r"Requests/sec:\s+([\d.]+)"))
    failures = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    return Load(
        rate,
        _millis(_field(output, r"\n\s+50%\s+(\S+)")),
        _millis(_field(output, r"\n\s+99%\s+(\S+)")),
        int(failures.group(1)) if failures else 0,
        int(_field(output, r"(\d+) requests in")),
    )


def run_python(url: str, script: str, seconds: int, token: str | None = None) -> Load:
    """A stand-in for wrk: 16 keep-alive connections from threads."""
    port = int(url.rsplit(":", 1)[1])
    nonce = uuid.uuid4().hex[:12]
    deadline = time.monotonic() + seconds
    latencies: list[float] = []
    failures = 0
    lock = threading.Lock()

    def drive(worker: int) -> None:
        nonlocal failures
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        count = 0
        while time.monotonic() < deadline:
            count += 1
            first = script == "first.lua"
            headers = {
                **HEADERS,
                "X-CloudTasks-TaskName": f"t-{nonce}-{worker}-{count}" if first else "same-task",
                "X-CloudTasks-TaskRetryCount": "0" if first else "1",
                **_bearer(token),
            }
            started = time.perf_counter()
            connection.request("POST", "/tasks/noop", BODY, headers)
            response = connection.getresponse()
            response.read()
            with lock:
                latencies.append(time.perf_counter() - started)
                failures += not 200 <= response.status < 300
        connection.close()

    threads = [threading.Thread(target=drive, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cuts = statistics.quantiles(latencies, n=100)
    count = len(latencies)
    return Load(count / seconds, cuts[49] * 1000, cuts[98] * 1000, failures, count)


def _field(text: str, pattern: str) -> str:
    match = re.search(pattern, text)
    if match is None:
        raise RuntimeError(f"wrk output lacks {pattern!r}:\n{text}")
    return match.group(1)


def _millis(value: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", value).groups()  # type: ignore[union-attr]
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def measure_round(
    seconds: int, log: Path, stores: list[str], postgres_url: str | None = None
) -> dict[str, Load]:
    drive = run_wrk if shutil.which("wrk") else run_python
    results: dict[str, Load] = {}
    server = Server("bare", {}, log)
    try:
        results["bare"] = server.measure(drive, "first.lua", seconds)
    finally:
        server.stop()
    for store in stores:
        with tempfile.TemporaryDirectory() as folder:
            where = str(Path(folder) / "runs.db")
            kind = store
            if store.startswith("postgres"):  # A schema of its own per round: tables empty.
                assert postgres_url is not None
                kind, group = "postgres", "off" if store == "postgres_solo" else "on"
                where = (
                    f"{postgres_url}?schema=bench_{uuid.uuid4().hex[:8]}&max_size={THREADS}"
                    f"&group_commit={group}"
                )
            env = {"BENCH_STORE": kind, "BENCH_DB": where}
            server = Server("tasklease", env, log)
            try:
                results[f"{store} first"] = server.measure(drive, "first.lua", seconds)
                for _ in range(4):  # Complete the repeated task in both workers' stores.
                    post(server.port, "same-task", retry=0)
                results[f"{store} duplicate"] = server.measure(drive, "duplicate.lua", seconds)
            finally:
                server.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument(
        "--stores",
        default="memory,sqlite",
        help="of memory, sqlite, postgres, postgres_solo (group commit off)",
    )
    parser.add_argument(
        "--threads", type=int, default=4, help="per gunicorn worker (the Procfile's: 8)"
    )
    args = parser.parse_args()
    global THREADS  # noqa: PLW0603 - one setting for every server of the run.
    THREADS = args.threads
    stores = args.stores.split(",")
    if shutil.which("wrk") is None:
        print(
            "warning: wrk not found (apt-get install wrk, or make bench); using the Python "
            "load generator, which is slower than the servers: ratios understate differences",
            file=sys.stderr,
        )
    log = BENCH_DIR / "worker_throughput.log"
    print(f"gunicorn 2 workers x {THREADS} threads; wrk 2 threads, 16 connections; trivial handler")
    with ExitStack() as cleanup:
        postgres_url = None
        if any(store.startswith("postgres") for store in stores):
            postgres_url = cleanup.enter_context(private_postgres()).url()
        for round_ in range(1, args.rounds + 1):
            results = measure_round(args.seconds, log, stores, postgres_url)
            print_round(round_, results)


def print_round(round_: int, results: dict[str, Load]) -> None:
    bare = results["bare"]
    print(f"round {round_}:")
    print(
        f"  {'server':<20}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'+p50 ms':>9}"
        f"{'cpu us/req':>12}  ratio"
    )
    for name, result in results.items():
        note = f"  ({result.failures} non-2xx)" if result.failures else ""
        print(
            f"  {name:<20}{result.rate:>9.0f}{result.p50_ms:>9.2f}{result.p99_ms:>9.2f}"
            f"{result.p50_ms - bare.p50_ms:>+9.2f}{result.cpu_us:>12.0f}"
            f"  {result.rate / bare.rate:.2f}{note}"
        )


if __name__ == "__main__":
    main()
