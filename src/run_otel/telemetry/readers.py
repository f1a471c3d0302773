"""Where the metrics go: the Prometheus registry /metrics serves, OTLP push, or both."""

from __future__ import annotations

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader, PeriodicExportingMetricReader
from prometheus_client import CollectorRegistry

from ..config import ExportConfig, MetricsConfig
from .exemplars import ExemplarCollector, ExemplarStore


def metric_readers(
    config: MetricsConfig, export: ExportConfig
) -> tuple[list[MetricReader], CollectorRegistry | None, ExemplarStore]:
    """The readers the config asks for (pull, push, or both), the registry /metrics serves, and its exemplars."""
    readers: list[MetricReader] = []
    registry = None
    exemplars = ExemplarStore()
    if config.prometheus:
        # The SDK's families go to a registry of their own; the served one adds their exemplars.
        sdk_families = CollectorRegistry(auto_describe=True)
        readers.append(PrometheusMetricReader(registry=sdk_families))
        registry = CollectorRegistry()
        registry.register(ExemplarCollector(sdk_families, exemplars))
    if config.otlp:
        readers.append(PeriodicExportingMetricReader(_otlp_metric_exporter(export), int(config.otlp_interval_seconds * 1000)))
    return readers, registry, exemplars


def _otlp_metric_exporter(config: ExportConfig) -> MetricExporter:
    endpoint = config.resolved_endpoint()
    if config.protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

        return HttpExporter(endpoint=endpoint.rstrip("/") + "/v1/metrics", headers=config.headers)
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

    return GrpcExporter(endpoint=endpoint, insecure=config.insecure, headers=config.headers or None)
