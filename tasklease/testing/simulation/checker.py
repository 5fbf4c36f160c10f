"""The independent history checker: reads what the effects left (the downstream's writes, the
ledger's rows, the queue's and the scheduler's logs) and never tasklease's run records, and
names each way they break the guarantee.

The invariants, each a function of the :class:`~tasklease.testing.simulation.history.History`:

- ``one_key_per_lifecycle``: every execution of one lifecycle presents the same idempotency
  key, and no two lifecycles share one (else a third party with idempotency keys does the
  effect twice, or drops one); the deliveries of one continued run are one lifecycle.
- ``write_after_acknowledged``: no handler writes for a lifecycle whose 2xx the queue heard
  (a completed run never runs again).
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
  final write.
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
- ``crashed``: nothing escaped the real code as an unexpected exception.

The joins are told apart by their parent's run id (one fan-out with a join per parent run),
from what the parent handler saw its fan-out return, never from tasklease's join records.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tasklease.testing.simulation.history import FanInPlan, History, StepBody, ThenRun, Write
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
    "crashed",
)


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
    for write in history.writes:
        origin = history.origins.get(write.origin)
        acknowledged = origin.acknowledged_at if origin is not None else None
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
    for name, origin in history.origins.items():
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
