"""``gunicorn --config python:tasklease.plumbing.gunicorn_text_logs``: one log format in the
terminal (``tasklease dev``): gunicorn's own lines, tasklease's and the application's all
through :class:`tasklease.worker.observe.logs.ReadableFormatter` on stderr, and a handler's own
``logging`` lines carrying its run id and name.

gunicorn merges ``logconfig_dict`` into its defaults one top-level key at a time
(gunicorn/glogging.py Logger.setup), so each key here is given whole.
"""

from __future__ import annotations

from typing import Any

logconfig_dict: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"run": {"()": "tasklease.worker.observe.logs.RunFieldsFilter"}},
    "formatters": {"generic": {"()": "tasklease.worker.observe.logs.ReadableFormatter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "generic",
            "filters": ["run"],
            "stream": "ext://sys.stderr",
        },
        "error_console": {
            "class": "logging.StreamHandler",
            "formatter": "generic",
            "filters": ["run"],
            "stream": "ext://sys.stderr",
        },
    },
    "root": {"handlers": ["console"], "level": "INFO"},
    "loggers": {
        "gunicorn.error": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "gunicorn.access": {"handlers": [], "level": "INFO", "propagate": False},
    },
}
