"""PerProcess: one value per process, made anew after a fork, never the parent's."""

from __future__ import annotations

import os

from tasklease.plumbing.per_process import PerProcess


def test_the_value_is_made_once_per_process_and_anew_after_a_fork() -> None:
    made: list[int] = []

    def make() -> int:
        made.append(os.getpid())
        return len(made)

    value = PerProcess(make)
    assert value.made_here() is None
    assert value.get() == 1
    assert value.get() == 1
    assert value.made_here() == 1
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child, which reports by exit status
        inherited = value.made_here()
        fresh = value.get()
        os._exit(0 if inherited is None and fresh == 2 and made[-1] == os.getpid() else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert value.get() == 1  # The parent's is untouched.


def test_forget_makes_the_value_anew() -> None:
    count = iter(range(10))
    value = PerProcess(lambda: next(count))
    assert value.get() == 0
    value.forget()
    assert value.made_here() is None
    assert value.get() == 1
