from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from tasklease.worker.observe import logs
from tasklease.worker.observe.logs import CloudLoggingFormatter, ReadableFormatter


def test_log_line_has_the_shape_cloud_logging_reads() -> None:
    record = logging.LogRecord(
        "tasklease.execution", logging.WARNING, __file__, 1, "msg %s", ("x",), None
    )
    record.tasklease = {"handler": "h", "run_id": "r", "outcome": "lost_claim"}
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
    record.tasklease = {"outcome": "processed", "run_id": "a" * 64, "attempt": 2, "queue": "q"}
    line = ReadableFormatter().format(record)
    assert "task t: processed" in line
    assert "outcome=processed" in line and "attempt=2" in line and "queue=q" in line
    assert "run_id=aaaaaaaaaaaa]" in line  # Cut to 12 characters.


@pytest.fixture
def own_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """tasklease's logging as configure_logging sets it up in a fresh process, to a buffer."""
    logger = logging.getLogger("tasklease")
    root = logging.getLogger()
    saved = (list(logger.handlers), logger.propagate, logger.level, list(root.handlers))
    logger.handlers.clear()
    root.handlers.clear()
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.delenv("TASKLEASE_LOG_FORMAT", raising=False)
    logs.configure_logging()
    yield stream
    logger.handlers[:], logger.propagate, root.handlers[:] = saved[0], saved[1], saved[3]
    logger.setLevel(saved[2])
    monkeypatch.setattr(logs, "_own_json_handler", None)


def test_the_direct_execution_line_is_the_line_the_formatter_writes(
    own_logging: io.StringIO,
) -> None:
    fields = {"handler": "h", "run_id": "r", "outcome": "processed", "duration_ms": 0.5}
    logs.log_execution("task h: processed", dict(fields))  # The direct path.
    logger = logging.getLogger(logs.EXECUTION_LOGGER)
    logger.addFilter(lambda record: True)  # Any filter sends it through logging instead.
    try:
        logs.log_execution("task h: processed", dict(fields))
    finally:
        logger.filters.clear()
    direct, through_logging = (json.loads(line) for line in own_logging.getvalue().splitlines())
    assert direct.pop("time") and through_logging.pop("time")
    assert direct == through_logging
    assert direct["severity"] == "INFO" and direct["logger"] == "tasklease.execution"


def test_the_direct_path_respects_levels_and_a_users_own_handlers(
    own_logging: io.StringIO,
) -> None:
    logging.getLogger("tasklease").setLevel(logging.WARNING)
    logs.log_execution("quiet", {"outcome": "processed"})
    assert own_logging.getvalue() == ""
    logging.getLogger("tasklease").setLevel(logging.INFO)
    captured: list[logging.LogRecord] = []

    class Capturing(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            captured.append(record)

    extra = Capturing()
    logging.getLogger("tasklease").addHandler(extra)
    logs.log_execution("seen by both", {"outcome": "processed"})
    assert [record.getMessage() for record in captured] == ["seen by both"]
    assert "seen by both" in own_logging.getvalue()
