"""Refuse a keyword that ``**options: Unpack[SomeOptions]`` does not define.

A ``TypedDict`` spells a function's options once for the type checker, but at run time
``**options`` takes any keyword: without this check a misspelt ``audiance=`` would be dropped
without a word, and the worker would run without the setting it was given.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Collection, Iterable

__all__ = ["refuse_unknown_options"]

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def refuse_unknown_options(
    function: Callable[..., object], given: Iterable[str], options: Collection[str]
) -> None:
    """Raise TypeError, as Python does for an unexpected keyword, if ``given`` holds a name
    that is neither one of ``options`` nor a named parameter of ``function``; the message
    names the closest known name and every one ``function`` takes."""
    unknown = sorted(set(given) - set(options))
    if not unknown:
        return
    parameters = [
        parameter.name
        for parameter in inspect.signature(function).parameters.values()
        if parameter.kind in _NAMED
    ]
    known = [*parameters, *sorted(set(options) - set(parameters))]
    described = ", ".join(f"{name!r}{_closest(name, known)}" for name in unknown)
    arguments = "argument" if len(unknown) == 1 else "arguments"
    raise TypeError(
        f"{function.__qualname__}() got an unexpected keyword {arguments} {described}; "
        f"it takes: {', '.join(known)}"
    )


def _closest(name: str, known: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the known name closest to ``name``, if one is close."""
    matches = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {matches[0]!r}?)" if matches else ""
