"""Where the metrics go: the Prometheus registry /metrics serves, OTLP push, or both."""

from __future__ import annotations

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader, PeriodicExportingMetricReader
from prometheus_client import CollectorRegistry

from ..config import ExportConfig, MetricsConfig
from ..export.transport import grpc_target, traces_tls
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
    """The SDK's OTLP metric exporter, to the traces' endpoint with the traces' transport: the same
    protocol, TLS or plaintext, CA, client pair, headers, compression and timeout."""
    endpoint, tls = config.resolved_endpoint(), traces_tls(config)
    gzip = config.compression == "gzip"
    if config.protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

        return HttpExporter(
            endpoint=endpoint.rstrip("/").removesuffix("/v1/traces") + "/v1/metrics",
            certificate_file=tls.ca or None,
            client_certificate_file=tls.cert or None,
            client_key_file=tls.key or None,
            session=tls.requests_session(),
            headers=config.headers,
            timeout=config.timeout_seconds,
            compression=HttpCompression.Gzip if gzip else HttpCompression.NoCompression,
        )
    import grpc
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

    where = grpc_target(endpoint, config, tls)
    return GrpcExporter(
        # The scheme says TLS or not as grpc_target decided it, which the SDK would otherwise guess from the endpoint.
        endpoint=f"{'https' if where.secure else 'http'}://{where.target}",
        insecure=not where.secure,
        credentials=grpc.ssl_channel_credentials(*tls.read()) if where.secure else None,
        headers=config.headers or None,
        timeout=config.timeout_seconds,
        compression=grpc.Compression.Gzip if gzip else grpc.Compression.NoCompression,
    )
