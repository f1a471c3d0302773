"""Compiles the pure core (rows to OTLP bytes) with mypyc when it can.

The compiled modules are the same source files: mypyc turns their type
annotations into C, which takes most of the interpreter's work out of the hot
path. Whatever stops the compilation (no C compiler, a mypy that cannot check
the code, RUN_OTEL_PURE_PYTHON=1, an editable install) leaves the Python
modules in place, and run-otel behaves the same, only slower. Editable installs
stay pure so that an edited module is the module that runs.
"""

import os
import sys

from setuptools import setup

# The modules every span passes through, and only those: each is pure (no I/O).
COMPILED = [
    "run_otel/source/rows.py",
    "run_otel/source/readings.py",
    "run_otel/source/evidence.py",
    "run_otel/source/memo.py",
    "run_otel/source/pymysql_rows.py",
    "run_otel/source/pymysql_times.py",
    "run_otel/mapping/span_data.py",
    "run_otel/mapping/attributes.py",
    "run_otel/mapping/limits.py",
    "run_otel/mapping/documents.py",
    "run_otel/mapping/span_out.py",
    "run_otel/mapping/spans.py",
    "run_otel/mapping/times.py",
    "run_otel/export/encoding.py",
    "run_otel/export/wire.py",
]


def _compiled_modules() -> list:
    if os.environ.get("RUN_OTEL_PURE_PYTHON") == "1" or "editable_wheel" in sys.argv:
        return []
    try:
        from mypyc.build import mypycify

        here = os.getcwd()
        os.chdir("src")  # module names follow the paths given
        try:
            extensions = mypycify(["--ignore-missing-imports", *COMPILED], opt_level="3")
        finally:
            os.chdir(here)
    except (ImportError, SystemExit, Exception) as exc:  # noqa: BLE001 - any failure means: stay pure
        print(f"run-otel: not compiling the core ({exc!r}); installing it as Python", file=sys.stderr)
        return []
    for extension in extensions:
        extension.optional = True  # a failed C build installs the Python modules instead
        extension.sources = [source if os.path.isabs(source) else os.path.join("src", source) for source in extension.sources]
    return extensions


setup(ext_modules=_compiled_modules())
