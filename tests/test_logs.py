from __future__ import annotations

import json
import logging
import sys

from worker.logs import CloudLoggingFormatter, ReadableFormatter


def test_log_line_has_the_shape_cloud_logging_reads() -> None:
    record = logging.LogRecord(
        "tasklease.execution", logging.WARNING, __file__, 1, "msg %s", ("x",), None
    )
    record.tasklease = {"handler": "h", "run_id": "r", "outcome": "lost_claim"}  # type: ignore[attr-defined]
    line = CloudLoggingFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["severity"] == "WARNING"
    assert entry["message"] == "msg x"
    assert (entry["handler"], entry["run_id"], entry["outcome"]) == ("h", "r", "lost_claim")


def test_exceptions_are_kept_in_one_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord(
            "tasklease", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    entry = json.loads(CloudLoggingFormatter().format(record))
    assert entry["severity"] == "ERROR"
    assert "ValueError: boom" in entry["stack_trace"]


def test_readable_format_for_the_dev_stack_keeps_the_key_fields() -> None:
    record = logging.LogRecord(
        "tasklease.execution", logging.INFO, __file__, 1, "task t: processed", (), None
    )
    record.tasklease = {"outcome": "processed", "run_id": "a" * 64, "attempt": 2, "queue": "q"}  # type: ignore[attr-defined]
    line = ReadableFormatter().format(record)
    assert "task t: processed" in line
    assert "outcome=processed" in line and "attempt=2" in line and "queue=q" in line
    assert "run_id=aaaaaaaaaaaa]" in line  # Cut to 12 characters.
