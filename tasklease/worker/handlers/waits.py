"""Durable waits of one attempt: ``ctx.wait_for`` and ``ctx.await_for``.

A wait whose signal has come, or whose timeout is due, resolves in one fenced write that takes
the signal and records the answer as the step ``wait:<name>``; a later attempt of the
delivery replays that step. A wait that cannot resolve yet suspends the run: ``wait_for``
raises :class:`WaitSuspended`, and the executor ends the delivery with the run ``waiting``
(:mod:`tasklease.worker.delivery.waits`). The rules are in :mod:`tasklease.worker.core.waits`.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from tasklease.errors import LeaseLost, PermanentFailure
from tasklease.worker.core import steps as step_rules
from tasklease.worker.core import waits as rules
from tasklease.worker.core.steps import StepError, StepRecord
from tasklease.worker.handlers.steps import StepRunner
from tasklease.worker.runtime.running import current_call
from tasklease.worker.runtime.thread_wait import thread_result
from tasklease.worker.stores.base.retries import retry_while_unavailable

__all__ = ["DurableWaits", "WaitSuspended", "WaitTimedOut"]


class WaitTimedOut(PermanentFailure, TimeoutError):
    """``ctx.wait_for``'s timeout came before its signal. Uncaught, it fails the run for
    good (a dead letter): retrying would time out again."""

    def __init__(self, name: str, deadline: datetime | None) -> None:
        self.name = name
        self.deadline = deadline
        until = "" if deadline is None else f" (its deadline was {deadline.isoformat()})"
        super().__init__(f"the wait {name!r} timed out before its signal came{until}")


class WaitSuspended(BaseException):
    """Raised by ``wait_for`` to end the delivery while the run waits: a BaseException, so
    a handler's ``except Exception`` does not swallow it. The executor catches it."""


def _answer(step: StepRecord) -> Any:
    """The wait's answer as its step recorded it: the payload, or :class:`WaitTimedOut`."""
    name = step.name.removeprefix(rules.STEP_PREFIX)
    result = step.result
    if "signal" in result:
        return result["signal"]
    deadline = result.get("timed_out")
    raise WaitTimedOut(
        name, None if deadline is None else datetime.fromisoformat(deadline.replace("Z", "+00:00"))
    )


def _timeout_seconds(timeout: timedelta | float | None) -> float | None:
    if timeout is None:
        return None
    try:
        return step_rules.delay_seconds(timeout)
    except StepError:
        raise StepError(
            f"wait_for: the timeout is between 0 and {step_rules.MAX_CONTINUATION_DELAY.days} "
            f"days (its task is scheduled that far ahead at most), or None, not {timeout!r}"
        ) from None


class _Waits:
    """The wait logic on one attempt's :class:`StepRunner`."""

    def __init__(self, runner: StepRunner) -> None:
        self.runner = runner

    def begin(self, name: str, timeout: timedelta | float | None) -> tuple[str, float | None]:
        """Check the call; return the wait's step name and its timeout in seconds."""
        runner = self.runner
        try:
            rules.check_name(name)
        except rules.SignalError as exc:
            raise StepError(f"wait_for: {exc}") from None
        call = current_call()
        if call is not None and "step" in call.scope[2:3]:
            raise StepError(
                f"wait_for({name!r}) is called inside a step's function: wait between steps "
                "(a step's function runs again on every attempt until it returns)"
            )
        if runner.attempt is not None and runner.attempt.current_transaction is not None:
            raise StepError(
                "wait_for is not available in a transactional=True handler, nor inside a "
                "transactional step's function: the delivery ends while the run waits"
            )
        if runner.suspension is not None:
            raise StepError("wait_for: this delivery is already suspended on another wait")
        if runner.continuation is not None:
            raise StepError("wait_for: this delivery has called continue_later")
        return rules.step_name(name), _timeout_seconds(timeout)

    def replayed(self, step_name: str, name: str) -> StepRecord | None:
        """The recorded answer of this delivery's wait ``name``, or None; refuses a wait
        name the run has used in an earlier delivery."""
        done = self.runner.begin(step_name)
        if done is None and name in self.runner.waits.delivered:
            raise StepError(
                f"wait_for({name!r}): a wait of that name ended earlier in this run; a wait "
                'name is used once per run (name the waits of a loop f"reply-{i}")'
            )
        return done

    def resolvable(self, name: str, now: datetime) -> bool:
        """Whether the claimed record shows the wait's signal, or its due timeout."""
        state = self.runner.waits
        wait = state.wait
        due = (
            wait is not None
            and (wait.name, wait.seq) == (name, self.runner.resumed.seq)
            and rules.timed_out(wait, now)
        )
        return name in state.signals or due

    def resolve(self, step_name: str, name: str) -> StepRecord | None:
        """Take the signal (or the timeout) in one fenced write; None when neither came."""
        runner = self.runner
        store, attempt, clock = runner.store, runner.attempt, runner.clock
        if store is None or attempt is None or clock is None:
            return None
        resolution = retry_while_unavailable(
            lambda: store.resolve_wait(
                runner.run_id, attempt.attempt_id, name, runner.resumed.seq, clock
            ),
            attempt.timing.sleep,
        )
        if not resolution.held:
            attempt.mark_lease_lost()
            raise LeaseLost(
                f"run {runner.run_id}: the wait {name!r} of attempt {attempt.attempt_id} was "
                "refused: another attempt holds the run now"
            )
        if resolution.step is not None:
            runner.recorded[step_name] = resolution.step
            runner.ran += 1
        return resolution.step

    def suspend(self, name: str, timeout: float | None, now: datetime) -> WaitSuspended:
        """Note the wait this attempt suspends on; the exception that ends the handler."""
        runner = self.runner
        deadline = None if timeout is None else now + timedelta(seconds=timeout)
        runner.suspension = rules.Suspension(name, runner.resumed.seq, now, deadline)
        return WaitSuspended(name)

    def now(self) -> datetime:
        clock = self.runner.clock
        return clock() if clock is not None else datetime.now().astimezone()


class DurableWaits:
    """The durable-wait methods of :class:`~tasklease.worker.handlers.context.TaskContext`."""

    _steps: StepRunner

    def wait_for(self, name: str, timeout: timedelta | float | None = None) -> Any:
        """Wait for the signal ``name`` (``tasklease.signal(run_id, name, payload, ...)``)
        and return its payload, holding no instance while the run waits::

            ctx.step("ask", send_approval_request, order)
            decision = ctx.wait_for("approval", timeout=timedelta(days=3))

        If the signal has not come, the delivery ends here (answered 200; the run is
        ``waiting``) and a task resumes the run once it comes, or at ``timeout`` (seconds,
        or a timedelta, up to 30 days; None waits as long as the run's record is kept).
        The resumed delivery runs the handler again from the top: the steps before the
        wait replay their recorded results, and ``wait_for`` returns the payload. A signal
        sent before the wait is kept for it. On timeout it raises :class:`WaitTimedOut` (a
        ``PermanentFailure``: catch it to go on). Each wait name is used once per run.
        From an ``async def`` handler use :meth:`await_for`."""
        waits = _Waits(self._steps)
        step_name, timeout_seconds = waits.begin(name, timeout)
        if self._steps.store is not None and _on_event_loop():
            raise StepError(
                f"wait_for({name!r}) is called on an event loop (an async handler): use "
                "`await ctx.await_for(...)`, which writes the record off the loop"
            )
        done = waits.replayed(step_name, name)
        if done is None and waits.resolvable(name, waits.now()):
            done = waits.resolve(step_name, name)
        if done is not None:
            return _answer(done)
        raise waits.suspend(name, timeout_seconds, waits.now())

    async def await_for(self, name: str, timeout: timedelta | float | None = None) -> Any:
        """:meth:`wait_for` for async handlers: the store write runs off the loop."""
        waits = _Waits(self._steps)
        step_name, timeout_seconds = waits.begin(name, timeout)
        done = waits.replayed(step_name, name)
        if done is None and waits.resolvable(name, waits.now()):
            done = await thread_result(asyncio.to_thread(waits.resolve, step_name, name))
        if done is not None:
            return _answer(done)
        raise waits.suspend(name, timeout_seconds, waits.now())


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
