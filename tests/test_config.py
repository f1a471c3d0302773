from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from helpers import write_config

from run_otel.config import SECTIONS, Config, ConfigError, build_config, load_config, overridden_file_keys

DOCUMENTED = Path(__file__).parent.parent / "config" / "run-otel.toml"


def test_documented_file_names_every_key_with_its_default():
    documented = tomllib.loads(DOCUMENTED.read_text())
    for section, cls in SECTIONS.items():
        keys = {f.name for f in dataclasses.fields(cls)}
        assert set(documented.get(section, {})) == keys, section
    assert load_config(DOCUMENTED, environ={}) == Config()


def test_unknown_key_is_named(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[poll]\nintervl_seconds = 3\n")
    with pytest.raises(ConfigError, match=r"poll\.intervl_seconds"):
        load_config(path, environ={})


def test_unknown_section_is_named():
    with pytest.raises(ConfigError, match=r"\[pol\]"):
        build_config({"pol": {}})


@pytest.mark.parametrize(
    "section, key, value, match",
    [
        ("poll", "interval_seconds", "fast", "poll.interval_seconds must be a number"),
        ("poll", "batch_size", 0, "poll.batch_size must be greater than 0"),
        ("poll", "settle_seconds", -1, "poll.settle_seconds must be 0 or more"),
        ("content", "capture", "yes", "content.capture must be true or false"),
        ("export", "protocol", "thrift", "export.protocol must be one of"),
        ("source", "timezone", "Mars/Olympus", "source.timezone must be an IANA time zone"),
        ("trace", "conventions", ["zipkin"], "trace.conventions"),
        ("content", "redact", ["(unclosed"], "content.redact"),
        ("poll", "start_from", "yesterday", "poll.start_from"),
    ],
)
def test_bad_values_are_named(section, key, value, match):
    with pytest.raises(ConfigError, match=match):
        build_config({section: {key: value}})


def test_environment_overrides_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[poll]\ninterval_seconds = 3\n[content]\ncapture = false\n")
    config = load_config(
        path,
        environ={
            "RUN_OTEL_POLL__INTERVAL_SECONDS": "9",
            "RUN_OTEL_CONTENT__CAPTURE": "true",
            "RUN_OTEL_TRACE__CONVENTIONS": '["gen_ai", "openinference"]',
            "RUN_OTEL_SOURCE__URL": "mysql+pymysql://u@db/agent",
        },
    )
    assert config.poll.interval_seconds == 9.0
    assert config.content.capture is True
    assert config.trace.conventions == ["gen_ai", "openinference"]
    assert config.source.url == "mysql+pymysql://u@db/agent"


def test_bad_environment_override_is_named():
    with pytest.raises(ConfigError, match="^RUN_OTEL_POLL__BATCH_SIZE: poll.batch_size must be an integer, got 'many'$"):
        load_config(None, environ={"RUN_OTEL_POLL__BATCH_SIZE": "many"})


def test_standard_otel_variables_are_honoured():
    config = load_config(
        None,
        environ={
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20abc,x-tenant=ops",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
            "OTEL_SERVICE_NAME": "diag-prod",
        },
    )
    assert config.export.endpoint == "http://collector:4318"
    assert config.export.protocol == "http/protobuf"
    assert config.export.headers == {"authorization": "Bearer abc", "x-tenant": "ops"}
    assert config.export.timeout_seconds == 2.5
    assert config.service.name == "diag-prod"
    assert load_config(None, environ={"OTEL_SERVICE_NAME": "a", "RUN_OTEL_SERVICE__NAME": "b"}).service.name == "b"


GENAI_CAPTURE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


@pytest.mark.parametrize(
    ("value", "capture"),
    [
        ("true", True),
        ("TRUE", True),
        ("SPAN_ONLY", True),
        ("span_and_event", True),
        ("false", False),
        ("NO_CONTENT", False),
        ("EVENT_ONLY", False),
    ],
)
def test_the_genai_content_variable_beats_the_file_and_run_otel_variables_beat_it(tmp_path, value, capture):
    path = tmp_path / "c.toml"
    path.write_text(f"[content]\ncapture = {str(not capture).lower()}\n")
    assert load_config(path, environ={}).content.capture is (not capture)  # the precondition: the file says the opposite
    assert load_config(path, environ={GENAI_CAPTURE: value}).content.capture is capture
    overridden = {GENAI_CAPTURE: value, "RUN_OTEL_CONTENT__CAPTURE": str(not capture).lower()}
    assert load_config(path, environ=overridden).content.capture is (not capture)


def test_a_bad_genai_content_value_names_the_variable():
    with pytest.raises(ConfigError, match=f"{GENAI_CAPTURE} must be one of .*got 'maybe'"):
        load_config(None, environ={GENAI_CAPTURE: "maybe"})


def test_traces_specific_endpoint_wins():
    config = load_config(
        None, environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4317", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:4317"}
    )
    assert config.export.endpoint == "http://b:4317"


def test_password_file_replaces_the_url_password(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("s3cr3t\n")
    config = build_config({"source": {"url": "mysql+pymysql://reader:old@db/agent", "password_file": str(secret)}})
    assert config.source.connect_url().password == "s3cr3t"


def test_bad_url_error_does_not_echo_it():
    with pytest.raises(ConfigError) as info:
        build_config({"source": {"url": "not a url hunter2"}})
    assert "hunter2" not in str(info.value)


def test_an_unknown_key_from_the_environment_names_the_variable():
    with pytest.raises(ConfigError, match="RUN_OTEL_POLL__INTERVALL_SECONDS: unknown config key poll.intervall_seconds"):
        load_config(None, {"RUN_OTEL_POLL__INTERVALL_SECONDS": "10"})
    with pytest.raises(ConfigError, match="RUN_OTEL_POLLING__X: unknown config section"):
        load_config(None, {"RUN_OTEL_POLLING__X": "1"})


def test_an_environment_override_of_a_file_key_is_said(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[state]\nurl = "mysql+pymysql://u@db/state"\n[poll]\nbatch_size = 10\n')
    env = {"RUN_OTEL_STATE__URL": "sqlite:////var/lib/run-otel/state.db", "RUN_OTEL_LOG__LEVEL": "DEBUG"}
    assert load_config(path, env).state.url == "sqlite:////var/lib/run-otel/state.db"
    assert overridden_file_keys(path, env) == [f"RUN_OTEL_STATE__URL overrides state.url set in {path}"]


def test_a_standard_otel_variable_over_a_file_key_is_said_too(tmp_path):
    """An OTel operator injects OTEL_EXPORTER_OTLP_ENDPOINT into every pod: it beats the file's
    endpoint, and says so; one the file leaves unset is a default, said nothing of."""
    path = tmp_path / "c.toml"
    path.write_text('[export]\nendpoint = "collector.internal:4317"\n')
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://elsewhere:4317", "OTEL_SERVICE_NAME": "agent"}
    assert load_config(path, env).export.endpoint == "http://elsewhere:4317"
    assert overridden_file_keys(path, env) == [f"OTEL_EXPORTER_OTLP_ENDPOINT overrides export.endpoint set in {path}"]
    env["RUN_OTEL_EXPORT__ENDPOINT"] = "collector.internal:4317"  # the last word, named as such
    assert overridden_file_keys(path, env) == [f"RUN_OTEL_EXPORT__ENDPOINT overrides export.endpoint set in {path}"]


def test_help_loads_no_database_driver_exporter_or_terminal_library():
    """`run-otel --help` imports click and the command modules only: each command imports what it
    runs on when it runs. (Its time is a benchmark figure, not asserted here.)"""
    import subprocess
    import sys

    heavy = ("sqlalchemy", "pymysql", "grpc", "opentelemetry", "rich", "apscheduler", "detect_secrets", "prometheus_client")
    code = (
        "import sys; from run_otel.cli.main import cli; "
        "from click.testing import CliRunner; assert CliRunner().invoke(cli, ['--help']).exit_code == 0; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("until", ["2020-01-01", "2020-01-01 10:00"])
def test_backfill_compares_a_duration_with_a_date_in_the_source_zone(tmp_path, until):
    """`--since 30d --until "<date>"` is the docs' own example: one bound aware, the other naive."""
    from click.testing import CliRunner

    from run_otel.cli.main import cli

    config = tmp_path / "run-otel.toml"
    config.write_text(f'[source]\nurl = "sqlite:///{tmp_path / "agent.db"}"\ntimezone = "Asia/Shanghai"\n')
    done = CliRunner().invoke(cli, ["backfill", "--config", str(config), "--since", "1d", "--until", until])
    assert done.exit_code == 2, done.output
    assert "must be after --since" in done.output and "in source.timezone" in done.output
    assert done.exception is None or isinstance(done.exception, SystemExit)


def test_an_otlp_http_endpoint_without_a_scheme_is_a_config_error():
    with pytest.raises(ConfigError, match=r"export.endpoint '127.0.0.1:4318' has no scheme: .* http://127.0.0.1:4318"):
        build_config({"export": {"protocol": "http/protobuf", "endpoint": "127.0.0.1:4318"}})
    assert build_config({"export": {"protocol": "grpc", "endpoint": "127.0.0.1:4317"}}).export.endpoint == "127.0.0.1:4317"
    assert build_config({"export": {"protocol": "http/protobuf", "endpoint": "https://c:4318"}}).export.protocol


# -- every error in one pass ---------------------------------------------------------------

# One mistake of each kind the loader finds, as sections of a file, with the line that names it.
FILE_MISTAKES = [
    ({"pol": {"interval_seconds": 3}}, "unknown config section [pol]"),
    ({"poll": {"intervl_seconds": 3}}, "unknown config key poll.intervl_seconds"),
    ({"metrics": {"port": "http"}}, "metrics.port must be an integer, got 'http'"),
    ({"export": {"compression": "brotli"}}, "export.compression must be one of none, gzip, got 'brotli'"),
    ({"poll": {"batch_size": 0}}, "poll.batch_size must be greater than 0, got 0"),
    (
        {"ha": {"enabled": True, "takeover_seconds": 5}, "poll": {"interval_seconds": 10}},
        "ha.takeover_seconds (5) must be longer than poll.interval_seconds (10)",
    ),
    ({"source": {"tls_mode": "verify_ca", "tls_ca": "MISSING"}}, "source.tls_ca: no such file: MISSING"),
    ({"content": {"redact": ["ok", "(unclosed"]}}, "content.redact: bad regex '(unclosed'"),
    ({"export": {"protocol": "http/protobuf", "endpoint": "collector:4318"}}, "export.endpoint 'collector:4318' has no scheme"),
    ({"state": {"url": "not a url"}}, "state.url is not a SQLAlchemy URL"),
    ({"generate": {"thresholds": {"min_runs": 2.5}}}, "generate.thresholds.min_runs counts whole runs"),
]
# And of the variables: each is named as the environment spells it.
VARIABLE_MISTAKES = [
    ({"RUN_OTEL_POLL__INTERVALL_SECONDS": "10"}, "RUN_OTEL_POLL__INTERVALL_SECONDS: unknown config key poll.intervall_seconds"),
    ({"RUN_OTEL_LOG__LEVEL": "LOUD"}, "RUN_OTEL_LOG__LEVEL: log.level must be one of DEBUG, INFO, WARNING, ERROR, got 'LOUD'"),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}, "OTEL_EXPORTER_OTLP_TIMEOUT must be a number of milliseconds, got 'soon'"),
]


def _mistakes(tmp_path: Path) -> tuple[list[tuple[dict, str]], list[tuple[dict, str]]]:
    missing = str(tmp_path / "no-such-ca.pem")
    files = [
        ({s: {k: missing if v == "MISSING" else v for k, v in values.items()} for s, values in sections.items()}, line)
        for sections, line in FILE_MISTAKES
    ]
    return [(sections, line.replace("MISSING", missing)) for sections, line in files], VARIABLE_MISTAKES


def _all_of(mistakes: list[tuple[dict, str]]) -> dict:
    merged: dict = {}
    for sections, _line in mistakes:
        for section, values in sections.items():
            merged.setdefault(section, {}).update(values)
    return merged


def _environment(mistakes: list[tuple[dict, str]]) -> dict[str, str]:
    return {name: value for variables, _line in mistakes for name, value in variables.items()}


def _error_lines(path: Path | None, environ: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path, environ=environ)
    return str(info.value).splitlines()


def _holding(lines: list[str], fragment: str) -> list[str]:
    return [line for line in lines if fragment in line]


def test_a_file_with_many_errors_gets_every_one_in_one_message_a_line_each(tmp_path):
    files, variables = _mistakes(tmp_path)
    # The precondition: each mistake alone is one error, the one expected, so none hides behind another.
    for sections, fragment in files:
        lines = _error_lines(write_config(tmp_path / "one.toml", sections), {})
        assert len(lines) == 1 and fragment in lines[0], (sections, lines)
    for environ, fragment in variables:
        lines = _error_lines(None, environ)
        assert len(lines) == 1 and lines[0].startswith(fragment), (environ, lines)

    path = write_config(tmp_path / "all.toml", _all_of(files))
    lines = _error_lines(path, _environment(variables))
    for _mistake, fragment in files + variables:
        assert len(_holding(lines, fragment)) == 1, (fragment, lines)
    assert len(lines) == len(files) + len(variables), lines


def test_a_value_found_bad_is_not_judged_again_by_the_checks_that_read_it(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    ha = {"enabled": True, "takeover_seconds": 3}
    # The precondition: the checks across keys fire on sound values.
    assert _holding(
        _error_lines(write_config(tmp_path / "a.toml", {"ha": ha, "poll": {"interval_seconds": 10}}), {}), "ha.takeover"
    )
    ca_without_check = {"source": {"tls_ca": str(ca), "tls_mode": "required"}}
    assert _holding(_error_lines(write_config(tmp_path / "b.toml", ca_without_check), {}), "source.tls_ca is set but")
    # A bad interval keeps its default (5 s, under the 3 s takeover), and a bad mode is no mode: neither is judged again.
    bad_interval = write_config(tmp_path / "c.toml", {"ha": ha, "poll": {"interval_seconds": "fast"}})
    assert _error_lines(bad_interval, {}) == ["poll.interval_seconds must be a number, got 'fast'"]
    bad_mode = write_config(tmp_path / "d.toml", {"source": {"tls_ca": str(ca), "tls_mode": "bogus"}})
    (line,) = _error_lines(bad_mode, {})
    assert line.startswith("source.tls_mode must be one of") and line.endswith("got 'bogus'")


def test_each_bad_item_of_a_list_is_an_error_of_its_own():
    config = {"content": {"redact": ["(one", "fine", "[two"]}, "trace": {"conventions": ["zipkin", "gen_ai", "jaeger"]}}
    with pytest.raises(ConfigError) as info:
        build_config(config)
    lines = str(info.value).splitlines()
    for fragment in (
        "conventions: unknown profile 'zipkin'",
        "conventions: unknown profile 'jaeger'",
        "bad regex '(one'",
        "bad regex '[two'",
    ):
        assert len(_holding(lines, fragment)) == 1, (fragment, lines)
    assert len(lines) == 4, lines


def test_check_prints_every_error_of_the_config_each_on_a_line_of_its_own(tmp_path):
    files, variables = _mistakes(tmp_path)
    path = write_config(tmp_path / "all.toml", _all_of(files))
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RUN_OTEL_", "OTEL_"))}
    done = subprocess.run(
        [sys.executable, "-m", "run_otel", "check", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **_environment(variables)},
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert all(line.startswith("run-otel: error: config: ") for line in lines), lines
    for _mistake, fragment in files + variables:
        assert len(_holding(lines, fragment)) == 1, (fragment, lines)
    assert len(lines) == len(files) + len(variables), lines
    assert "Traceback" not in done.stderr and "check passed" not in done.stdout


def test_a_key_one_typo_away_from_a_known_one_is_named():
    with pytest.raises(ConfigError) as raised:
        build_config({"metrics": {"prot": 9464}, "polll": {}, "poll": {"batch_sise": 5, "zzz": 1}})
    message = str(raised.value)
    assert "unknown config key metrics.prot, did you mean port?" in message
    assert "unknown config section [polll], did you mean poll?" in message
    assert "unknown config key poll.batch_sise, did you mean batch_size?" in message
    assert "poll.zzz (known" in message  # nothing close: no guess
