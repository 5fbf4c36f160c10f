"""The independent history checker: reads what the effects left (the downstream's writes, the
ledger's rows, the queue's and the scheduler's logs) and never tasklease's run records, and
names each way they break the guarantee.

The invariants, each a function of the :class:`~tasklease.testing.simulation.history.History`:

- ``one_key_per_lifecycle``: every execution of one lifecycle presents the same idempotency
  key, and no two lifecycles share one (else a third party with idempotency keys does the
  effect twice, or drops one); the deliveries of one continued run are one lifecycle, and so
  are a waiting run's task and the tasks that wake it (its signal's, its timeout's).
- ``write_after_acknowledged``: no handler writes for a lifecycle whose 2xx the queue heard
  (a completed run never runs again). A waiting run's task is answered 2xx when it suspends:
  no pre-wait write comes after any 2xx of the run, and no write at all after a 2xx to a
  task that wakes it (which is answered so once the run has ended).
- ``holders_interleave``: two attempts whose leases hold by their own clocks never write to
  one resource (a run, an exclusive job, a concurrency key) by turns.
- ``fenced_while_holding``: a write made while its attempt's lease held is never refused by
  the fence (no other attempt got a newer token meanwhile).
- ``token_reused``: two attempts never present the same fencing token for one resource.
- ``refused_while_holding``: no attempt answers that its claim was taken over (``lost_claim``,
  which makes the queue run the handler again) while its lease still holds by its own clock:
  no other attempt can have taken a run or a lock over before that lease ran out.
- ``ledger_twice`` / ``acknowledged_without_effect``: a transactional lifecycle commits its
  ledger row at most once, and exactly once if acknowledged; a plain one acknowledged has a
  final write. A waiting run counts once its end is acknowledged (a task that wakes it, or
  its own task when it never suspended), by a final write of any of its tasks.
- ``not_settled``: every lifecycle ends acknowledged, or given up by the queue or the
  scheduler after every retry.
- ``lost_enqueue``: every task the producer answered as created (a user's enqueue, a child
  of a fan-out that returned) and every enqueue staged by an outbox transaction the user
  committed is in the queue by the end (an outbox entry is never dropped before its task is
  created).
- ``rolled_back_enqueued``: no task exists for an enqueue staged by an outbox transaction the
  user rolled back.
- ``step_repeated``: once a durable step's record is committed, its body never runs again.
  The step's body writes a ledger row in the step's own transaction, so the row commits
  exactly when the step's record does: for each run and step with a committed row, the last
  body the row's attempt ran (and which returned; a transaction the database aborted runs it
  again in the same attempt) is the last run of that body, and no second row is committed.
  A body that returned but whose transaction did not commit (its attempt lost its claim, or
  died) leaves no row, and may run again.
- ``join_twice``: a join's ``then`` effect (its ledger row on a store with transactions, else
  a then lifecycle's accepted final write) happens at most once, over every then task of the
  join.
- ``join_inexact``: every execution of a join's ``then`` handler is given every child of the
  fan-out exactly once, with what that child did: a child told to fail, ``failed`` with an
  error naming an attempt of it that wrote its effect; any other, ``completed`` with the id
  of an attempt of it that made its accepted final write (what the child returns); and a
  summary that counts them so. A then run early (a child counted twice) misses a child.
- ``lost_join``: once every child of a join is acknowledged, its ``then`` effect has happened
  by the end (a join whose then task was never created is lost).
- ``resumed_twice``: every resumed execution of one waiting run saw the same resolution, and
  once a signal call was answered True it is that signal's payload (a duplicate's payload, or
  the timeout, would be the wait resolving a second time).
- ``resumed_unsignalled``: no wait resolves with a payload no signal call carried, nor by a
  timeout it never asked for, nor by its timeout before its deadline (its first suspension
  plus the timeout, less the most an instance's clock may be ahead); and the durable step
  before the wait never runs again once the run has suspended.
- ``lost_resume``: a waiting run whose signal call was answered True, or whose timeout was due
  well before the end, has made its final write by the end.
- ``ran_after_cancel``: once a cancel call for a run was answered True at t, no step body of
  the run starts after t in an attempt that claimed after t (its claim by its instance's
  clock, less the most a clock may be ahead), and an attempt that may have claimed by t
  starts at most one more (it learns of the mark at its next step write or renewal); no
  fan-out child of the run that claimed after t starts (a child reads its parent's record
  before its claim); and no attempt that claimed after t resumes the run from its wait.
  A run the user cancelled (a call answered True, or one that raised), and a child of one,
  may be acknowledged without its final write.
- ``crashed``: nothing escaped the real code as an unexpected exception.

The joins are told apart by their parent's run id (one fan-out with a join per parent run),
from what the parent handler saw its fan-out return, never from tasklease's join records. The
waiting runs by the id their handler noted at its start, and the tasks that wake them by the
run their header names, as the queue saw it.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tasklease.testing.simulation.history import (
    FanInPlan,
    History,
    Resumed,
    SignalCall,
    StepBody,
    Suspended,
    ThenRun,
    Write,
)
from tasklease.testing.simulation.workload import STEP_EFFECT

__all__ = ["INVARIANTS", "HistoryViolation", "check"]

INVARIANTS = (
    "one_key_per_lifecycle",
    "write_after_acknowledged",
    "holders_interleave",
    "fenced_while_holding",
    "token_reused",
    "refused_while_holding",
    "ledger_twice",
    "acknowledged_without_effect",
    "not_settled",
    "lost_enqueue",
    "rolled_back_enqueued",
    "step_repeated",
    "join_twice",
    "join_inexact",
    "lost_join",
    "resumed_twice",
    "resumed_unsignalled",
    "lost_resume",
    "ran_after_cancel",
    "crashed",
)
# How long past a wait's due time (its signal's answer, or its timeout) its run may take to
# make its final write: the queue's longest backoff several times over, and the lease.
RESUME_WITHIN = 900.0


@dataclass(frozen=True)
class HistoryViolation:
    """One broken invariant: which, where (the lifecycle or resource), when, and what."""

    invariant: str
    subject: str
    at: float
    detail: str

    def describe(self, replay: str) -> str:
        """One line: the invariant, the virtual time, what happened, and how to replay it."""
        where = f"{self.invariant} at t={self.at:.3f}s ({self.subject})"
        return f"{where}: {self.detail}; replay: {replay}"


def check(history: History) -> list[HistoryViolation]:
    """Every violation ``history`` shows, in order of the invariants, then of time."""
    found: list[HistoryViolation] = []
    found += _keys(history)
    found += _after_acknowledged(history)
    found += _holders(history)
    found += _tokens(history)
    found += _refusals(history)
    found += _ledger(history)
    found += _settled(history)
    found += _enqueues(history)
    found += _steps(history)
    found += _joins(history)
    found += _waits(history)
    found += _cancels(history)
    found += [
        HistoryViolation("crashed", "-", history.ended_at, crash) for crash in history.crashes
    ]
    return found


def _by(writes: list[Write], key: str) -> dict[str, list[Write]]:
    grouped: dict[str, list[Write]] = defaultdict(list)
    for write in writes:
        grouped[getattr(write, key)].append(write)
    return grouped


def _keys(history: History) -> list[HistoryViolation]:
    found = []
    owner: dict[str, str] = {}

    def lifecycle(name: str) -> str:
        origin = history.origins.get(name)
        return f"run:{origin.run}" if origin is not None and origin.run else name

    by_run: dict[str, set[str]] = defaultdict(set)
    for write in history.writes:
        run = lifecycle(write.origin)
        if run.startswith("run:"):
            by_run[run].add(write.key)
    for run, keys_of_run in sorted(by_run.items()):
        if len(keys_of_run) > 1:
            first = next(w for w in history.writes if lifecycle(w.origin) == run)
            found.append(
                HistoryViolation(
                    "one_key_per_lifecycle",
                    run,
                    first.at,
                    f"the tasks of one run presented {len(keys_of_run)} idempotency keys: "
                    f"{', '.join(sorted(keys_of_run))}",
                )
            )
    for origin, writes in _by(history.writes, "origin").items():
        keys = sorted({w.key for w in writes})
        if len(keys) > 1:
            found.append(
                HistoryViolation(
                    "one_key_per_lifecycle",
                    origin,
                    writes[0].at,
                    f"its executions presented {len(keys)} idempotency keys: {', '.join(keys)}",
                )
            )
        for key in keys:
            other = owner.setdefault(key, origin)
            if lifecycle(other) != lifecycle(origin):
                found.append(
                    HistoryViolation(
                        "one_key_per_lifecycle",
                        origin,
                        writes[0].at,
                        f"presented the idempotency key {key} of {other}",
                    )
                )
    return found


def _after_acknowledged(history: History) -> list[HistoryViolation]:
    found = []
    waiting = _WaitLifecycles(history)
    for write in history.writes:
        origin = history.origins.get(write.origin)
        acknowledged = origin.acknowledged_at if origin is not None else None
        if origin is not None and origin.run in waiting.runs:
            acknowledged = waiting.ended_at(origin.run, before_wait=not write.final)
        if write.valid and acknowledged is not None and write.at > acknowledged:
            found.append(
                HistoryViolation(
                    "write_after_acknowledged",
                    write.origin,
                    write.at,
                    f"attempt {write.attempt_id[:12]} wrote step {write.step} after the queue "
                    f"heard 2xx at t={acknowledged:.3f}s",
                )
            )
    return found


def _holders(history: History) -> list[HistoryViolation]:
    found = []
    for resource, writes in _by(history.writes, "resource").items():
        finished: set[str] = set()
        current: str | None = None
        for write in sorted((w for w in writes if w.valid), key=lambda w: w.at):
            if write.attempt_id == current:
                continue
            if write.attempt_id in finished:
                found.append(
                    HistoryViolation(
                        "holders_interleave",
                        resource,
                        write.at,
                        f"attempt {write.attempt_id[:12]} of {write.origin} wrote again after "
                        f"attempt {(current or '')[:12]} had written, both holding their leases",
                    )
                )
            if current is not None:
                finished.add(current)
            current = write.attempt_id
        for write in writes:
            if write.valid and not write.accepted:
                found.append(
                    HistoryViolation(
                        "fenced_while_holding",
                        resource,
                        write.at,
                        f"attempt {write.attempt_id[:12]} of {write.origin} held its lease, and "
                        f"its token {write.token} was refused: another got a newer one",
                    )
                )
    return found


def _tokens(history: History) -> list[HistoryViolation]:
    found = []
    for resource, writes in _by(history.writes, "resource").items():
        seen: dict[int, str] = {}
        for write in writes:
            other = seen.setdefault(write.token, write.attempt_id)
            if other != write.attempt_id:
                found.append(
                    HistoryViolation(
                        "token_reused",
                        resource,
                        write.at,
                        f"attempts {other[:12]} and {write.attempt_id[:12]} both presented "
                        f"fencing token {write.token}",
                    )
                )
                seen[write.token] = write.attempt_id  # Report each new pair once.
    return found


def _refusals(history: History) -> list[HistoryViolation]:
    return [
        HistoryViolation(
            "refused_while_holding",
            refusal.origin,
            refusal.at,
            f"attempt {refusal.attempt_id[:12]} answered lost_claim while its lease held by "
            "its own clock: nothing can have taken it over",
        )
        for refusal in history.refusals
        if refusal.holding
    ]


def _ledger(history: History) -> list[HistoryViolation]:
    found = []
    rows: dict[str, int] = defaultdict(int)
    for row in history.ledger:
        rows[row.effect] += 1
    finals = {w.origin for w in history.writes if w.final and w.accepted}
    waiting = _WaitLifecycles(history)
    cancellable = _WaitLifecycles(history, frozenset(history.cancellables.values()))
    cancelled = _cancelled_runs(history)
    for name, origin in history.origins.items():
        if origin.run in waiting.runs or origin.run in cancellable.runs:
            continue  # Its run is checked as a whole, below.
        if origin.parent is not None and origin.parent in cancelled:
            continue  # A child of a run its user cancelled may never run.
        if origin.transactional:
            if rows[name] > 1:
                found.append(
                    HistoryViolation(
                        "ledger_twice", name, history.ended_at, f"{rows[name]} ledger rows"
                    )
                )
            if origin.acknowledged_at is not None and rows[name] == 0:
                found.append(
                    HistoryViolation(
                        "acknowledged_without_effect",
                        name,
                        origin.acknowledged_at,
                        "acknowledged with no ledger row committed",
                    )
                )
        elif origin.acknowledged_at is not None and name not in finals and origin.resources == ():
            found.append(
                HistoryViolation(
                    "acknowledged_without_effect",
                    name,
                    origin.acknowledged_at,
                    "acknowledged, and no attempt made its final write",
                )
            )
    for run in sorted(waiting.runs):
        ended = waiting.ended_at(run, before_wait=False)
        if ended is not None and not waiting.finished(run):
            found.append(
                HistoryViolation(
                    "acknowledged_without_effect",
                    f"run:{run}",
                    ended,
                    "the waiting run's end was acknowledged, and no attempt made its final write",
                )
            )
    return found + _uncancelled_without_effect(cancellable, cancelled)


def _uncancelled_without_effect(
    cancellable: _WaitLifecycles, cancelled: frozenset[str]
) -> list[HistoryViolation]:
    """A cancel workload's run its user never cancelled, acknowledged without its final
    write (its own task's 2xx, or once it waited, a waking task's)."""
    found = []
    for run in sorted(cancellable.runs - cancelled):
        ended = cancellable.ended_at(run, before_wait=False)
        if ended is not None and not cancellable.finished(run):
            found.append(
                HistoryViolation(
                    "acknowledged_without_effect",
                    f"run:{run}",
                    ended,
                    "the run its user never cancelled was acknowledged, and no attempt made "
                    "its final write",
                )
            )
    return found


def _settled(history: History) -> list[HistoryViolation]:
    return [
        HistoryViolation(
            "not_settled",
            name,
            history.ended_at,
            f"neither acknowledged nor given up after {origin.deliveries} deliveries",
        )
        for name, origin in history.origins.items()
        if origin.acknowledged_at is None and not origin.given_up
    ]


def _enqueues(history: History) -> list[HistoryViolation]:
    found = []
    origins = history.origins
    for enqueued in history.enqueued:
        if f"task:{enqueued.task_id}" not in origins:
            found.append(
                HistoryViolation(
                    "lost_enqueue",
                    f"task:{enqueued.task_id}",
                    enqueued.at,
                    f"the producer answered its enqueue by {enqueued.by} as created, and the "
                    "queue never had it",
                )
            )
    for staged in history.outbox:
        name = f"task:{staged.task_id}"
        if staged.committed and name not in origins:
            found.append(
                HistoryViolation(
                    "lost_enqueue",
                    name,
                    staged.at,
                    "staged by a committed outbox transaction, and never created",
                )
            )
        elif not staged.committed and name in origins:
            found.append(
                HistoryViolation(
                    "rolled_back_enqueued",
                    name,
                    origins[name].created_at,
                    f"staged by an outbox transaction rolled back at t={staged.at:.3f}s, "
                    "and created",
                )
            )
    return found


def _steps(history: History) -> list[HistoryViolation]:
    found = []
    committed: dict[tuple[str, str], list[str]] = defaultdict(list)
    for row in history.ledger:
        if row.effect.startswith(STEP_EFFECT):
            committed[row.run_id, row.effect.removeprefix(STEP_EFFECT)].append(row.attempt_id)
    bodies: dict[tuple[str, str], list[StepBody]] = defaultdict(list)
    for body in history.step_bodies:
        bodies[body.run_id, body.step].append(body)
    for (run_id, step), attempts in sorted(committed.items()):
        ran = bodies[run_id, step]
        if len(attempts) > 1:
            found.append(
                HistoryViolation(
                    "step_repeated",
                    ran[0].origin if ran else run_id,
                    ran[-1].at if ran else history.ended_at,
                    f"step {step} of run {run_id[:12]} committed {len(attempts)} times",
                )
            )
            continue
        # The committing attempt's last body: on Firestore and Spanner a transaction the
        # database aborted runs the body again, in the same attempt, and only the last commits.
        recorded = max(
            (n for n, b in enumerate(ran) if b.attempt_id == attempts[0] and b.returned),
            default=None,
        )
        if recorded is None:
            continue  # Not this history's body: nothing to compare with.
        for again in ran[recorded + 1 :]:
            found.append(
                HistoryViolation(
                    "step_repeated",
                    again.origin,
                    again.at,
                    f"attempt {again.attempt_id[:12]} ran step {step} of run {run_id[:12]} "
                    f"again, after attempt {attempts[0][:12]} committed its record at "
                    f"t={ran[recorded].at:.3f}s",
                )
            )
    return found


class _JoinEvidence:
    """What the history holds of each join, by its parent's run id: the fan-out the parent
    saw return, the then handler's executions, and each lifecycle's effects."""

    def __init__(self, history: History) -> None:
        self.history = history
        self.plans: dict[str, FanInPlan] = {}
        for plan in history.fan_ins:  # A retried parent's fan-out names the same children.
            self.plans.setdefault(plan.parent_run_id, plan)
        self.thens: dict[str, list[ThenRun]] = defaultdict(list)
        for ran in history.then_runs:
            self.thens[ran.parent_run_id].append(ran)
        self.rows = Counter(row.effect for row in history.ledger)
        self.writers: dict[str, set[str]] = defaultdict(set)  # Origin -> its final writers.
        for write in history.writes:
            if write.final and write.accepted:
                self.writers[write.origin].add(write.attempt_id)

    def effects(self, join: str) -> list[str]:
        """The then lifecycles of ``join`` that made its effect, once per effect."""
        made: list[str] = []
        for name in sorted({ran.origin for ran in self.thens[join]}):
            origin = self.history.origins.get(name)
            if origin is not None and origin.transactional:
                made += [name] * self.rows[name]
            elif self.writers[name]:
                made.append(name)
        return made

    def inexact(self, plan: FanInPlan, ran: ThenRun) -> list[str]:
        """How ``ran``'s payload differs from what ``plan``'s children did."""
        wrong: list[str] = []
        listed = Counter(str(result.get("key")) for result in ran.results)
        missing = sorted(set(plan.children) - set(listed))
        if missing:
            wrong.append(f"no result for {', '.join(missing)}")
        wrong += [f"{key} listed {n} times" for key, n in sorted(listed.items()) if n > 1]
        wrong += [f"{key} is no child" for key in sorted(set(listed) - set(plan.children))]
        if ran.next_after is not None:
            wrong.append(f"the results end at a page (next_after {ran.next_after!r})")
        for result in ran.results:
            key = str(result.get("key"))
            if key in plan.children:
                wrong += self._result(key, plan.children[key], key in plan.failing, result)
        failed = len(plan.failing)
        summary = {"total": len(plan.children), "completed": len(plan.children) - failed}
        summary["failed"] = failed
        if dict(ran.summary) != summary:
            wrong.append(f"summary {dict(ran.summary)}, the children did {summary}")
        return wrong

    def _result(
        self, key: str, task_id: str, told_to_fail: bool, result: Mapping[str, Any]
    ) -> list[str]:
        writers = self.writers[f"task:{task_id}"]
        status = result.get("status")
        if told_to_fail:
            error = str(result.get("error"))
            if status != "failed" or not any(attempt in error for attempt in writers):
                return [f"{key} was told to fail and is listed {status}: {error!r}"]
            return []
        value = result.get("result")
        attempt = value.get("attempt") if isinstance(value, dict) else None
        if status != "completed" or attempt not in writers:
            return [f"{key} is listed {status} with {value!r}, no attempt of it that wrote"]
        return []


def _joins(history: History) -> list[HistoryViolation]:
    evidence = _JoinEvidence(history)
    found = []
    for join, runs in sorted(evidence.thens.items()):
        made = evidence.effects(join)
        if len(made) > 1:
            found.append(
                HistoryViolation(
                    "join_twice",
                    runs[0].origin,
                    runs[-1].at,
                    f"the join of run {join[:12]} made its then effect {len(made)} times "
                    f"({', '.join(made)})",
                )
            )
    for join, runs in sorted(evidence.thens.items()):
        plan = evidence.plans.get(join)
        if plan is None:
            continue  # No fan-out of its parent returned: nothing to compare with.
        reported: set[str] = set()
        for ran in runs:
            wrong = evidence.inexact(plan, ran)
            if wrong and ran.origin not in reported:
                reported.add(ran.origin)  # Each then task's payload once: it is fixed.
                found.append(
                    HistoryViolation(
                        "join_inexact",
                        ran.origin,
                        ran.at,
                        f"attempt {ran.attempt_id[:12]} of the join of run {join[:12]} "
                        f"was given: {'; '.join(wrong)}",
                    )
                )
    for join, plan in sorted(evidence.plans.items()):
        children = [history.origins.get(f"task:{task_id}") for task_id in plan.children.values()]
        acknowledged = [o.acknowledged_at for o in children if o is not None]
        if len(acknowledged) < len(children) or None in acknowledged or evidence.effects(join):
            continue
        last = max(at for at in acknowledged if at is not None)
        found.append(
            HistoryViolation(
                "lost_join",
                plan.origin,
                last,
                f"every child of the join of run {join[:12]} was acknowledged by "
                f"t={last:.3f}s, and its then effect never happened",
            )
        )
    return found


class _WaitLifecycles:
    """What the history holds of each waiting run, by the id its handler noted: its tasks
    (its own, and those that wake it), its suspensions, resumed executions, signal calls, and
    its final writes."""

    def __init__(self, history: History, runs: frozenset[str] | None = None) -> None:
        self.history = history
        self.runs = frozenset(history.waiters.values()) if runs is None else runs
        self.tasks: dict[str, list[str]] = defaultdict(list)
        for name, origin in history.origins.items():
            if origin.run in self.runs:
                self.tasks[origin.run].append(name)
        self.suspensions: dict[str, list[Suspended]] = defaultdict(list)
        for suspended in history.suspensions:
            self.suspensions[suspended.run_id].append(suspended)
        self.resumptions: dict[str, list[Resumed]] = defaultdict(list)
        for resumed in history.resumptions:
            self.resumptions[resumed.run_id].append(resumed)
        self.signals: dict[str, list[SignalCall]] = defaultdict(list)
        for call in history.signals:
            self.signals[call.run_id].append(call)
        self.finals: dict[str, list[Write]] = defaultdict(list)
        for write in history.writes:
            if write.final and write.accepted and write.resource.startswith("run:"):
                self.finals[write.resource.removeprefix("run:")].append(write)

    def ended_at(self, run: str, *, before_wait: bool) -> float | None:
        """When the queue first heard a 2xx that shows ``run`` past its pre-wait part (any of
        its tasks': its own is answered so once it waits), or (``before_wait`` False) ended:
        a waking task's 2xx heard after the run's first accepted final write (before it, a
        waking task is answered 200 with nothing run: a timeout task come for an earlier
        deadline than the one recorded, which asks for the one due then, and whose
        duplicate may still resume the run), or its own task's when it never suspended."""
        origins = [self.history.origins[name] for name in self.tasks[run]]
        if before_wait or not self.suspensions[run]:
            times = [o.acknowledged_at for o in origins]
            return min((at for at in times if at is not None), default=None)
        first_final = min((write.at for write in self.finals[run]), default=None)
        if first_final is None:
            return None
        waking = {name for name in self.tasks[run] if self.history.origins[name].wakes}
        return min(
            (
                answer.at
                for answer in self.history.answers
                if answer.origin in waking
                and 200 <= answer.status < 300
                and answer.at >= first_final
            ),
            default=None,
        )

    def finished(self, run: str) -> bool:
        """Whether an attempt of ``run`` made its accepted final write."""
        return bool(self.finals[run])

    def first_suspension(self, run: str) -> Suspended | None:
        return min(self.suspensions[run], key=lambda s: s.at, default=None)


def _waits(history: History) -> list[HistoryViolation]:
    evidence = _WaitLifecycles(history)
    found: list[HistoryViolation] = []
    for run in sorted(evidence.runs):
        found += _resumed_twice(evidence, run)
    for run in sorted(evidence.runs):
        found += _resumed_unsignalled(evidence, run)
    for run in sorted(evidence.runs):
        found += _lost_resume(evidence, run)
    return found


def _accepted_payloads(calls: list[SignalCall]) -> list[str] | None:
    """The payloads (as JSON) the wait may resolve with once a call was answered True: those
    of the calls up to that one (a call that raised may have recorded its own); None while
    no call was answered True."""
    candidates: list[str] = []
    for call in calls:
        candidates.append(json.dumps(call.payload, sort_keys=True))
        if call.accepted:
            return candidates
    return None


def _resumed_twice(evidence: _WaitLifecycles, run: str) -> list[HistoryViolation]:
    resumptions = evidence.resumptions[run]
    if not resumptions:
        return []
    found = []
    first = resumptions[0]
    other = next((r for r in resumptions if r.resolution != first.resolution), None)
    if other is not None:
        found.append(
            HistoryViolation(
                "resumed_twice",
                other.origin,
                other.at,
                f"attempt {other.attempt_id[:12]} of run {run[:12]} resumed with "
                f"{other.resolution}, attempt {first.attempt_id[:12]} with {first.resolution}",
            )
        )
    accepted = _accepted_payloads(evidence.signals[run])
    if accepted is not None:
        wrong = next((r for r in resumptions if r.resolution not in accepted), None)
        if wrong is not None:
            found.append(
                HistoryViolation(
                    "resumed_twice",
                    wrong.origin,
                    wrong.at,
                    f"attempt {wrong.attempt_id[:12]} of run {run[:12]} resumed with "
                    f"{wrong.resolution}, after a signal with {' or '.join(accepted)} was "
                    "answered True: the wait resolved again",
                )
            )
    return found


def _resumed_unsignalled(evidence: _WaitLifecycles, run: str) -> list[HistoryViolation]:
    found = []
    sent = {json.dumps(call.payload, sort_keys=True) for call in evidence.signals[run]}
    suspended = evidence.first_suspension(run)
    skew = evidence.history.max_clock_skew
    for resumed in evidence.resumptions[run]:
        wrong = ""
        if not resumed.timed_out and resumed.resolution not in sent:
            wrong = f"the payload {resumed.resolution}, which no signal call carried"
        elif resumed.timed_out and (suspended is None or suspended.timeout is None):
            wrong = "a timeout it never waited with"
        elif resumed.timed_out and suspended is not None and suspended.timeout is not None:
            due = suspended.at + suspended.timeout - skew
            if resumed.at < due:
                wrong = (
                    f"its timeout, {due - resumed.at:.3f}s before it was due (suspended at "
                    f"t={suspended.at:.3f}s for {suspended.timeout:g}s)"
                )
        if wrong:
            found.append(
                HistoryViolation(
                    "resumed_unsignalled",
                    resumed.origin,
                    resumed.at,
                    f"attempt {resumed.attempt_id[:12]} of run {run[:12]} resumed with {wrong}",
                )
            )
    if suspended is None:
        return found
    for body in evidence.history.step_bodies:
        if body.run_id == run and body.at > suspended.at:
            found.append(
                HistoryViolation(
                    "resumed_unsignalled",
                    body.origin,
                    body.at,
                    f"attempt {body.attempt_id[:12]} ran the step {body.step} of run "
                    f"{run[:12]} again, after the run suspended at t={suspended.at:.3f}s",
                )
            )
    return found


def _lost_resume(evidence: _WaitLifecycles, run: str) -> list[HistoryViolation]:
    if evidence.finished(run):
        return []
    end = evidence.history.ended_at
    answered = [c.at for c in evidence.signals[run] if c.accepted]
    suspended = evidence.first_suspension(run)
    due: list[tuple[float, str]] = []
    if answered:
        due.append((answered[0], f"a signal call was answered True at t={answered[0]:.3f}s"))
    if suspended is not None and suspended.timeout is not None:
        at = suspended.at + suspended.timeout
        due.append((at, f"its timeout was due at t={at:.3f}s"))
    if not due or min(due)[0] + RESUME_WITHIN > end:
        return []
    at, why = min(due)
    return [
        HistoryViolation(
            "lost_resume",
            f"run:{run}",
            at,
            f"run {run[:12]} never made its final write: {why}",
        )
    ]


def _cancelled_runs(history: History) -> frozenset[str]:
    """The runs a user may have cancelled: a call answered True, or one that raised."""
    return frozenset(call.run_id for call in history.cancels if call.accepted is not False)


def _cancels(history: History) -> list[HistoryViolation]:
    found: list[HistoryViolation] = []
    skew = history.max_clock_skew
    claims = {s.attempt_id: s.claimed - skew for s in history.starts}  # The earliest claim.
    answered: dict[str, float] = {}
    for call in history.cancels:
        if call.accepted:
            answered.setdefault(call.run_id, call.at)
    for run, at in sorted(answered.items()):
        after: dict[str, list[StepBody]] = defaultdict(list)
        for body in history.step_bodies:
            if body.run_id == run and body.at > at:
                after[body.attempt_id].append(body)
        for attempt, bodies in after.items():
            late = claims.get(attempt, at) > at
            if late or len(bodies) > 1:
                wrong = bodies[0] if late else bodies[1]
                found.append(
                    HistoryViolation(
                        "ran_after_cancel",
                        wrong.origin,
                        wrong.at,
                        f"attempt {attempt[:12]} "
                        + ("(claimed after the cancel) " if late else "")
                        + f"started step {wrong.step} of run {run[:12]}, {len(bodies)} step "
                        f"bodies after a cancel call was answered True at t={at:.3f}s",
                    )
                )
        for started in history.starts:
            if started.parent_run_id == run and started.claimed - skew > at:
                found.append(
                    HistoryViolation(
                        "ran_after_cancel",
                        started.origin,
                        started.at,
                        f"child {started.run_id[:12]} of run {run[:12]} started, claimed after "
                        f"a cancel call for its parent was answered True at t={at:.3f}s",
                    )
                )
        for resumed in history.resumptions:
            if resumed.run_id == run and claims.get(resumed.attempt_id, at) > at:
                found.append(
                    HistoryViolation(
                        "ran_after_cancel",
                        resumed.origin,
                        resumed.at,
                        f"attempt {resumed.attempt_id[:12]} resumed run {run[:12]} from its "
                        f"wait, claimed after a cancel call was answered True at t={at:.3f}s",
                    )
                )
    return found
