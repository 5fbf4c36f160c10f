"""Turning OpenTelemetry export on from the environment, and the Prometheus endpoint."""

from __future__ import annotations

import os
import textwrap
from typing import Any

import pytest

from tasklease.errors import ConfigurationError
from tasklease.plumbing.otel_setup import Settings, build, settings_from_env
from tasklease.protocol import ENV_OTEL_SETUP
from tests.support.fresh_python import run_python


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, Settings()),
        ({"TASKLEASE_OTEL": "otlp"}, Settings(("otlp",), ("otlp",))),
        ({"TASKLEASE_OTEL": "gcp, console"}, Settings(("gcp", "console"), ("console",))),
        ({"TASKLEASE_OTEL": "none"}, Settings()),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, Settings(("otlp",), ())),
        (
            {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "otlp"},
            Settings((), ("otlp",)),
        ),
        ({"TASKLEASE_METRICS": "prometheus"}, Settings(prometheus=True)),
        ({"TASKLEASE_OTEL": "otlp", "OTEL_SDK_DISABLED": "true"}, Settings()),
    ],
)
def test_settings_follow_tasklease_otel_then_the_standard_variables(
    environ: dict[str, str], expected: Settings
) -> None:
    assert settings_from_env(environ) == expected


def test_create_app_looks_for_every_variable_the_settings_read() -> None:
    """With none of ``ENV_OTEL_SETUP`` set, create_app skips otel_setup: nothing else counts."""

    read: set[str] = set()

    class Recording(dict[str, str]):
        def get(self, key: str, default: Any = None) -> Any:
            read.add(key)
            return super().get(key, default)

    assert settings_from_env(Recording()) == Settings()
    assert read - {"OTEL_SDK_DISABLED"} == set(ENV_OTEL_SETUP)
    for name in ENV_OTEL_SETUP:  # Each one alone can ask for something.
        value = "prometheus" if name == "TASKLEASE_METRICS" else "console"
        assert settings_from_env({name: value}).wanted, name


@pytest.mark.parametrize("environ", [{"TASKLEASE_OTEL": "zipkin"}, {"TASKLEASE_METRICS": "statsd"}])
def test_an_unknown_exporter_is_a_configuration_error(environ: dict[str, str]) -> None:
    with pytest.raises(ConfigurationError):
        settings_from_env(environ)


def test_build_makes_providers_without_sending_anything() -> None:
    setup = build(Settings(("otlp", "console"), ("console",), prometheus=True), "svc")
    try:
        assert setup.tracer_provider is not None
        assert setup.meter_provider is not None
        assert setup.registry is not None
        assert setup.tracer_provider.resource.attributes["service.name"] in (
            "svc",
            os.environ.get("OTEL_SERVICE_NAME"),
        )
    finally:
        setup.tracer_provider.shutdown()
        setup.meter_provider.shutdown()


SCRIPT = textwrap.dedent(
    """
    import requests
    from tasklease.emulator import CloudTasksEmulator
    from tests.support.helpers import task_headers
    from tasklease.worker import Router, create_app
    from tasklease.worker.stores import MemoryStore

    router = Router()
    router.task("send")(lambda payload, ctx: None)
    client = create_app(router, store=MemoryStore(), auth="none").test_client()
    assert client.post("/tasks/send", headers=task_headers(), data="{}").status_code == 200
    print(client.get("/metrics").get_data(as_text=True))
    with CloudTasksEmulator() as emulator:
        emulator.create_queue("projects/p/locations/us-central1/queues/q")
        print(requests.get(emulator.url + "/metrics", timeout=5).text)
    """
)


def test_prometheus_endpoint_serves_worker_and_emulator_metrics() -> None:
    env = {**os.environ, "TASKLEASE_METRICS": "prometheus", "TASKLEASE_LOG_FORMAT": "text"}
    env.pop("TASKLEASE_OTEL", None)
    done = run_python(SCRIPT, env)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "tasklease_deliveries_total{" in text
    assert 'outcome="processed"' in text
    assert "tasklease_delivery_duration_seconds_bucket{" in text
    assert "cloudtasks_queue_depth{" in text and 'queue_id="q"' in text
