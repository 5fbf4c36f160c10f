"""Install the OpenTelemetry SDK as the environment asks, in processes tasklease serves.

- ``TASKLEASE_OTEL``: comma-separated exporters of traces and metrics: ``otlp`` (OTLP over
  HTTP, configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables), ``gcp`` (traces to
  Cloud Trace; for Cloud Monitoring, scrape ``/metrics`` with Managed Service for Prometheus
  or send ``otlp`` through a collector), ``console``. Unset, the standard
  ``OTEL_TRACES_EXPORTER`` and ``OTEL_METRICS_EXPORTER`` decide (``otlp``, ``console``).
- ``TASKLEASE_METRICS=prometheus``: metrics served at ``GET /metrics`` in Prometheus' text
  format (per process: scrape each gunicorn worker, or use OTLP to aggregate).

With neither, nothing is installed and the API stays a no-op. Nothing is installed either
when the application set its own providers first, or ``OTEL_SDK_DISABLED=true``. The
resource comes from ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` as usual.
Needs ``tasklease[otel]`` (exporters) or ``tasklease[prometheus]``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace

from tasklease.errors import ConfigurationError

_log = logging.getLogger("tasklease.telemetry")
TRACE_EXPORTERS = frozenset({"otlp", "gcp", "console"})
METRIC_EXPORTERS = frozenset({"otlp", "console"})

_lock = threading.Lock()
_installed: dict[str, Setup] = {}


@dataclass(frozen=True)
class Settings:
    """What the environment asks for."""

    traces: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()
    prometheus: bool = False

    @property
    def wanted(self) -> bool:
        return bool(self.traces or self.metrics or self.prometheus)


@dataclass(frozen=True)
class Setup:
    """What was installed; ``registry`` is the Prometheus registry ``/metrics`` serves."""

    settings: Settings
    tracer_provider: Any = None
    meter_provider: Any = None
    registry: Any = None


def settings_from_env(environ: Mapping[str, str] | None = None) -> Settings:
    """Read ``TASKLEASE_OTEL``, ``TASKLEASE_METRICS`` and the standard ``OTEL_*`` choices."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return Settings()
    prometheus = _names(env.get("TASKLEASE_METRICS", "")) == ["prometheus"]
    if _names(env.get("TASKLEASE_METRICS", "")) not in ([], ["prometheus"], ["none"]):
        raise ConfigurationError("TASKLEASE_METRICS: use prometheus, or leave it unset")
    chosen = _names(env.get("TASKLEASE_OTEL", ""))
    if chosen:
        unknown = set(chosen) - TRACE_EXPORTERS - {"none"}
        if unknown:
            raise ConfigurationError(
                f"TASKLEASE_OTEL: unknown exporter {', '.join(sorted(unknown))} "
                f"(use {', '.join(sorted(TRACE_EXPORTERS))} or none)"
            )
        traces = [name for name in chosen if name in TRACE_EXPORTERS]
        metric_names = [name for name in chosen if name in METRIC_EXPORTERS]
    else:
        traces = [n for n in _names(env.get("OTEL_TRACES_EXPORTER", "")) if n in TRACE_EXPORTERS]
        metric_names = [
            n for n in _names(env.get("OTEL_METRICS_EXPORTER", "")) if n in METRIC_EXPORTERS
        ]
    return Settings(tuple(traces), tuple(metric_names), prometheus)


def configure_from_env(service_name: str, environ: Mapping[str, str] | None = None) -> Setup:
    """Install what the environment asks for, once per process, as the global providers."""
    with _lock:
        if "done" in _installed:
            return _installed["done"]
        settings = settings_from_env(environ)
        setup = Setup(settings)
        if settings.wanted:
            if _has_sdk_providers():
                _log.info("OpenTelemetry providers already set by the application: kept")
            else:
                setup = build(settings, service_name)
                if setup.tracer_provider is not None:
                    trace.set_tracer_provider(setup.tracer_provider)
                if setup.meter_provider is not None:
                    metrics.set_meter_provider(setup.meter_provider)
                _log.info(
                    "OpenTelemetry on: traces to %s, metrics to %s%s",
                    ",".join(settings.traces) or "nowhere",
                    ",".join(settings.metrics) or "no exporter",
                    ", Prometheus at /metrics" if settings.prometheus else "",
                )
        _installed["done"] = setup
        return setup


def build(settings: Settings, service_name: str) -> Setup:
    """SDK providers with the exporters ``settings`` names (not installed anywhere)."""
    try:
        from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415
        from opentelemetry.sdk.metrics.export import (  # noqa: PLC0415
            MetricReader,
            PeriodicExportingMetricReader,
        )
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
    except ImportError as exc:
        raise ConfigurationError(
            "tracing or metrics export needs the OpenTelemetry SDK: "
            "pip install 'tasklease[otel]' (or 'tasklease[prometheus]')"
        ) from exc
    resource = _resource(Resource, service_name)
    tracer_provider = None
    if settings.traces:
        tracer_provider = TracerProvider(resource=resource)
        for name in settings.traces:
            tracer_provider.add_span_processor(BatchSpanProcessor(_span_exporter(name)))
    readers: list[MetricReader] = [
        PeriodicExportingMetricReader(_metric_exporter(name)) for name in settings.metrics
    ]
    registry = None
    if settings.prometheus:
        try:
            from opentelemetry.exporter.prometheus import (  # noqa: PLC0415
                PrometheusMetricReader,
            )
            from prometheus_client import CollectorRegistry  # noqa: PLC0415
        except ImportError as exc:
            raise ConfigurationError(
                "TASKLEASE_METRICS=prometheus needs: pip install 'tasklease[prometheus]'"
            ) from exc
        registry = CollectorRegistry()
        readers.append(PrometheusMetricReader(registry=registry))
    meter_provider = MeterProvider(metric_readers=readers, resource=resource) if readers else None
    return Setup(settings, tracer_provider, meter_provider, registry)


def metrics_view(registry: Any) -> Callable[[], Any]:
    """A Flask view answering ``GET /metrics`` from ``registry`` in Prometheus' text format."""
    import flask  # noqa: PLC0415
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest  # noqa: PLC0415

    def view() -> flask.Response:
        return flask.Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)

    return view


def _names(value: str) -> list[str]:
    return [name.strip().lower() for name in value.split(",") if name.strip()]


def _has_sdk_providers() -> bool:
    """True when someone installed providers: the API's own defaults are its proxies."""
    installed = (trace.get_tracer_provider(), metrics.get_meter_provider())
    return any(
        not type(p).__module__.startswith("opentelemetry.") or "sdk" in type(p).__module__
        for p in installed
    )


def _resource(resource_class: Any, service_name: str) -> Any:
    # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES win over tasklease's default name.
    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    return resource_class.create({} if named else {"service.name": service_name})


def _span_exporter(name: str) -> Any:
    try:
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
                OTLPSpanExporter,
            )

            return OTLPSpanExporter()
        if name == "gcp":
            from opentelemetry.exporter.cloud_trace import (  # noqa: PLC0415
                CloudTraceSpanExporter,
            )

            return CloudTraceSpanExporter()  # type: ignore[no-untyped-call]
    except ImportError as exc:
        raise ConfigurationError(
            f"the {name} exporter needs: pip install 'tasklease[otel]'"
        ) from exc
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter  # noqa: PLC0415

    return ConsoleSpanExporter()


def _metric_exporter(name: str) -> Any:
    if name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # noqa: PLC0415
                OTLPMetricExporter,
            )
        except ImportError as exc:
            raise ConfigurationError(
                "the otlp exporter needs: pip install 'tasklease[otel]'"
            ) from exc
        return OTLPMetricExporter()
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter  # noqa: PLC0415

    return ConsoleMetricExporter()
