"""One typed configuration, built once at start and passed in: the sections
(``sections``), how they are read from the file and the environment
(``loading``), and the checks of their values, every error reported at once
(``checks``)."""

from .checks import MIN_REQUEST_BYTES
from .loading import build_config, load_config, overridden_file_keys
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
    GenerateConfig,
    HaConfig,
    LogConfig,
    MetricsConfig,
    PollConfig,
    ServiceConfig,
    SloConfig,
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
    "GenerateConfig",
    "HaConfig",
    "LogConfig",
    "MetricsConfig",
    "PollConfig",
    "ServiceConfig",
    "SloConfig",
    "SourceConfig",
    "StateConfig",
    "TraceConfig",
    "UiConfig",
    "build_config",
    "load_config",
    "overridden_file_keys",
]
