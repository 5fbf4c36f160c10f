"""The log line's ``instance`` names the process that wrote it, a forked child included: the
pid is kept by a fork hook rather than read by a system call on every request."""

from __future__ import annotations

import os

from tasklease.worker.observe.logs import instance_id


def test_a_forked_child_names_its_own_pid_in_the_instance() -> None:
    parent = instance_id()
    assert parent.endswith(f":{os.getpid()}")
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe.
        try:
            os.write(write, f"{os.getpid()} {instance_id()}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        pid, named = pipe.read().decode().split(" ", 1)
    os.waitpid(child, 0)
    assert named.endswith(f":{pid}") and named != parent
