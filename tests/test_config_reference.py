"""The configuration reference in docs/configuration.md is example.toml's, key for key."""

from __future__ import annotations

import dataclasses
import importlib.util
import tomllib
from pathlib import Path

import pytest
import yaml

from run_otel.config import SECTIONS
from run_otel.generate.config_reference import BEGIN, END, LayoutError, config_reference, keys, parse, splice

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = (ROOT / "src/run_otel/example.toml").read_text()
DOC = (ROOT / "docs/configuration.md").read_text()


def committed_table() -> str:
    return DOC[DOC.index(BEGIN) + len(BEGIN) : DOC.index(END)]


def test_the_reference_names_every_key_of_the_config_with_its_default():
    documented = {f"{section}.{f.name}" for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    assert set(keys(EXAMPLE)) == documented
    table = committed_table()
    for entry in parse(EXAMPLE):
        row = next((line for line in table.splitlines() if f"`{entry.section}.{entry.keys[0]}`" in line), None)
        assert row is not None, entry.keys
        for key, raw, value in zip(entry.keys, entry.raw_defaults, entry.defaults, strict=True):
            assert f"`{entry.section}.{key}`" in row
            assert (f"`{value}`" if isinstance(value, str) and value else f"`{raw}`") in row, key
        assert entry.doc and entry.doc.split()[0] in row


def test_the_committed_table_is_the_generated_one():
    assert committed_table() == "\n\n" + config_reference(EXAMPLE) + "\n"


def test_a_stale_table_is_caught_by_the_generators_check(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("generate_script", ROOT / "scripts/generate.py")
    assert spec and spec.loader
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    stale = tmp_path / "configuration.md"
    stale.write_text(DOC.replace("`source.url`", "`source.uri`", 1))
    monkeypatch.setattr(generate, "CONFIGURATION_DOC", stale)
    assert generate.configuration_doc() == DOC  # --check compares this with the file: they differ
    assert generate.configuration_doc() != stale.read_text()


def test_every_row_explains_its_keys():
    rows = [line for line in config_reference(EXAMPLE).splitlines()[2:]]
    assert len(rows) == len(parse(EXAMPLE))
    for row in rows:
        cells = row.strip("|").split(" | ")
        assert len(cells) == 3 and cells[2].strip(), row


def test_keys_on_consecutive_lines_share_the_comment_above_them():
    entries = parse('# preamble\n\n[a]\n# Two keys.\nx = 1\ny = "s"\n# One key.\nz = []\n')
    assert [(e.keys, e.defaults, e.doc) for e in entries] == [(("x", "y"), (1, "s"), "Two keys."), (("z",), ([],), "One key.")]


@pytest.mark.parametrize(
    "text, match",
    [
        ("[a]\nx = 1\n", "a.x has no comment"),
        ("[a]\n# Loose.\n\n# X.\nx = 1\n", "directly above the key"),
        ("[a]\n# X.\nx = 1\n# Nothing below.\n", "describes no key"),
        ("[a]\n# X.\nx = [\n  1,\n]\n", "single-line"),
    ],
)
def test_a_layout_the_table_cannot_carry_is_refused(text, match):
    with pytest.raises((LayoutError, tomllib.TOMLDecodeError), match=match):
        parse(text)


def test_cells_keep_code_and_escape_what_markdown_would_eat():
    table = config_reference('[a]\n# The lock is "<name>:<db>", a | b, `x | y` and list.*.\nx = "v"\n')
    row = table.splitlines()[2]
    assert "&lt;name&gt;:&lt;db&gt;" in row and "a \\| b" in row and "`x \\| y`" in row and "list.\\*." in row


def test_splice_needs_both_markers():
    with pytest.raises(LayoutError):
        splice("no markers here", "| table |\n")
    assert splice(f"a\n{BEGIN}\nold\n{END}\nb", "| t |\n") == f"a\n{BEGIN}\n\n| t |\n\n{END}\nb"


def test_the_shipped_configs_use_only_documented_keys():
    documented = set(keys(EXAMPLE))
    # config/run-otel.toml is a link to example.toml: the same text, read through the link.
    assert (ROOT / "config/run-otel.toml").read_text() == EXAMPLE
    compose = tomllib.loads((ROOT / "config/run-otel.compose.toml").read_text())
    kubernetes = tomllib.loads(yaml.safe_load((ROOT / "deploy/kubernetes/configmap.yaml").read_text())["data"]["run-otel.toml"])
    for config in (compose, kubernetes):
        used = {f"{section}.{key}" for section, values in config.items() for key in values}
        assert used <= documented, used - documented
