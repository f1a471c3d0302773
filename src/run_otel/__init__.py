"""run-otel: every diagnosis run as an OpenTelemetry trace."""

from typing import Any


def __getattr__(name: str) -> Any:
    # Resolved on first use: importlib.metadata costs `run-otel --help` a third of its start-up.
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("run-otel")
    except PackageNotFoundError:  # running from a source tree without an install
        return "0.0.0"
