"""Run every benchmark, one after the other, printing their numbers."""

from __future__ import annotations

import subprocess
import sys

BENCHMARKS = [
    "bench.producer_enqueue",
    "bench.emulator_throughput",
    "bench.worker_overhead",
    "bench.worker_throughput",
    "bench.asgi_throughput",
    "bench.sqlite_floor",
    "bench.cold_start",
    "bench.firestore_store",
    "bench.spanner_store",
]

if __name__ == "__main__":
    for module in BENCHMARKS + sys.argv[1:]:
        print(f"$ python -m {module}", flush=True)
        subprocess.run([sys.executable, "-m", module], check=True)
        print(flush=True)
