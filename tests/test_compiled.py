"""The compiled build: the wheel compiles the pure core with mypyc, the compiled modules pass the
same tests as the Python ones (the encoder's byte-identity property test among them), and a
machine without a C compiler installs the Python modules instead."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from test_install import fresh_copy

ROOT = Path(__file__).resolve().parent.parent
# The unit tests of the compiled modules, the MariaDB tests that feed them drifted and bad rows,
# and the end-to-end tests of the poll, the backfill and the feedback pass.
TESTS = [
    "tests/test_encoding.py",
    "tests/test_wire.py",
    "tests/test_mapping.py",
    "tests/test_limits.py",
    "tests/test_evidence.py",
    "tests/test_redaction.py",
    "tests/test_pymysql_rows.py",
    "tests/test_pymysql_packets.py",
    "tests/test_pymysql_times.py",
    "tests/test_bad_rows.py",
    "tests/test_type_drift.py",
    "tests/test_drivers.py",
    "tests/test_evidence_db.py",
    "tests/test_backfill_workers.py",
    "tests/test_bridge_mariadb.py",
    "tests/test_content_redaction.py",
    "tests/test_oversized.py",
    "tests/test_transitions.py",
    "tests/test_feedback.py",
    "tests/test_late_rows.py",
]


def _env(**extra: str) -> dict[str, str]:
    # A checkout on PYTHONPATH would shadow the installed build.
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **extra}


def _wheel(checkout: Path, out: Path, **env: str) -> Path:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(checkout)],
        capture_output=True,
        text=True,
        timeout=900,
        env=_env(**env),
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = out.glob("run_otel-*.whl")
    return wheel


def _site_packages(python: Path | str) -> Path:
    found = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
        env=_env(),
    )
    return Path(found.stdout.strip())


def _venv_beside_this_one(venv: Path) -> Path:
    """A virtualenv that sees this one's packages, so the wheel goes in without its dependencies.

    A .pth line that is a plain path puts this virtualenv's site-packages on sys.path after the new
    one's, and leaves its own .pth files unread: this checkout's editable install (a .pth naming src/)
    stays out, and the wheel's modules are the ones imported."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=_env())
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (_site_packages(venv / "bin/python") / "run_otel_test_deps.pth").write_text("".join(f"{path}\n" for path in sorted(ours)))
    return venv


def _assert_the_wheel_is_imported_and_the_rest_is_reused(venv: Path, cwd: Path) -> None:
    probe = (
        "import pytest, sqlalchemy, run_otel, run_otel.export.encoding as e, run_otel.mapping.spans as s; "
        "print(run_otel.__file__, e.__file__, s.__file__, pytest.__file__, sqlalchemy.__file__, sep='\\n')"
    )
    found = subprocess.run(
        [str(venv / "bin/python"), "-c", probe], cwd=cwd, capture_output=True, text=True, timeout=120, env=_env()
    )
    assert found.returncode == 0, found.stderr[-3000:]
    package, encoding, spans, *dependencies = (Path(line) for line in found.stdout.splitlines())
    installed = _site_packages(venv / "bin/python")
    assert package.is_relative_to(installed), package  # the wheel, not this checkout's src/
    assert encoding.suffix == ".so" and spans.suffix == ".so", (encoding, spans)
    ours = Path(sysconfig.get_path("purelib"))
    assert all(path.is_relative_to(ours) for path in dependencies), dependencies  # reused, not installed again


@pytest.mark.slow
@pytest.mark.server
def test_the_compiled_core_passes_the_tests_of_the_python_one(tmp_path):
    checkout = fresh_copy(tmp_path / "run-otel")
    wheel = _wheel(checkout, tmp_path / "dist")
    (checkout / ".peers").symlink_to(ROOT / ".peers")  # the Go-built collector the end-to-end tests start
    compiled = [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".so")]
    assert any(n.startswith("run_otel/export/encoding.") for n in compiled), compiled
    assert any(n.startswith("run_otel/mapping/spans.") for n in compiled), compiled
    venv = _venv_beside_this_one(tmp_path / "venv")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install", "-q", "--no-deps", str(wheel)],
        capture_output=True,
        text=True,
        timeout=900,
        env=_env(),
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    _assert_the_wheel_is_imported_and_the_rest_is_reused(venv, checkout)
    tested = subprocess.run(
        [str(venv / "bin/python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "t"), *TESTS],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=1800,
        env=_env(RUN_OTEL_EXPECT_COMPILED="1"),
    )
    assert tested.returncode == 0, tested.stdout[-4000:] + tested.stderr[-2000:]
    assert " passed" in tested.stdout and " skipped" not in tested.stdout, tested.stdout[-500:]


@pytest.mark.slow
def test_without_a_c_compiler_the_wheel_holds_the_python_core_and_runs(tmp_path):
    checkout = fresh_copy(tmp_path / "run-otel")
    wheel = _wheel(checkout, tmp_path / "dist", CC="false")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.endswith(".so")], names  # the C build failed, and the wheel was still made
    assert "run_otel/export/encoding.py" in names and "run_otel/mapping/spans.py" in names
    unpacked = tmp_path / "unpacked"
    zipfile.ZipFile(wheel).extractall(unpacked)
    helped = subprocess.run(
        [sys.executable, "-m", "run_otel", "demo", "--db", str(tmp_path / "d.db"), "--runs", "30"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**_env(), "PYTHONPATH": str(unpacked)},
    )
    assert helped.returncode == 0 and "spans exported" in helped.stdout, helped.stderr[-2000:]


def _compiled_modules() -> list[str]:
    """setup.py's COMPILED list, read from its text: importing setup.py would run setup()."""
    import ast

    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "COMPILED":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no COMPILED list")


def test_the_compiled_modules_pass_the_type_check_the_build_runs():
    """mypyc type-checks the compiled modules as setup.py asks, without the project's mypy settings,
    and a failure there quietly installs the Python core instead: said here in seconds, not in the
    wheel's build log."""
    modules = _compiled_modules()
    assert "run_otel/export/wire.py" in modules  # the precondition: the list read is the build's
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", os.devnull, "--ignore-missing-imports", *modules],
        cwd=ROOT / "src",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 0, checked.stdout[-3000:]
