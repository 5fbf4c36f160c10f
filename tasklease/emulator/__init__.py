"""A local Cloud Tasks + Cloud Scheduler emulator, faithful to the real services' semantics.

with CloudTasksEmulator(faults=Faults(duplicate=0.1)) as emulator:
    emulator.create_queue("projects/p/locations/l/queues/q")
    ...                                      # enqueue with TASKLEASE_TASKS_ENDPOINT=emulator.url
    emulator.join()                          # wait until every task is done
    emulator.deliveries()                    # what was sent, with status codes
"""

from tasklease.emulator.faults import Faults
from tasklease.emulator.policy import RetrySettings
from tasklease.emulator.rows import DeliveryRecord
from tasklease.emulator.scheduler import Job, LocalScheduler, load_jobs
from tasklease.emulator.server import CloudTasksEmulator

__all__ = [
    "CloudTasksEmulator",
    "DeliveryRecord",
    "Faults",
    "Job",
    "LocalScheduler",
    "RetrySettings",
    "load_jobs",
]
