"""Deployment files, checked as far as this machine can: compose, configs, the image's
install steps, the compose MySQL init, sharding and the Kubernetes manifests."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from conftest import AgentDb
from helpers import bridge_sections, run_cli, utc_now_naive, write_config
from servers import wait_for
from sqlalchemy import text

from run_otel.cli.main import cli
from run_otel.config import build_config
from run_otel.ops.demo import generate, insert_workload

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
COLLECTOR = yaml.safe_load((ROOT / "config/otel-collector.yaml").read_text())
TEMPO = yaml.safe_load((ROOT / "config/tempo.yaml").read_text())
COMPOSE_CONFIG = ROOT / "config/run-otel.compose.toml"
INIT_SQL = [
    ROOT / "src/run_otel/source/schema/mysql.sql",
    ROOT / "deploy/mysql/02-run-otel-user.sql",
    ROOT / "deploy/mysql/03-demo-workload.sql",
]


def host_port(endpoint: str) -> tuple[str, int]:
    parsed = urlparse(endpoint if "://" in endpoint else f"//{endpoint}")
    return parsed.hostname, parsed.port


# -- checked files ------------------------------------------------------------------


def test_every_file_mounted_in_compose_exists():
    mounts = [v.split(":")[0] for s in SERVICES.values() for v in s.get("volumes", []) if v.startswith("./")]
    mounts += [s["file"] for s in COMPOSE.get("secrets", {}).values()]
    assert len(mounts) >= 10
    for path in mounts:
        assert (ROOT / path).exists(), path
    assert [Path(v.split(":")[1]).name for v in SERVICES["mysql"]["volumes"]] == [
        "01-schema.sql",
        "02-run-otel-user.sql",
        "03-demo-workload.sql",
    ]


def test_images_are_pinned_and_ports_stay_on_loopback():
    for name, service in SERVICES.items():
        image = service["image"]
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", image) and not image.endswith(":latest"), (name, image)
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)


def one_shot(name: str) -> bool:
    """A service another waits on to finish (service_completed_successfully): it runs once and exits."""
    waits = [s.get("depends_on") for s in SERVICES.values()]
    return any(isinstance(w, dict) and w.get(name, {}).get("condition") == "service_completed_successfully" for w in waits)


def test_every_service_restarts_and_jaeger_runs_the_config_the_tests_validate():
    for name, service in SERVICES.items():
        # One that runs once must not be restarted: unless-stopped would run it again and again.
        assert service.get("restart") == ("no" if one_shot(name) else "unless-stopped"), name
    assert [name for name in SERVICES if one_shot(name)] == ["otel-collector-queue"]
    jaeger = SERVICES["jaeger"]
    (mount,) = [v.split(":") for v in jaeger["volumes"]]
    assert mount[0] == "./config/jaeger.yaml"  # tests/test_peer_configs.py loads it in Jaeger v2
    assert jaeger["command"] == [f"--config={mount[1]}"]


def test_run_otel_sends_to_a_port_the_collector_receives_on():
    config = build_config(tomllib.loads(COMPOSE_CONFIG.read_text()))
    host, port = host_port(config.export.resolved_endpoint())
    assert host in SERVICES
    receivers = COLLECTOR["receivers"]["otlp"]["protocols"]
    protocol = "grpc" if config.export.protocol == "grpc" else "http"
    assert host_port(receivers[protocol]["endpoint"])[1] == port
    assert f"127.0.0.1:{port}:{port}" in SERVICES[host]["ports"]
    assert SERVICES["run-otel"]["secrets"] == ["run-otel-db-password"]
    assert config.source.password_file == "/run/secrets/run-otel-db-password"


def test_the_collector_forwards_to_jaeger_and_tempo():
    pipeline = COLLECTOR["service"]["pipelines"]["traces"]
    # No batch processor: the exporters' queue batches by bytes, and both together the collector warns about.
    assert pipeline["processors"] == ["memory_limiter"]
    assert all(COLLECTOR["exporters"][e]["sending_queue"]["batch"]["sizer"] == "bytes" for e in pipeline["exporters"])
    targets = {host_port(COLLECTOR["exporters"][e]["endpoint"]) for e in pipeline["exporters"]}
    assert {host for host, _ in targets} == {"jaeger", "tempo"}
    tempo_port = host_port(TEMPO["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])[1]
    assert ("tempo", tempo_port) in targets
    assert ("jaeger", 4317) in targets  # Jaeger v2 receives OTLP on 4317
    assert TEMPO["overrides"]["defaults"]["metrics_generator"]["processors"]


def shipped_collector_configs() -> list[Path]:
    """Every collector config under config/ and deploy/: a YAML file with receivers, exporters and a
    service, but Jaeger's, which stores the spans itself."""
    found = []
    for path in sorted([*(ROOT / "config").rglob("*.y*ml"), *(ROOT / "deploy").rglob("*.y*ml")]):
        loaded = yaml.safe_load(path.read_text())
        if isinstance(loaded, dict) and {"receivers", "exporters", "service"} <= set(loaded):
            if "jaeger_storage" not in loaded.get("extensions", {}):
                found.append(path)
    assert {p.name for p in found} >= {"otel-collector.yaml", "otel-gateway.yaml"}
    return found


QUEUE_DIR = "/var/lib/otelcol/file_storage"


@pytest.mark.parametrize("path", shipped_collector_configs(), ids=lambda p: p.name)
def test_every_shipped_collector_keeps_what_it_acknowledged_on_disk(path):
    """Each exporter's sending queue is on the file_storage extension, in the directory the docs put
    on a persistent volume; nothing in a pipeline acknowledges what it holds only in memory."""
    config = yaml.safe_load(path.read_text())
    storage = config["extensions"]["file_storage"]
    assert storage["directory"] == storage["compaction"]["directory"] == QUEUE_DIR
    assert "file_storage" in config["service"]["extensions"]
    for pipeline in config["service"]["pipelines"].values():
        assert "batch" not in pipeline["processors"]  # the batch processor answers before it has sent
        for name in pipeline["exporters"]:
            exporter = config["exporters"][name]
            assert exporter["sending_queue"]["storage"] == "file_storage", name
            assert exporter["retry_on_failure"]["max_elapsed_time"] == "0s", name  # the queue outlives any outage
            # The loadbalancing exporter's per-backend queue would be in memory, in front of the disk.
            inner = exporter.get("protocol", {}).get("otlp", {})
            assert not inner or inner["sending_queue"] == {"enabled": False}, name


def test_the_compose_collector_keeps_its_queue_on_a_volume_it_can_write():
    collector = SERVICES["otel-collector"]
    volume = f"otel-collector-queue:{QUEUE_DIR}"
    assert volume in collector["volumes"] and "otel-collector-queue" in COMPOSE["volumes"]
    prepare = SERVICES["otel-collector-queue"]
    assert prepare["volumes"] == [volume] and "ports" not in prepare
    assert prepare["command"] == ["chown", "10001:10001", QUEUE_DIR]  # the contrib image's user
    assert collector["depends_on"]["otel-collector-queue"]["condition"] == "service_completed_successfully"


def test_grafana_datasources_point_at_compose_services():
    provisioning = ROOT / "config/grafana/provisioning"
    datasources = yaml.safe_load((provisioning / "datasources/run-otel.yml").read_text())["datasources"]
    known_ports = {"prometheus": 9090, "tempo": TEMPO["server"]["http_listen_port"], "jaeger": 16686}
    assert {d["uid"] for d in datasources} == {"prometheus", "tempo", "jaeger"}
    for datasource in datasources:
        host, port = host_port(datasource["url"])
        assert host in SERVICES, datasource["url"]
        assert port == known_ports[host]
    provider = yaml.safe_load((provisioning / "dashboards/run-otel.yml").read_text())["providers"][0]
    mounted = dict(v.split(":")[:2] for v in SERVICES["grafana"]["volumes"])
    assert mounted["./dashboards"] == provider["options"]["path"]


def test_every_config_file_parses():
    parsed = 0
    for path in sorted((ROOT / "config").rglob("*")):
        if path.suffix in (".yml", ".yaml"):
            assert yaml.safe_load(path.read_text()) is not None, path
        elif path.suffix == ".toml":
            build_config(tomllib.loads(path.read_text()))
        elif path.suffix == ".json":
            json.loads(path.read_text())
        else:
            continue
        parsed += 1
    assert parsed >= 8


def test_the_dockerfile_is_multi_stage_non_root_and_checks_health_on_the_configured_port():
    text = (ROOT / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM python:3\.11-slim", text, re.M)) == 2
    assert re.search(r"^USER 10001", text, re.M)
    # `run-otel health` reads metrics.port from the config; a hard-coded URL would not follow it.
    (check,) = re.findall(r"^HEALTHCHECK .*\n\s+CMD (.*)$", text, re.M)
    assert json.loads(check) == ["run-otel", "health"] and "health" in cli.commands
    assert 'ENTRYPOINT ["run-otel"]' in text and 'CMD ["run"]' in text
    assert "/etc/run-otel/run-otel.toml" in text
    assert (ROOT / ".dockerignore").exists()
    # The build stage compiles the core; the runtime stage has no compiler.
    build, runtime = re.split(r"^FROM python:3\.11-slim.*$", text, flags=re.M)[1:]
    assert "setup.py" in build and "gcc" in build and "gcc" not in runtime


def test_the_image_sets_no_config_key_that_would_beat_the_mounted_file():
    text = (ROOT / "Dockerfile").read_text()
    set_by_env = re.findall(r"\b(RUN_OTEL_[A-Z_]+)=", text)
    assert set_by_env == ["RUN_OTEL_CONFIG"], set_by_env


# -- Kubernetes -----------------------------------------------------------------------


def manifests() -> list[dict]:
    docs = []
    for path in sorted((ROOT / "deploy/kubernetes").glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def test_manifests_are_objects_with_api_version_and_kind():
    kinds = {}
    for doc in manifests():
        assert doc.get("apiVersion") and doc.get("kind"), doc
        kinds[doc["kind"]] = doc
    assert {"StatefulSet", "ConfigMap", "Service", "PodMonitor", "Kustomization"} <= set(kinds)
    build_config(tomllib.loads(kinds["ConfigMap"]["data"]["run-otel.toml"]))
    secret_volumes = [v for v in kinds["StatefulSet"]["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert secret_volumes


def test_container_args_match_the_cli():
    statefulset = next(d for d in manifests() if d["kind"] == "StatefulSet")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    command = cli.commands[args[0]]
    options = {opt for param in command.params for opt in param.opts}
    flags = [a for a in args[1:] if a.startswith("--")]
    assert flags and set(flags) <= options
    shard = args[args.index("--shard") + 1]
    assert shard == f"$(SHARD_INDEX)/{statefulset['spec']['replicas']}"
    assert any(e["name"] == "SHARD_INDEX" for e in container["env"])
    assert container["ports"][0]["containerPort"] == 9464


# -- the image's install steps ---------------------------------------------------------


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    """Builds the wheel and installs it into a fresh virtualenv, as the Dockerfile does."""
    base = tmp_path_factory.mktemp("wheel")
    # A checkout on PYTHONPATH would look installed already, and pip would skip the wheel.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(base / "dist"), str(ROOT)]
    subprocess.run(pip_wheel, check=True, env=env)
    (wheel,) = (base / "dist").glob("run_otel-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(base / "venv")], check=True, env=env)
    subprocess.run([str(base / "venv/bin/pip"), "install", "-q", str(wheel)], check=True, env=env)
    assert (base / "venv/bin/run-otel").is_file()
    return base / "venv"


def load_init_sql(server, database: str = "agent") -> None:
    conn = server.root()
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4")
        cur.execute(f"USE `{database}`")
        for path in INIT_SQL:
            for statement in _statements(path.read_text()):
                cur.execute(statement)
    conn.close()


def _statements(script: str) -> list[str]:
    lines = [line for line in script.splitlines() if not line.lstrip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";\n") if s.strip()]


def compose_env(server, tmp_path: Path, endpoint: str) -> dict:
    """The compose config, with the hosts of this machine instead of the compose services."""
    return {
        "RUN_OTEL_SOURCE__URL": f"mysql+pymysql://run_otel@127.0.0.1:{server.port}/agent",
        "RUN_OTEL_SOURCE__PASSWORD_FILE": str(ROOT / "deploy/secrets/run-otel-db-password"),
        "RUN_OTEL_STATE__URL": f"sqlite:///{tmp_path / 'state.db'}",
        "RUN_OTEL_EXPORT__ENDPOINT": endpoint,
        "RUN_OTEL_METRICS__ENABLED": "false",
    }


def test_the_installed_wheel_runs_help_and_check(wheel_venv, private_mariadb, otlp, tmp_path):
    load_init_sql(private_mariadb)
    env = {**os.environ, **compose_env(private_mariadb, tmp_path, otlp.endpoint("grpc"))}
    run_otel = str(wheel_venv / "bin/run-otel")
    helped = subprocess.run([run_otel, "--help"], capture_output=True, text=True, env=env)
    assert helped.returncode == 0 and "backfill" in helped.stdout
    checked = subprocess.run([run_otel, "check", "--config", str(COMPOSE_CONFIG)], capture_output=True, text=True, env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SELECT only" in checked.stdout
    assert "the user can write" not in checked.stdout


def test_the_compose_mysql_init_gives_a_select_only_user_that_can_export(private_mariadb, otlp, tmp_path):
    load_init_sql(private_mariadb)
    env = compose_env(private_mariadb, tmp_path, otlp.endpoint("grpc"))
    done = run_cli("once", "--config", str(COMPOSE_CONFIG), env=env)
    assert done.returncode == 0, done.stderr
    conn = private_mariadb.root("agent")
    with conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM diagnosis_run WHERE status <> 'RUNNING'")
        (terminal,) = cur.fetchone()
        cur.execute("SELECT MAX(created_at) > NOW() - INTERVAL 2 HOUR FROM diagnosis_run")
        (recent,) = cur.fetchone()
    conn.close()
    assert terminal > 250 and recent == 1  # the demo workload is "the last hour" whenever it loads
    wait_for(lambda: len({s.trace_id for _r, _s, s in otlp.receiver.spans()}) == terminal, 30, "the demo runs")
    checked = run_cli("check", "--config", str(COMPOSE_CONFIG), env=env)
    assert "SELECT only" in checked.stdout and "can write" not in checked.stdout
    writes = subprocess.run(
        [
            sys.executable,
            "-c",
            "import pymysql,sys; c=pymysql.connect(host='127.0.0.1', port=int(sys.argv[1]), user='run_otel', "
            "password='run-otel-demo-only', database='agent'); c.cursor().execute(\"DELETE FROM diagnosis_run\")",
            str(private_mariadb.port),
        ],
        capture_output=True,
        text=True,
    )
    assert writes.returncode != 0 and "command denied" in writes.stderr


# -- sharding ------------------------------------------------------------------------------


def test_three_shards_split_the_runs_exactly(agent_db: AgentDb, otlp, tmp_path):
    insert_workload(agent_db.engine(), generate(77, 300, anchor=utc_now_naive()))
    config = write_config(tmp_path / "c.toml", bridge_sections(agent_db, tmp_path, otlp.endpoint("grpc")))
    shards = []
    for index in range(3):
        before = {s.trace_id for _r, _s, s in otlp.receiver.spans()}
        done = run_cli("once", "--config", str(config), "--shard", f"{index}/3")
        assert done.returncode == 0, done.stderr
        count = int(re.search(r"exported (\d+) runs", done.stdout).group(1))
        wait_for(
            lambda b=before, c=count: len({s.trace_id for _r, _s, s in otlp.receiver.spans()} - b) == c, 30, f"shard {index}"
        )
        shards.append({s.trace_id.hex() for _r, _s, s in otlp.receiver.spans()} - {t.hex() for t in before})
    with agent_db.engine().connect() as conn:
        terminal = {
            r[0][4:].replace("-", "") for r in conn.execute(text("SELECT run_id FROM diagnosis_run WHERE status <> 'RUNNING'"))
        }
    assert set().union(*shards) == terminal
    assert not (shards[0] & shards[1]) and not (shards[0] & shards[2]) and not (shards[1] & shards[2])
    assert all(len(s) > 50 for s in shards)
    again = run_cli("once", "--config", str(config), "--shard", "1/3")
    assert "exported 0 runs" in again.stdout  # each shard kept its own checkpoint
    bad = run_cli("once", "--config", str(config), "--shard", "3/3")
    assert bad.returncode == 2 and "--shard must be i/N" in bad.stderr


def test_tempo_config_carries_the_backfill_slack_commented_at_the_key_the_docs_name():
    text = (ROOT / "config/tempo.yaml").read_text()
    (line,) = [ln for ln in text.splitlines() if "# ingestion_time_range_slack:" in ln]
    uncommented = yaml.safe_load(text.replace(line, line.replace("# ", "", 1)))
    slack = uncommented["storage"]["trace"]["wal"]["ingestion_time_range_slack"]
    assert "ingestion_time_range_slack" not in str(TEMPO)  # shipped off: the default 2m
    docs = (ROOT / "docs/operations.md").read_text()  # its Backfill section
    assert f"ingestion_time_range_slack: {slack}" in docs
    assert "storage:\n    trace:\n      wal:\n        ingestion_time_range_slack" in docs
