"""One typed configuration, built once at start and passed in: the sections
(``sections``) and how they are read from the file and the environment
(``loading``)."""

from .loading import MIN_REQUEST_BYTES, build_config, load_config, overridden_file_keys
from .sections import (
    CONFIG_ENV,
    ENV_PREFIX,
    SECTIONS,
    TLS_MODES,
    VERIFYING_TLS_MODES,
    Config,
    ConfigError,
    ContentConfig,
    ExportConfig,
    FeedbackConfig,
    HaConfig,
    LogConfig,
    MetricsConfig,
    PollConfig,
    ServiceConfig,
    SourceConfig,
    StateConfig,
    TraceConfig,
    UiConfig,
)

__all__ = [
    "CONFIG_ENV",
    "ENV_PREFIX",
    "MIN_REQUEST_BYTES",
    "SECTIONS",
    "TLS_MODES",
    "VERIFYING_TLS_MODES",
    "Config",
    "ConfigError",
    "ContentConfig",
    "ExportConfig",
    "FeedbackConfig",
    "HaConfig",
    "LogConfig",
    "MetricsConfig",
    "PollConfig",
    "ServiceConfig",
    "SourceConfig",
    "StateConfig",
    "TraceConfig",
    "UiConfig",
    "build_config",
    "load_config",
    "overridden_file_keys",
]
