"""run-otel: every diagnosis run as an OpenTelemetry trace."""

# The one place the version is written: the build reads it from here (pyproject.toml), so asking
# for it costs nothing, where importlib.metadata took 40 ms of every command's start.
__version__ = "0.1.0"
