"""What ``tasklease runs show --payload`` and the dashboard show of a run's payload and
result: the decoded JSON with secrets masked.

- ``TASKLEASE_REDACT_KEYS``: comma-separated key names whose values are masked at any depth,
  compared without case (default: :data:`DEFAULT_KEYS`; set it empty to mask none);
- ``TASKLEASE_REDACTOR=module:function``: a function called with each decoded value (after
  the key masking) that returns what may be shown, for secrets that no key name gives away.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from tasklease.errors import ConfigurationError

ENV_KEYS = "TASKLEASE_REDACT_KEYS"
ENV_REDACTOR = "TASKLEASE_REDACTOR"
DEFAULT_KEYS = ("password", "secret", "token", "api_key", "authorization", "card_number")
MASK = "***"


def mask_keys(value: Any, keys: frozenset[str]) -> Any:
    """``value`` with the value of every mapping key in ``keys`` (lower case) replaced."""
    if isinstance(value, Mapping):
        return {k: MASK if str(k).lower() in keys else mask_keys(v, keys) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_keys(item, keys) for item in value]
    return value


def redactor_from_env(environ: Mapping[str, str] | None = None) -> Callable[[Any], Any]:
    """The redaction the environment configures, as one function of a decoded value."""
    environ = os.environ if environ is None else environ
    names = environ.get(ENV_KEYS)
    keys = frozenset(
        name.strip().lower()
        for name in (DEFAULT_KEYS if names is None else names.split(","))
        if name.strip()
    )
    hook = _load_hook(environ.get(ENV_REDACTOR, "").strip())

    def redact(value: Any) -> Any:
        masked = mask_keys(value, keys)
        return hook(masked) if hook else masked

    return redact


def redacted_bodies(
    payload: str | None, result: str | None, redact: Callable[[Any], Any] | None = None
) -> dict[str, Any]:
    """A run's stored payload and result JSON, decoded and redacted (``redact``, else the
    environment's): ``{"payload": ..., "result": ...}``, None where there is none."""
    redact = redact or redactor_from_env()
    return {
        name: None if text is None else redact(_decoded(text))
        for name, text in (("payload", payload), ("result", result))
    }


def _decoded(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return "(not JSON: not shown)"


def _load_hook(reference: str) -> Callable[[Any], Any] | None:
    if not reference:
        return None
    module, _, name = reference.partition(":")
    try:
        hook = getattr(importlib.import_module(module), name) if name else None
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"{ENV_REDACTOR}={reference!r}: {exc}") from None
    if not callable(hook):
        raise ConfigurationError(f"{ENV_REDACTOR}={reference!r}: name a function, module:name")
    return hook  # type: ignore[no-any-return]
