"""Registration took any callable: a task handler taking ``(payload)`` only, or a scheduled one
taking ``(payload, ctx)``, registered (and passed mypy), then raised ``TypeError`` on every
delivery. Registration now refuses it, naming the signature the worker calls."""

from __future__ import annotations

from typing import Any

import pytest

from tasklease.errors import ConfigurationError
from tasklease.worker import Router, TaskContext


@pytest.mark.parametrize(
    "register",
    [
        lambda router: router.task("h")(lambda payload: None),
        lambda router: router.task("h")(lambda: None),
        lambda router: router.scheduled("j")(lambda payload, ctx: None),
        lambda router: router.task("h")(lambda payload, ctx, *, must: None),
    ],
)
def test_a_handler_of_the_wrong_arity_is_refused_at_registration(register: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"handler\(payload, ctx\)|handler\(ctx\)"):
        register(Router())


def test_extra_parameters_with_defaults_and_star_args_are_accepted() -> None:
    router = Router()

    def a(payload: Any, ctx: TaskContext, retries: int = 3) -> None:
        return None

    router.task("a")(a)
    router.task("b")(lambda *args: None)
    router.scheduled("c")(lambda ctx, **options: None)

    @router.scheduled("d")
    async def d(ctx: TaskContext, dry_run: bool = False) -> None:
        return None

    assert len(router) == 4


def test_the_refusal_names_the_expected_signature_and_the_handler() -> None:
    def send_receipt(payload: Any) -> None:
        return None

    with pytest.raises(ConfigurationError) as refused:
        Router().task()(send_receipt)  # type: ignore[arg-type]  # mypy refuses it too.
    assert "send_receipt: a task handler is called as handler(payload, ctx)" in str(refused.value)
    assert "but send_receipt(payload: 'Any') -> 'None' cannot take that" in str(refused.value)
