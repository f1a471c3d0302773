"""run-otel: every diagnosis run as an OpenTelemetry trace."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("run-otel")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"
