"""`run-otel check` only reads: with the example config unedited it creates no file, and says that
source.url and state.url are still the demo's defaults."""

from __future__ import annotations

import os
from pathlib import Path

from click.testing import CliRunner

from run_otel.cli.main import cli
from run_otel.config import SourceConfig, StateConfig

EXAMPLE = Path(__file__).resolve().parent.parent / "src" / "run_otel" / "example.toml"


def _check(tmp_path: Path, monkeypatch, text: str) -> str:
    config = tmp_path / "conf" / "run-otel.toml"
    config.parent.mkdir()
    config.write_text(text)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for name in [n for n in os.environ if n.startswith(("RUN_OTEL_", "OTEL_"))]:
        monkeypatch.delenv(name)
    result = CliRunner().invoke(cli, ["check", "--config", str(config)])
    assert not list(work.iterdir()), "check created files in the working directory"
    return result.output


def test_the_unedited_example_creates_nothing_and_names_the_demo_defaults(tmp_path, monkeypatch):
    text = EXAMPLE.read_text()
    # The precondition: the example's URLs are the relative demo files check must not create.
    assert f'url = "{SourceConfig().url}"' in text and f'url = "{StateConfig().url}"' in text
    out = _check(tmp_path, monkeypatch, text)
    assert "source.url: still the demo's default (sqlite:///run-otel-demo.db)" in out
    assert "state.url: still the default (sqlite:///run-otel-state.db), a file relative to the working directory" in out
    assert "source.url: no SQLite database at run-otel-demo.db (check creates none)" in out
    assert "state store: run-otel-state.db does not exist yet: `run-otel run` creates it in" in out


def test_an_existing_source_and_no_state_store_yet(tmp_path, monkeypatch):
    """A real SQLite source: every table check runs, and the missing state store is still not made."""
    from sqlalchemy import create_engine

    from run_otel.source.schema import metadata

    source = tmp_path / "agent.db"
    engine = create_engine(f"sqlite:///{source}")
    metadata.create_all(engine)
    engine.dispose()
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    out = _check(
        tmp_path,
        monkeypatch,
        f'[source]\nurl = "sqlite:///{source}"\n[state]\nurl = "sqlite:///{state_dir}/state.db"\n',
    )
    assert "table diagnosis_run" in out and "still the" not in out
    assert f"state store: {state_dir}/state.db does not exist yet" in out
    assert not list(state_dir.iterdir())


def test_a_state_store_in_a_missing_directory_fails(tmp_path, monkeypatch):
    out = _check(tmp_path, monkeypatch, f'[state]\nurl = "sqlite:///{tmp_path}/nowhere/state.db"\n')
    assert f"state store: {tmp_path}/nowhere/state.db does not exist, and {tmp_path}/nowhere is not a directory" in out
    assert not (tmp_path / "nowhere").exists()
