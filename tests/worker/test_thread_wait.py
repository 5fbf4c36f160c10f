"""A call in a thread, awaited by a task that gets cancelled meanwhile: the task waits for the
call to end (its write lands before the run can be released), then stays cancelled."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tasklease.worker.runtime.thread_wait import thread_result


def test_the_result_of_an_uncancelled_call_is_returned() -> None:
    async def main() -> str:
        return await thread_result(asyncio.to_thread(lambda: "written"))

    assert asyncio.run(main()) == "written"


@pytest.mark.parametrize("fails", [False, True])
def test_a_cancel_waits_for_the_call_to_end_and_is_then_raised(fails: bool) -> None:
    entered, proceed = threading.Event(), threading.Event()
    ended: list[str] = []

    def write() -> str:
        entered.set()
        proceed.wait(10)
        ended.append("written")
        if fails:
            raise ConnectionError("the store went away")
        return "written"

    async def main() -> tuple[bool, list[str]]:
        task = asyncio.ensure_future(thread_result(asyncio.to_thread(write)))
        while not entered.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        for _ in range(5):  # Let the task take the cancel and go back to waiting.
            await asyncio.sleep(0)
        during = (task.done(), list(ended))
        proceed.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return during[0], during[1]

    done_during, ended_during = asyncio.run(main())
    assert (done_during, ended_during) == (False, [])  # Still waiting for the thread.
    assert ended == ["written"]
