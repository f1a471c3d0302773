"""``python -m run_otel``: the command line, as the ``run-otel`` script runs it."""

from .cli.main import script

script()
