"""Every shipped collector, Jaeger and Prometheus config loads in the real program, and a typo in
each is caught: `otelcol validate`, `jaeger validate` and `promtool check config`."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from servers import ROOT, Collector, Receiver, promtool, validate_config

pytestmark = pytest.mark.server  # every test here runs the Go peers and promtool

CONFIG = ROOT / "config"

SHIPPED = [
    ("otelcol", CONFIG / "otel-collector.yaml", ("check_interval:", "check_intervall:"), "check_intervall"),
    ("otelcol-gateway", CONFIG / "otel-gateway.yaml", ("routing_key:", "routing_kee:"), "routing_kee"),
    # The resolver's port is a string: the documented snippet had it unquoted, which does not load.
    ("otelcol-gateway", CONFIG / "otel-gateway.yaml", ('port: "4317"', "port: 4317"), "port"),
    ("jaeger", CONFIG / "jaeger.yaml", ("max_traces:", "max_trace:"), "max_trace"),
]


def broken_copy(config: Path, tmp_path: Path, change: tuple[str, str]) -> Path:
    text = config.read_text()
    assert change[0] in text, f"{config.name} no longer has {change[0]!r}; update the test"
    path = tmp_path / config.name
    path.write_text(text.replace(change[0], change[1], 1))
    return path


@pytest.mark.parametrize(("program", "config", "change", "named"), SHIPPED, ids=lambda v: getattr(v, "name", None))
def test_the_shipped_config_loads_and_a_typo_in_it_does_not(program, config, change, named, tmp_path):
    loaded = validate_config(program, config)
    assert loaded.returncode == 0, loaded.stderr
    broken = validate_config(program, broken_copy(config, tmp_path, change))
    assert broken.returncode != 0
    assert named in broken.stderr


def promtool_check(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), "check", "config", str(config)], capture_output=True, text=True, timeout=60)


def test_prometheus_config_and_its_rules_load_in_promtool(tmp_path):
    checked = promtool_check(CONFIG / "prometheus" / "prometheus.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "alerts.yml" in checked.stdout  # the rule file was found and checked too
    (tmp_path / "alerts.yml").write_text((CONFIG / "prometheus" / "alerts.yml").read_text())
    broken = broken_copy(CONFIG / "prometheus" / "prometheus.yml", tmp_path, ("scrape_interval:", "scrape_intervall:"))
    assert promtool_check(broken).returncode != 0


def test_the_shipped_collector_config_starts_without_a_warning(tmp_path):
    """No deprecated alias (`otlp` for `otlp_grpc`) and no batch processor before an exporter that batches:
    the collector says either at start as a warning, which an operator then learns to ignore."""
    backends = [Receiver(), Receiver()]  # in place of Jaeger and Tempo, so no connection is refused
    for backend in backends:
        backend.start()
    collector = Collector(tmp_path, backends[0].endpoint, backends[1].endpoint)
    try:
        collector.start()
        time.sleep(1)  # the exporters connect after "Everything is ready"
    finally:
        collector.stop()
        for backend in backends:
            backend.stop()
    log = (tmp_path / "otelcol.log").read_text()
    assert "Everything is ready" in log  # the precondition: it started, and this is its start-up log
    warnings = [line for line in log.splitlines() if "\twarn\t" in line or '"level":"warn"' in line]
    assert not warnings, "\n".join(warnings)
