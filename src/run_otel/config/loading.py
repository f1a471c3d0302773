"""Building the one Config: defaults, the TOML file, the environment, then checks.

Precedence, lowest first: built-in defaults, the TOML file, the standard
``OTEL_*`` variables (for the keys they define), then ``RUN_OTEL_<SECTION>__<KEY>``.
Every key is checked: an unknown key or a value of the wrong type stops the
start with the key's dotted name.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy.engine import make_url

from ..otel_env import otel_environment, otel_variables
from .sections import (
    CONFIG_ENV,
    DEFAULT_THRESHOLDS,
    ENV_PREFIX,
    SECTIONS,
    TLS_MODES,
    VERIFYING_TLS_MODES,
    Config,
    ConfigError,
    ExportConfig,
    GenerateConfig,
    SourceConfig,
)

# (section, key, validator, message): checks beyond the type.
_CHOICES = {
    ("export", "protocol"): ("grpc", "http/protobuf"),
    ("export", "compression"): ("none", "gzip"),
    ("trace", "tool_time_anchor"): ("start", "end"),
    ("log", "format"): ("text", "json"),
    ("source", "tls_mode"): TLS_MODES,
    ("log", "level"): ("DEBUG", "INFO", "WARNING", "ERROR"),
}
_CONVENTIONS = ("gen_ai", "openinference")
# Below this a request holds too few spans, and a span's name and status alone may not fit.
MIN_REQUEST_BYTES = 64 * 1024
_POSITIVE = {
    ("feedback", "window_seconds"),
    ("feedback", "interval_seconds"),
    ("poll", "interval_seconds"),
    ("poll", "batch_size"),
    ("poll", "tool_chunk_size"),
    ("poll", "retry_initial_seconds"),
    ("poll", "retry_max_seconds"),
    ("export", "timeout_seconds"),
    ("export", "max_timeout_seconds"),
    ("export", "max_attempts"),
    ("content", "max_length"),
    ("trace", "max_spans_per_trace"),
    ("trace", "max_attribute_length"),
    ("trace", "max_list_length"),
    ("ha", "takeover_seconds"),
    ("metrics", "otlp_interval_seconds"),
    ("metrics", "max_tool_names"),
    ("metrics", "max_dedup_reasons"),
    ("source", "statement_timeout_seconds"),
    ("poll", "stuck_after_seconds"),
    ("poll", "shutdown_timeout_seconds"),
    ("slo", "window_days"),
}
_NON_NEGATIVE = {
    ("poll", "settle_seconds"),
    ("poll", "run_timeout_seconds"),
    ("poll", "gap_timeout_seconds"),
    ("poll", "late_window_seconds"),
    ("source", "connect_timeout_seconds"),
    ("poll", "backfill_retry_seconds"),
}


def load_config(path: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Build the one Config from a TOML file (optional) and the environment."""
    env = os.environ if environ is None else environ
    path = path or env.get(CONFIG_ENV) or None
    raw: dict[str, Any] = _read_toml(Path(path)) if path else {}
    _merge(raw, otel_environment(env, ConfigError))
    variables = _run_otel_variables(env)
    for (section, key), name in variables.items():
        _check_known(section, key, name)
    _merge(raw, _run_otel_environment(env))
    return build_config(raw)


def overridden_file_keys(path: str | os.PathLike | None, environ: Mapping[str, str] | None = None) -> list[str]:
    """Lines naming each key the file sets and an OTEL_* or RUN_OTEL_* variable overrides, so
    that precedence is visible (an image's ENV or an operator's injected OTEL_* silently
    beating a mounted file)."""
    env = os.environ if environ is None else environ
    path = path or env.get(CONFIG_ENV) or None
    if not path:
        return []
    raw = _read_toml(Path(path))
    return [
        f"{name} overrides {section}.{key} set in {path}"
        for (section, key), name in {**otel_variables(env), **_run_otel_variables(env)}.items()
        if isinstance(raw.get(section), Mapping) and key in raw[section]
    ]


def build_config(raw: Mapping[str, Any]) -> Config:
    """A Config from nested dicts, rejecting unknown keys and bad values."""
    sections = {}
    for section, values in raw.items():
        if section not in SECTIONS:
            raise ConfigError(f"unknown config section [{section}] (known: {', '.join(SECTIONS)})")
        if not isinstance(values, Mapping):
            raise ConfigError(f"[{section}] must be a table of keys")
        sections[section] = _build_section(section, SECTIONS[section], values)
    if "generate" in sections:
        sections["generate"] = _with_default_thresholds(sections["generate"])
    config = Config(**sections)
    _validate(config)
    return config


def _with_default_thresholds(generate: GenerateConfig) -> GenerateConfig:
    """The thresholds a file sets, over the built-in ones: a table that names one keeps the others."""
    thresholds = dict(DEFAULT_THRESHOLDS)
    for name, value in generate.thresholds.items():
        default = DEFAULT_THRESHOLDS.get(name)
        if default is None:
            raise ConfigError(f"generate.thresholds: unknown threshold {name!r} (known: {', '.join(DEFAULT_THRESHOLDS)})")
        if value <= 0 or (name.endswith("_ratio") and value > 1):
            bound = "between 0 and 1" if name.endswith("_ratio") else "greater than 0"
            raise ConfigError(f"generate.thresholds.{name} must be {bound}, got {value:g}")
        if isinstance(default, int):
            if not float(value).is_integer():
                raise ConfigError(f"generate.thresholds.{name} counts whole runs, calls, ratings or seconds, got {value:g}")
            value = int(value)
        thresholds[name] = value
    return replace(generate, thresholds=thresholds)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def _merge(into: dict[str, Any], overrides: Mapping[str, Mapping[str, Any]]) -> None:
    for section, values in overrides.items():
        into.setdefault(section, {})
        if isinstance(into[section], dict):
            into[section].update(values)


def _run_otel_variables(env: Mapping[str, str]) -> dict[tuple[str, str], str]:
    """(section, key) -> the RUN_OTEL_<SECTION>__<KEY> variable that sets it."""
    found = {}
    for name in env:
        if not name.startswith(ENV_PREFIX) or "__" not in name or name == CONFIG_ENV:
            continue
        section, _, key = name[len(ENV_PREFIX) :].partition("__")
        found[(section.lower(), key.lower())] = name
    return found


def _check_known(section: str, key: str, variable: str) -> None:
    if section not in SECTIONS:
        raise ConfigError(f"{variable}: unknown config section [{section}] (known: {', '.join(SECTIONS)})")
    hints = get_type_hints(SECTIONS[section])
    if key not in hints:
        raise ConfigError(f"{variable}: unknown config key {section}.{key} (known in [{section}]: {', '.join(hints)})")


def _run_otel_environment(env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for (section, key), name in _run_otel_variables(env).items():
        out.setdefault(section, {})[key] = _env_value(env[name])
    return out


def _env_value(text: str) -> Any:
    """An environment value as TOML would read it (10, true, ["a"]), else the string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _build_section(section: str, cls: type, values: Mapping[str, Any]) -> Any:
    hints = get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in hints:
            known = ", ".join(hints)
            raise ConfigError(f"unknown config key {section}.{key} (known in [{section}]: {known})")
        kwargs[key] = _coerce(f"{section}.{key}", hints[key], value)
    return cls(**kwargs)


def _coerce(name: str, hint: Any, value: Any) -> Any:
    origin = get_origin(hint)
    if origin is list:
        (item,) = get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{name} must be a list, got {value!r}")
        return [_coerce(f"{name}[]", item, v) for v in value]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{name} must be a table, got {value!r}")
        _key, item = get_args(hint)
        return {str(k): _coerce(f"{name}.{k}", item, v) for k, v in value.items()}
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{name} must be a number, got {value!r}")
    if hint is str:
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{name} must be a string, got {value!r}")
    raise ConfigError(f"{name}: unsupported type {hint!r}")  # pragma: no cover


def _validate(config: Config) -> None:
    for (section, key), choices in _CHOICES.items():
        value = getattr(getattr(config, section), key)
        if value not in choices:
            raise ConfigError(f"{section}.{key} must be one of {', '.join(choices)}, got {value!r}")
    for section, key in _POSITIVE | _NON_NEGATIVE:
        value = getattr(getattr(config, section), key)
        if value < 0 or (value == 0 and (section, key) in _POSITIVE):
            bound = "greater than 0" if (section, key) in _POSITIVE else "0 or more"
            raise ConfigError(f"{section}.{key} must be {bound}, got {value!r}")
    for convention in config.trace.conventions:
        if convention not in _CONVENTIONS:
            raise ConfigError(f"trace.conventions: unknown profile {convention!r} (known: {', '.join(_CONVENTIONS)})")
    start = config.poll.start_from
    if start not in ("now", "beginning") and not (start.isdigit() and int(start) > 0):
        raise ConfigError(f"poll.start_from must be now, beginning or a positive run id, got {start!r}")
    if config.ha.enabled and config.ha.takeover_seconds <= config.poll.interval_seconds:
        raise ConfigError(
            f"ha.takeover_seconds ({config.ha.takeover_seconds:g}) must be longer than poll.interval_seconds "
            f"({config.poll.interval_seconds:g}): the active instance renews its lease once per poll"
        )
    if config.export.max_request_bytes < MIN_REQUEST_BYTES:
        raise ConfigError(
            f"export.max_request_bytes must be at least {MIN_REQUEST_BYTES} (64 KiB), got {config.export.max_request_bytes}"
        )
    if not 0 < config.metrics.port < 65536:
        raise ConfigError(f"metrics.port must be a TCP port, got {config.metrics.port}")
    try:
        ZoneInfo(config.source.timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"source.timezone must be an IANA time zone, got {config.source.timezone!r}") from None
    for pattern in config.content.redact:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"content.redact: bad regex {pattern!r}: {exc}") from None
    _validate_tls(config.source)
    _validate_generate(config)
    _validate_export_tls(config.export)
    _validate_http_endpoint(config.export)
    for section in ("source", "state"):
        try:
            make_url(getattr(config, section).url)
        except Exception:  # SQLAlchemy raises ArgumentError; never echo the URL, it may hold a password
            raise ConfigError(f"{section}.url is not a SQLAlchemy URL") from None


def _validate_generate(config: Config) -> None:
    if not 0 < config.slo.objective < 1:
        raise ConfigError(f"slo.objective is the share of runs that must not fail, between 0 and 1, got {config.slo.objective:g}")
    job = config.generate.job
    if not job or any(c in job for c in '"\\\n'):
        raise ConfigError(f"generate.job must be a Prometheus job name without quotes or backslashes, got {job!r}")


def _validate_tls(source: SourceConfig) -> None:
    for key in ("tls_ca", "tls_cert", "tls_key"):
        path = getattr(source, key)
        if path and not Path(path).is_file():
            raise ConfigError(f"source.{key}: no such file: {path}")
    if source.tls_key and not source.tls_cert:
        raise ConfigError("source.tls_key needs source.tls_cert (the client certificate)")
    if source.tls_ca and source.tls_mode not in VERIFYING_TLS_MODES:
        raise ConfigError(
            f"source.tls_ca is set but source.tls_mode is {source.tls_mode!r}: "
            "set tls_mode to verify_identity (or verify_ca) to verify the server against it"
        )
    if source.tls_cert and source.tls_mode in ("disabled", "preferred"):
        raise ConfigError(
            f"source.tls_cert needs source.tls_mode required, verify_ca or verify_identity, not {source.tls_mode!r}"
        )


def _validate_http_endpoint(export: ExportConfig) -> None:
    # OTLP/HTTP's endpoint is a URL; without a scheme the HTTP client's only word is "InvalidSchema".
    endpoint = export.endpoint
    if export.protocol == "http/protobuf" and endpoint and not endpoint.startswith(("http://", "https://")):
        raise ConfigError(
            f'export.endpoint {endpoint!r} has no scheme: with export.protocol = "http/protobuf" it is a URL, '
            f"such as http://{endpoint} (https:// with TLS)"
        )


def _validate_export_tls(export: ExportConfig) -> None:
    """The PEM files for the receiver: present, and each client key with its certificate."""
    for key in (
        "certificate",
        "client_certificate",
        "client_key",
        "logs_certificate",
        "logs_client_certificate",
        "logs_client_key",
    ):
        path = getattr(export, key)
        if path and not Path(path).is_file():
            raise ConfigError(f"export.{key}: no such file: {path}")
    for prefix in ("", "logs_"):
        cert, key = getattr(export, f"{prefix}client_certificate"), getattr(export, f"{prefix}client_key")
        if bool(cert) != bool(key):
            raise ConfigError(
                f"export.{prefix}client_certificate and export.{prefix}client_key go together (mTLS): set both or neither"
            )
