"""Process groups of the services tests start (emulators run as gcloud, a shell, and the
emulator itself, in one group)."""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path


def group_states(group: int) -> dict[int, str]:
    """The state letter of each process in ``group`` (proc(5): ``/proc/PID/stat``, fields
    after the parenthesised name: state, ppid, pgrp)."""
    states = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == group:
                states[int(stat.parent.name)] = fields[0]
    return states


def group_alive(group: int) -> bool:
    """Whether a process of ``group`` still runs (zombies, dead but not yet waited for, do
    not count: ``killpg(group, 0)`` would still find them)."""
    return any(state != "Z" for state in group_states(group).values())
