"""Durable steps of one attempt: ``ctx.step``, ``ctx.astep``, ``ctx.continue_later``.

A step's result is recorded in the run record by ONE fenced write (written only while this
attempt holds the claim); a later attempt of the run's delivery gets it back from the record
its claim returned, without a read and without calling the step again. A delivery that
continues drops its steps; the next one starts with none. The rules are in
:mod:`tasklease.worker.core.steps`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar, overload

from tasklease.errors import LeaseLost
from tasklease.worker.core import steps as rules
from tasklease.worker.core import waits as wait_rules
from tasklease.worker.core.steps import Continuation, StepRecord
from tasklease.worker.handlers.transactional_steps import run_transactional_step
from tasklease.worker.runtime.running import step_call
from tasklease.worker.runtime.thread_wait import thread_result
from tasklease.worker.stores.base.retries import retry_while_unavailable

if TYPE_CHECKING:
    from tasklease.worker.core.records import RunRecord
    from tasklease.worker.handlers.attempt import Attempt
    from tasklease.worker.stores.base.store import LeaseStore

Clock = Callable[[], datetime]
_T = TypeVar("_T")


@dataclass(eq=False)
class StepRunner:
    """The steps of one attempt: those its claim found recorded, and those it runs.

    Without a store (a handler's unit test, a ``TaskContext`` made by hand) steps run and are
    remembered for this attempt only.
    """

    run_id: str
    attempt: Attempt | None = None
    store: LeaseStore | None = None
    clock: Clock | None = None
    recorded: dict[str, StepRecord] = field(default_factory=dict)
    resumed: Continuation = rules.NO_CONTINUATION
    used: set[str] = field(default_factory=set)
    replayed: int = 0
    ran: int = 0
    transaction_tries: int = 0  # How often the database ran this attempt's transactional steps.
    continuation: Continuation | None = None  # Set by continue_later.
    waits: wait_rules.Waits = wait_rules.NO_WAITS  # As the claim found them.
    suspension: wait_rules.Suspension | None = None  # Set by wait_for, when the run must wait.

    @classmethod
    def of(cls, record: RunRecord, attempt: Attempt, store: LeaseStore, clock: Clock) -> StepRunner:
        """The runner of ``attempt``, which claimed ``record``."""
        return cls(
            record.run_id,
            attempt,
            store,
            clock,
            rules.steps_of(record),
            rules.continuation_of(record),
            waits=wait_rules.waits_of(record),
        )

    def key(self, name: str) -> str:
        rules.check_key_name(name)
        return rules.step_key(self.run_id, name, self.resumed.seq)

    def begin(self, name: str) -> StepRecord | None:
        """Start step ``name``: its recorded result if any (a replay), else None (run it)."""
        self._refuse_in_transaction("ctx.step")
        if self.attempt is not None:
            self.attempt.check_cancelled()  # A cancelled run starts no step, replayed or not.
        if self.suspension is not None:  # The handler caught WaitSuspended.
            raise rules.StepError(
                f"step {name!r}: this delivery is suspended on the wait "
                f"{self.suspension.name!r}; a step after it runs once the run resumes "
                "(let WaitSuspended, a BaseException, propagate: do not catch it)"
            )
        rules.check_name(name, self.used)
        self.used.add(name)
        done = self.recorded.get(name)
        if done is not None:
            self.replayed += 1
            return done
        if self.attempt is not None:
            self.attempt.check_lease()  # A stale attempt starts no new step.
        return None

    def end(self, name: str, result: Any) -> Any:
        """Record step ``name``'s ``result`` (fenced); return it as a replay would give it."""
        result_json = rules.encode_result(name, result)
        now = self.clock() if self.clock is not None else datetime.now().astimezone()
        attempt_id = self.attempt.attempt_id if self.attempt is not None else ""
        step = StepRecord(name, result_json, attempt_id, now, len(result_json.encode()))
        if self.store is not None and self.attempt is not None:
            store, attempt = self.store, self.attempt
            written = retry_while_unavailable(
                lambda: store.record_step(self.run_id, attempt.attempt_id, step),
                attempt.timing.sleep,
            )
            if written is None:
                attempt.mark_lease_lost()
                raise LeaseLost(
                    f"run {self.run_id}: step {name!r} of attempt {attempt.attempt_id} was "
                    "refused: another attempt holds the run now"
                )
            attempt.note_record(written)  # A cancellation: the next step raises Cancelled.
        self.recorded[name] = step
        self.ran += 1
        return step.result

    def run(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        transactional: bool = False,
        **kwargs: Any,
    ) -> Any:
        if self.store is not None and _on_event_loop():
            # Its record would be written from the loop's thread, blocking every async
            # handler of the process, and deadlocking it when another one's transactional
            # astep holds the store's write lock while its coroutine waits for the loop.
            raise rules.StepError(
                f"step {name!r}: ctx.step is called on an event loop (an async handler): "
                "use `await ctx.astep(...)`, which writes the record off the loop"
            )
        done = self.begin(name)
        if done is not None:
            return done.result
        if transactional:
            return run_transactional_step(self, name, fn, args, kwargs)
        with step_call(name):
            result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            raise rules.StepError(
                f"step {name!r}: its function is async: use `await ctx.astep(...)`"
            )
        return self.end(name, result)

    async def arun(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        transactional: bool = False,
        **kwargs: Any,
    ) -> Any:
        done = self.begin(name)
        if done is not None:
            return done.result
        if transactional:  # The store's transaction blocks: on a thread, fn on this loop.
            loop = asyncio.get_running_loop()
            return await asyncio.to_thread(
                lambda: run_transactional_step(self, name, fn, args, kwargs, loop=loop)
            )
        with step_call(name):
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        # The store call blocks: off the handler loop, so other handlers keep running. A
        # cancel waits for its record, which the retry replays.
        return await thread_result(asyncio.to_thread(self.end, name, result))

    def continue_later(self, state: Any, delay: timedelta | float = 0.0) -> None:
        self._refuse_in_transaction("ctx.continue_later")
        if self.suspension is not None:
            raise rules.StepError("continue_later: this delivery is suspended on a wait")
        if self.continuation is not None:
            raise rules.StepError("continue_later is called once per delivery")
        seconds = rules.delay_seconds(delay)
        now = self.clock() if self.clock is not None else None
        candidate = Continuation(self.resumed.seq + 1, state, now, seconds)
        # Refuse a state JSON cannot hold, or one past the cap, here: in the handler. The
        # delivery's steps do not count: the continuation's write drops them.
        rules.encode_continuation(candidate)
        self.continuation = candidate

    def _refuse_in_transaction(self, what: str) -> None:
        # A transactional handler's record commits with its writes: a step recorded beside
        # that transaction would outlive its rollback (and on SQLite wait on its lock).
        # The same inside a transactional step's function.
        if self.attempt is not None and self.attempt.current_transaction is not None:
            raise rules.StepError(
                f"{what} is not available in a transactional=True handler, nor inside a "
                "transactional step's function: its writes through ctx.transaction "
                "already commit with the record"
            )

    def log_fields(self) -> dict[str, int]:
        """The counts on the delivery's log line (none for a handler that used no step)."""
        if not (self.replayed or self.ran):
            return {}
        fields = {"steps_replayed": self.replayed, "steps_run": self.ran}
        if self.transaction_tries:  # As a transactional handler's line counts its tries.
            fields["transaction_tries"] = self.transaction_tries
        return fields


def _on_event_loop() -> bool:
    """Whether this thread is running an event loop (an async handler's code)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class DurableSteps:
    """The durable-step methods of :class:`~tasklease.worker.handlers.context.TaskContext`."""

    _steps: StepRunner

    @overload
    def step(self, name: str, /) -> Callable[[Callable[[], _T]], _T]: ...
    @overload
    def step(self, name: str, /, *, transactional: bool) -> Callable[[Callable[[Any], _T]], _T]: ...
    @overload
    def step(
        self,
        name: str,
        fn: Callable[..., _T],
        /,
        *args: Any,
        transactional: bool = False,
        **kwargs: Any,
    ) -> _T: ...
    def step(
        self,
        name: str,
        fn: Callable[..., Any] | None = None,
        /,
        *args: Any,
        transactional: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` as the run's step ``name``, once per run (per
        delivery of a continued run): its JSON result is recorded (fenced by this attempt's
        claim), and a later attempt gets the recorded result back without calling ``fn``.
        Names are unique within a delivery (a continuation starts with no steps: names may
        repeat across the deliveries of a chain). Without ``fn``, a decorator that runs the
        function it decorates as the step and binds its name to the result::

            @ctx.step("charge")
            def charge():
                return payments.charge(order, request_id=ctx.step_key("charge"))

        From an ``async def`` handler, use :meth:`astep`: this sync form is refused on a
        running event loop (``StepError``), as its store write would block the loop.

        ``PermanentFailure`` from ``fn`` fails the run; any other exception releases it for
        a retry, which resumes at this step. A stale attempt's step is refused
        (``LeaseLost``).

        ``transactional=True`` (SQLite and Postgres stores): ``fn`` is called as
        ``fn(tx, *args, **kwargs)`` with the store's native transaction (what
        ``ctx.transaction`` also is while it runs), and the step's record is written in
        that transaction, only while this attempt holds the claim: its writes through
        ``tx`` and its record commit together, exactly once, no downstream key needed. A
        raising ``fn`` (or a stale attempt) rolls them back::

            ctx.step("debit", lambda tx: tx.execute(DEBIT, (order,)), transactional=True)
        """
        if fn is None:
            return lambda function: self._steps.run(name, function, transactional=transactional)
        return self._steps.run(name, fn, *args, transactional=transactional, **kwargs)

    async def astep(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        transactional: bool = False,
        **kwargs: Any,
    ) -> Any:
        """:meth:`step` for async handlers: ``fn`` may be a coroutine function. With
        ``transactional=True`` the store's transaction runs on a thread of its own, an
        async ``fn`` on the handler's loop."""
        return await self._steps.arun(name, fn, *args, transactional=transactional, **kwargs)

    def step_key(self, name: str) -> str:
        """A UUID-shaped idempotency key for step ``name``, the same in every attempt of this
        delivery of the run (and another in each continuation, where the name may be used
        again): pass it downstream so an effect whose record was lost is de-duplicated."""
        return self._steps.key(name)

    @property
    def state(self) -> Any:
        """The state the previous delivery of this run gave :meth:`continue_later` (None on
        the run's first delivery)."""
        return self._steps.resumed.state

    @property
    def continuation(self) -> int:
        """Which delivery of the run this is: 0 the first, n after n ``continue_later``."""
        return self._steps.resumed.seq

    def continue_later(self, state: Any = None, delay: timedelta | float = 0.0) -> None:
        """End this delivery successfully once the handler returns (return right after
        calling it): ``state`` is recorded and the same run is enqueued again, ``delay``
        from now, under a name derived from the run and the continuation's number (created
        once). Its delivery resumes the run with :attr:`state`, and no steps: this
        delivery is final, its steps are dropped (carry what the next needs in ``state``).
        The run is completed when a delivery returns without continuing. A scheduled run
        continues in Cloud Tasks tasks on the job's route (``/jobs/<name>``), in the
        handler's ``queue=`` or else the producer's default; the Scheduler's delivery is
        answered 200."""
        self._steps.continue_later(state, delay)
