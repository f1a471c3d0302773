"""The ``run-otel`` command line: each command parses, calls one function, renders."""
