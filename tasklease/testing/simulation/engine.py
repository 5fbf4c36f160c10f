"""Virtual time and a seeded scheduler of actors, one of them running at a time.

Each actor is a thread running real code (an :class:`~tasklease.worker.delivery.executor.Executor`
delivery, a lease renewal). It runs only while the engine has handed it the baton, and gives it
back at each :meth:`Engine.pause`: at every store call, downstream call and handler step. The
engine then runs the next event of its timeline, in virtual time, ties broken in the order they
were scheduled. Whatever order the threads' real scheduler picks, the same seed makes the same
run: only one thread is ever runnable.

An instance (a Cloud Run instance) owns actors and a clock of its own, skewed from virtual
time. Killing it stops each of its actors at its next pause, with :class:`Killed`, which
writes nothing anywhere: a process that is gone. Stalling it (a paused VM) holds each of its
actors at its next resume until the stall ends.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

__all__ = ["EPOCH", "Actor", "Engine", "Instance", "Killed"]

# Virtual time 0, as a wall clock reads it.
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


class Killed(BaseException):
    """Raised in an actor at its next pause once its instance is killed: the process is gone,
    and everything it would still do (a store write, a reply) never happens."""


@dataclass(eq=False)
class Instance:
    """One worker instance: its name, how far its wall clock is off, and whether it is
    killed or stalled (until a virtual time)."""

    name: str
    skew: timedelta
    killed: bool = False
    stalled_until: float = 0.0
    actors: list[Actor] = field(default_factory=list, repr=False)


class Actor:
    """A thread of the simulation: runs ``target()`` a step at a time, as the engine says."""

    def __init__(
        self, engine: Engine, name: str, instance: Instance | None, target: Callable[[], None]
    ) -> None:
        self.engine = engine
        self.name = name
        self.instance = instance
        self.target = target
        self.done = False
        self.crash: BaseException | None = None
        self.in_store = 0  # Depth of store calls in progress: no pause inside one.
        self.origin: str | None = (
            None  # What the actor works for (a task, a slot): effects name it.
        )
        self._go = threading.Semaphore(0)
        self._thread: threading.Thread | None = None

    @property
    def killed(self) -> bool:
        """Whether the actor's instance was killed."""
        return self.instance is not None and self.instance.killed

    def is_current(self) -> bool:
        """Whether the calling thread is this actor's."""
        return self._thread is not None and threading.current_thread() is self._thread

    def resume(self) -> None:
        """Run the actor until its next pause or its end (called by the engine only)."""
        if self.done:
            return
        engine, instance = self.engine, self.instance
        if instance is not None and not instance.killed and instance.stalled_until > engine.now:
            engine.at_time(instance.stalled_until, self.resume)
            return
        engine.running = self
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name=f"sim-{self.name}", daemon=True)
            self._thread.start()
        else:
            self._go.release()
        engine.wait_for_actor()
        engine.running = None

    def pause(self, delay: float) -> None:
        """Give the baton back; carry on ``delay`` virtual seconds later (called in the actor)."""
        if self.killed:
            raise Killed
        hook = self.engine.pause_hook
        if hook is not None:
            hook(self)  # May kill or stall this actor's instance (the fault plan's).
            if self.killed:
                raise Killed
        self.engine.at(delay, self.resume)
        self.engine.actor_paused()
        self._go.acquire()
        if self.killed:
            raise Killed

    def _main(self) -> None:
        try:
            if self.killed:
                raise Killed
            self.target()
        except Killed:
            pass
        except BaseException as exc:  # What escaped real code: the checker reports it.
            # Recorded here, not where the engine first resumed the actor: an exception
            # raised after any pause ends a later resume, which nothing else inspects.
            self.crash = exc
            self.engine.crashed.append(self)
        finally:
            self.done = True
            self.engine.actor_paused()


class Engine:
    """The timeline: events at virtual times, run in order by the engine's thread."""

    def __init__(self) -> None:
        self.now = 0.0
        self.running: Actor | None = None
        self.crashed: list[Actor] = []
        self.pause_hook: Callable[[Actor], None] | None = None
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._back = threading.Semaphore(0)

    def at(self, delay: float, event: Callable[[], None]) -> None:
        """Run ``event`` ``delay`` virtual seconds from now."""
        self.at_time(self.now + max(delay, 0.0), event)

    def at_time(self, when: float, event: Callable[[], None]) -> None:
        heapq.heappush(self._events, (max(when, self.now), next(self._order), event))

    def spawn(
        self,
        name: str,
        instance: Instance | None,
        target: Callable[[], None],
        *,
        delay: float = 0.0,
        origin: str | None = None,
    ) -> Actor:
        """A new actor, started ``delay`` from now."""
        actor = Actor(self, name, instance, target)
        actor.origin = origin
        if instance is not None:
            instance.actors.append(actor)
        self.at(delay, actor.resume)
        return actor

    def pause(self, delay: float) -> None:
        """Pause the running actor for ``delay``; outside an actor (set-up), nothing."""
        actor = self.current_actor()
        if actor is not None and actor.in_store == 0:
            actor.pause(delay)

    def sleep(self, seconds: float) -> None:
        """``time.sleep`` in virtual time, for the code an actor runs."""
        actor = self.current_actor()
        if actor is not None:
            actor.pause(seconds)

    def current_actor(self) -> Actor | None:
        """The actor whose thread is running, if the caller is it."""
        actor = self.running
        return actor if actor is not None and actor.is_current() else None

    def wait_for_actor(self) -> None:
        self._back.acquire()

    def actor_paused(self) -> None:
        self._back.release()

    def run(self, *, until: float, stop: Callable[[], bool] = lambda: False) -> None:
        """Run events up to virtual time ``until``, or until ``stop()`` after an event."""
        while self._events and self._events[0][0] <= until:
            when, _, event = heapq.heappop(self._events)
            self.now = max(self.now, when)
            event()
            if stop():
                return

    @property
    def idle(self) -> bool:
        """Nothing more is scheduled."""
        return not self._events
