"""The standard ``OTEL_*`` variables that map onto run-otel keys.

Names come from the SDK's ``opentelemetry.sdk.environment_variables`` and
``k=v,k2=v2`` lists are parsed with its ``parse_env_headers``, as the SDK's own
exporters read them. The trace-specific variable wins over the general one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk import environment_variables as V
from opentelemetry.util.re import parse_env_headers

# run-otel key <- (the traces variable, the general variable)
_EXPORT_KEYS: dict[str, tuple[str, ...]] = {
    "protocol": (V.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, V.OTEL_EXPORTER_OTLP_PROTOCOL),
    "endpoint": (V.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, V.OTEL_EXPORTER_OTLP_ENDPOINT),
    "headers": (V.OTEL_EXPORTER_OTLP_TRACES_HEADERS, V.OTEL_EXPORTER_OTLP_HEADERS),
    "timeout_seconds": (V.OTEL_EXPORTER_OTLP_TRACES_TIMEOUT, V.OTEL_EXPORTER_OTLP_TIMEOUT),
    "insecure": (V.OTEL_EXPORTER_OTLP_TRACES_INSECURE, V.OTEL_EXPORTER_OTLP_INSECURE),
    "compression": (V.OTEL_EXPORTER_OTLP_TRACES_COMPRESSION, V.OTEL_EXPORTER_OTLP_COMPRESSION),
    "certificate": (V.OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE, V.OTEL_EXPORTER_OTLP_CERTIFICATE),
    "client_certificate": (V.OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE, V.OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE),
    "client_key": (V.OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY, V.OTEL_EXPORTER_OTLP_CLIENT_KEY),
    # The log records': the logs variable, else the general one (never the traces one).
    "logs_certificate": (V.OTEL_EXPORTER_OTLP_LOGS_CERTIFICATE, V.OTEL_EXPORTER_OTLP_CERTIFICATE),
    "logs_client_certificate": (V.OTEL_EXPORTER_OTLP_LOGS_CLIENT_CERTIFICATE, V.OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE),
    "logs_client_key": (V.OTEL_EXPORTER_OTLP_LOGS_CLIENT_KEY, V.OTEL_EXPORTER_OTLP_CLIENT_KEY),
}
_VALUE_LENGTH = (V.OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT, V.OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT)


# The GenAI instrumentations' content switch: true/false, or the newer modes (upper case in
# opentelemetry-util-genai). run-otel writes content on spans only, so a mode with spans turns it on.
GENAI_CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_CAPTURE_MODES = {
    "true": True,
    "span_only": True,
    "span_and_event": True,
    "false": False,
    "no_content": False,
    "event_only": False,
}


def otel_environment(env: Mapping[str, str], error: type[Exception] = ValueError) -> dict[str, dict[str, Any]]:
    """The run-otel keys the OTEL_* variables in ``env`` set, as {section: {key: value}}."""
    out: dict[str, dict[str, Any]] = {}
    for (section, key), name in otel_variables(env).items():
        out.setdefault(section, {})[key] = _value(key, name, env[name], error)
    return out


def otel_variables(env: Mapping[str, str]) -> dict[tuple[str, str], str]:
    """(section, key) -> the OTEL_* variable set in ``env`` that sets it, as otel_environment reads them."""
    found: dict[tuple[str, str], str] = {}
    if env.get(GENAI_CAPTURE_CONTENT, "").strip():
        found[("content", "capture")] = GENAI_CAPTURE_CONTENT
    for key, names in _EXPORT_KEYS.items():
        name = next((n for n in names if env.get(n)), None)
        if name is not None:
            found[("export", key)] = name
    if env.get(V.OTEL_SERVICE_NAME):
        found[("service", "name")] = V.OTEL_SERVICE_NAME
    name = next((n for n in _VALUE_LENGTH if env.get(n)), None)
    if name is not None:
        found[("trace", "max_attribute_length")] = name
    return found


def _value(key: str, name: str, text: str, error: type[Exception]) -> Any:
    if key == "capture":
        mode = text.strip().lower()
        if mode not in _CAPTURE_MODES:
            raise error(f"{name} must be one of {', '.join(_CAPTURE_MODES)}, got {text.strip()!r}")
        return _CAPTURE_MODES[mode]
    if key == "max_attribute_length":  # the SDK's attribute value limit
        try:
            return int(text)
        except ValueError:
            raise error(f"{name} must be a whole number of characters, got {text!r}") from None
    if key == "headers":
        return parse_env_headers(text, liberal=True)
    if key == "insecure":
        return text.strip().lower() == "true"
    if key == "timeout_seconds":
        try:
            return float(text) / 1000.0  # the OTLP spec gives it in milliseconds
        except ValueError:
            raise error(f"{name} must be a number of milliseconds, got {text!r}") from None
    return text


def resource_attributes_from_env(env: Mapping[str, str]) -> dict[str, str]:
    """OTEL_RESOURCE_ATTRIBUTES, parsed."""
    return dict(parse_env_headers(env.get(V.OTEL_RESOURCE_ATTRIBUTES, ""), liberal=True))
