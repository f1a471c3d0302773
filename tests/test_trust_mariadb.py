"""Production trust on real MariaDB: a wrong time zone, ids out of time order,
lease scope, locked tables, a wedged loop, SIGTERM's bound, and TLS."""

from __future__ import annotations

import datetime as dt
import ipaddress
import signal
import time
from pathlib import Path

import pytest
import requests
from conftest import DRIVERS
from helpers import (
    DaemonProcess,
    add_runs,
    bridge_sections,
    received_roots,
    run_cli,
    write_config,
)
from servers import MariaDB, free_port, wait_for, with_driver

# -- helpers ---------------------------------------------------------------------------


def config_file(agent_db, tmp_path, otlp, **overrides) -> str:
    return str(write_config(tmp_path / "c.toml", bridge_sections(agent_db, tmp_path, otlp.endpoint("grpc"), **overrides)))


# -- 3. the time zone -----------------------------------------------------------------------


def test_rows_written_in_shanghai_read_as_utc_are_flagged(agent_db, otlp, tmp_path):
    # The agent writes Asia/Shanghai wall time; the config says UTC.
    traces = add_runs(agent_db, ["UTC_TIMESTAMP() + INTERVAL 8 HOUR - INTERVAL 30 SECOND"] * 3)
    config = config_file(
        agent_db, tmp_path, otlp, source={"timezone": "UTC"}, poll={"start_from": "beginning", "settle_seconds": 2}
    )
    done = run_cli("check", "--config", config)
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(line for line in done.stdout.splitlines() if "source.timezone" in line)
    assert len(line) > 120  # one line, not wrapped at 80 columns in a pipe
    assert line.startswith("!") and "in the future" in line and "Asia/Shanghai" in line and "UTC+08:00" in line
    once = run_cli("once", "--config", config)
    assert once.returncode == 0, once.stderr
    assert once.stderr.count("looks wrong") == 1
    # The finished runs wait: they have not settled yet by the configured clock, and that is what was flagged.
    assert "exported 0 runs" in once.stdout and "3 pending" in once.stdout
    assert not received_roots(otlp.receiver) & set(traces)


def test_a_zone_ahead_never_times_out_a_fresh_run(agent_db, otlp, tmp_path):
    # Rows in UTC, config Asia/Shanghai: a 20-second-old RUNNING run reads 8 hours old.
    fresh = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 20 SECOND"], status="RUNNING")
    config = config_file(agent_db, tmp_path, otlp, source={"timezone": "Asia/Shanghai"}, poll={"start_from": "beginning"})
    done = run_cli("check", "--config", config)
    assert "matches the database's UTC_TIMESTAMP()" in done.stdout and "UTC+00:00" in done.stdout
    once = run_cli("once", "--config", config)
    assert once.returncode == 0, once.stderr
    assert "exported 0 runs" in once.stdout and "1 pending" in once.stdout
    assert "looks wrong" in once.stderr
    time.sleep(1)
    assert not received_roots(otlp.receiver) & set(fresh)


def test_the_daemon_logs_a_wrong_zone_once(agent_db, otlp, tmp_path):
    add_runs(agent_db, ["UTC_TIMESTAMP() + INTERVAL 8 HOUR"])
    config = config_file(agent_db, tmp_path, otlp, source={"timezone": "UTC"})
    daemon = DaemonProcess(Path(config), tmp_path / "daemon.log")
    try:
        wait_for(lambda: "looks wrong" in daemon.output(), 30, "the warning")
        time.sleep(3)  # six more polls
    finally:
        assert daemon.terminate() == 0
    assert daemon.output().count("looks wrong") == 1
    # The start-up line: the effective settings, the password masked.
    start = next(line for line in daemon.output().splitlines() if " starting: " in line)
    assert "source=mysql+pymysql://root:***@127.0.0.1" in start and "timezone=UTC" in start and "state=sqlite:///" in start
    assert agent_db.server.ROOT_PASSWORD not in daemon.output()


# -- 4. backfill over ids out of time order ---------------------------------------------------------


@pytest.fixture
def imported(agent_db):
    """17 runs of 2026-12-03 first, then an import of older history at later ids."""
    today = add_runs(agent_db, [f"'2026-12-03 09:{m:02d}:00'" for m in range(17)])
    window = add_runs(agent_db, [f"'2026-12-01 0{h}:00:00'" for h in range(6)])  # inside [11-30, 12-02)
    older = add_runs(agent_db, [f"'2026-11-2{d} 12:00:00'" for d in range(5)])
    ids_by_time = [r[0] for r in agent_db.execute("SELECT id FROM diagnosis_run ORDER BY created_at, id")]
    assert ids_by_time != sorted(ids_by_time)  # the precondition: ids are out of time order
    return today, window, older


def test_the_order_probes_find_the_first_run_at_or_after_each_id_across_gaps(agent_db, imported):
    from run_otel.config.loading import build_config
    from run_otel.factory import build_source
    from run_otel.pipeline.backfill import largest_time_inversion

    agent_db.execute("DELETE FROM diagnosis_run WHERE id IN (3, 4, 20)")
    present = {row[0] for row in agent_db.execute("SELECT id FROM diagnosis_run")}
    source = build_source(build_config({"source": {"url": agent_db.url}}))
    starts = [9, *range(1, source.max_run_id() + 3)]  # an id twice, gaps, and past the newest
    assert any(start not in present for start in starts)  # the precondition: some probes fall in a gap
    assert list(source.created_at_from_each(starts)) == [source.created_at_from(start) for start in starts]
    drop, earlier, later = largest_time_inversion(source)
    assert drop > dt.timedelta(days=1) and earlier < later  # the import of older history at later ids
    source.close()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_backfill_never_exports_outside_its_window_and_says_when_ids_are_out_of_order(
    agent_db, otlp, tmp_path, imported, workers
):
    today, window, older = imported
    config = config_file(agent_db, tmp_path, otlp)
    done = run_cli("backfill", "--config", config, "--since", "2026-11-30", "--until", "2026-12-02", "--workers", workers)
    assert done.returncode == 0, done.stderr
    time.sleep(1)
    received = received_roots(otlp.receiver)
    assert received <= set(window), "a run created outside the window was exported"
    assert "WARNING" in done.stderr and "--full-scan" in done.stderr and "--from-id/--to-id" in done.stderr
    assert "not in created_at order" in done.stderr


def test_backfill_since_today_is_not_silently_empty(agent_db, otlp, tmp_path, imported):
    today, _window, _older = imported
    config = config_file(agent_db, tmp_path, otlp)
    probed = run_cli("backfill", "--config", config, "--since", "2026-12-03")
    assert probed.returncode == 0, probed.stderr
    found = received_roots(otlp.receiver)
    assert found == set(today) or ("WARNING" in probed.stderr and "--full-scan" in probed.stderr)
    full = run_cli("backfill", "--config", config, "--since", "2026-12-03", "--full-scan")
    assert full.returncode == 0, full.stderr
    assert "backfilled 17 runs" in full.stdout and "WARNING" not in full.stderr
    wait_for(lambda: received_roots(otlp.receiver) >= set(today), 30, "the 17 runs")
    assert received_roots(otlp.receiver) == set(today)


def test_backfill_by_id_range_is_filtered_by_the_window_too(agent_db, otlp, tmp_path, imported):
    _today, window, _older = imported
    config = config_file(agent_db, tmp_path, otlp)
    done = run_cli("backfill", "--config", config, "--from-id", "1", "--since", "2026-11-30", "--until", "2026-12-02")
    assert done.returncode == 0, done.stderr
    assert "backfilled 6 runs" in done.stdout
    wait_for(lambda: received_roots(otlp.receiver) >= set(window), 30, "the window")
    assert received_roots(otlp.receiver) == set(window)


def test_backfill_warns_once_about_an_unknown_status(agent_db, otlp, tmp_path):
    traces = add_runs(agent_db, ["'2026-12-01 10:00:00'"] * 3, status="ESCALATED")
    done = run_cli("backfill", "--config", config_file(agent_db, tmp_path, otlp), "--since", "2026-12-01")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("unknown diagnosis_run.status 'ESCALATED'") == 1
    wait_for(lambda: received_roots(otlp.receiver) >= set(traces), 30, "the runs, exported as terminal")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--since", "2026-12-03", "--until", "2026-12-01"), "--until (2026-12-01 00:00:00) must be after --since"),
        (("--since", "2026-12-03", "--until", "2026-12-03"), "must be after --since"),
        (("--from-id", "9", "--to-id", "3"), "--to-id (3) must not be below --from-id (9)"),
        ((), "give --since, --from-id or --full-scan"),
    ],
)
def test_backfill_rejects_an_inverted_or_missing_range(tmp_path, args, message):
    done = run_cli("backfill", "--config", str(tmp_path / "none.toml"), *args)
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1


# -- 5. the lease's scope ------------------------------------------------------------------------------


def _ha_daemon(agent_db, otlp, tmp_path: Path, name: str, shard: str | None = None) -> DaemonProcess:
    sections = bridge_sections(
        agent_db,
        tmp_path,
        otlp.endpoint("grpc"),
        state={"url": f"sqlite:///{tmp_path / (name + '-state.db')}"},
        ha={"enabled": True, "takeover_seconds": 3},
    )
    path = write_config(tmp_path / f"{name}.toml", sections)
    daemon = DaemonProcess(path, tmp_path / f"{name}.log", *(("--shard", shard) if shard else ()))
    return daemon


def test_instances_on_two_databases_of_one_server_are_both_active(mariadb, otlp, tmp_path):
    from conftest import AgentDb

    daemons = []
    try:
        for name in ("agent_ha_one", "agent_ha_two"):
            db = AgentDb(mariadb, name, mariadb.create_database(name))
            daemons.append(_ha_daemon(db, otlp, tmp_path, name))
        for daemon in daemons:
            wait_for(lambda d=daemon: "acquired" in d.output(), 30, "each instance to hold its own lease")
        assert all("standing by" not in d.output() for d in daemons)
    finally:
        for daemon in daemons:
            daemon.terminate()


def test_two_shards_on_one_database_are_both_active(agent_db, otlp, tmp_path):
    daemons = [_ha_daemon(agent_db, otlp, tmp_path, f"shard{i}", f"{i}/2") for i in range(2)]
    try:
        for daemon in daemons:
            wait_for(lambda d=daemon: "acquired" in d.output(), 30, "each shard to hold its own lease")
        names = {line.split("lease ")[1].split(" ")[0] for d in daemons for line in d.output().splitlines() if "acquired" in line}
        assert len(names) == 2 and all(agent_db.name in n for n in names)
    finally:
        for daemon in daemons:
            daemon.terminate()


# -- 6. timeouts, liveness, SIGTERM ------------------------------------------------------------------


@pytest.fixture
def locked(agent_db):
    """diagnosis_run held under LOCK TABLES ... WRITE by another session, until released."""
    add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 1 MINUTE"])
    conn = agent_db.server.root(agent_db.name)
    with conn.cursor() as cur:
        cur.execute("LOCK TABLES diagnosis_run WRITE")
    yield conn
    conn.close()


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_locked_table_fails_the_poll_with_a_clear_line(agent_db, otlp, tmp_path, locked, driver):
    config = config_file(
        agent_db, tmp_path, otlp, source={"statement_timeout_seconds": 2, "url": with_driver(agent_db.url, driver)}
    )
    started = time.monotonic()
    done = run_cli("once", "--config", config, timeout=60)
    took = time.monotonic() - started
    assert done.returncode == 1
    assert "source.statement_timeout_seconds (2s" in done.stderr and "is a table locked?" in done.stderr
    assert took < 20, took


def test_a_wedged_poll_fails_liveness_and_sigterm_exits_within_its_bound(agent_db, otlp, tmp_path, locked):
    port = free_port()
    config = write_config(
        tmp_path / "c.toml",
        bridge_sections(
            agent_db,
            tmp_path,
            otlp.endpoint("grpc"),
            source={"statement_timeout_seconds": 120},
            poll={"stuck_after_seconds": 2, "shutdown_timeout_seconds": 3},
            metrics={"enabled": True, "port": port},
        ),
    )
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    health = f"http://127.0.0.1:{port}/healthz"
    try:
        wait_for(lambda: _status(health) == 200, 30, "the health endpoint")
        wait_for(lambda: _status(health) == 503, 15, "liveness to fail")
        assert "wedged" in requests.get(health, timeout=2).text
        # The poll really is stuck in the database, not finished.
        processes = [r for r in agent_db.execute("SHOW PROCESSLIST") if r[7] and "diagnosis_run" in str(r[7])]
        assert processes, "no statement waiting on the lock"
        stopped = time.monotonic()
        daemon.process.send_signal(signal.SIGTERM)
        code = daemon.process.wait(15)
        took = time.monotonic() - stopped
    finally:
        if daemon.alive():
            daemon.kill()
    assert code == 1 and 2.5 < took < 8, (code, took)
    assert "did not finish within poll.shutdown_timeout_seconds" in daemon.output()


def _status(url: str) -> int:
    try:
        return requests.get(url, timeout=2).status_code
    except requests.RequestException:
        return 0


# -- 7. TLS ------------------------------------------------------------------------------------------------


def _write_pki(folder: Path) -> dict[str, Path]:
    """A CA, and a server certificate for 127.0.0.1 signed by it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    def key():
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)

    now = dt.datetime.now(dt.UTC)
    ca_key, server_key = key(), key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "run-otel test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {name: folder / f"{name}.pem" for name in ("ca", "server-cert", "server-key")}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["server-cert"].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths["server-key"].write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
    )
    return paths


@pytest.fixture
def tls_mariadb(tmp_path):
    pki = _write_pki(tmp_path)
    server = MariaDB(
        tmp_path / "tls-mariadb",
        extra_args=(
            f"--ssl-ca={pki['ca']}",
            f"--ssl-cert={pki['server-cert']}",
            f"--ssl-key={pki['server-key']}",
            "--require-secure-transport=ON",
        ),
    )
    server.install()
    server.start()
    yield server, pki
    server.stop()


@pytest.mark.parametrize("driver", DRIVERS)
def test_tls_to_a_server_that_requires_it(tls_mariadb, otlp, tmp_path, driver):
    from conftest import AgentDb

    server, pki = tls_mariadb
    db = AgentDb(server, "agent_tls", server.create_database("agent_tls"))
    url = with_driver(db.url, driver)
    traces = add_runs(db, ["UTC_TIMESTAMP() - INTERVAL 1 MINUTE"] * 2)
    # The precondition: a plain connection is refused.
    plain = run_cli("once", "--config", config_file(db, tmp_path, otlp, source={"tls_mode": "disabled", "url": url}))
    # MariaDB answers a plain connection with "Access denied" under require_secure_transport.
    assert plain.returncode == 1 and ("insecure transport" in plain.stderr or "Access denied" in plain.stderr), plain.stderr
    secured = config_file(db, tmp_path, otlp, source={"tls_mode": "verify_identity", "tls_ca": str(pki["ca"]), "url": url})
    done = run_cli("once", "--config", secured)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: received_roots(otlp.receiver) >= set(traces), 30, "the runs over TLS")
    check = run_cli("check", "--config", secured)
    assert check.returncode == 0, check.stdout


@pytest.mark.parametrize("driver", DRIVERS)
def test_tls_verification_rejects_a_foreign_ca(tls_mariadb, otlp, tmp_path, driver):
    from conftest import AgentDb

    server, _pki = tls_mariadb
    db = AgentDb(server, "agent_tls2", server.create_database("agent_tls2"))
    (tmp_path / "other").mkdir()
    other = _write_pki(tmp_path / "other")
    source = {"tls_mode": "verify_ca", "tls_ca": str(other["ca"]), "url": with_driver(db.url, driver)}
    done = run_cli("once", "--config", config_file(db, tmp_path, otlp, source=source))
    assert done.returncode == 1
    # PyMySQL names the failure; the C driver passes on OpenSSL's words, and run-otel says what they mean.
    expected = "certificate verify failed" if driver == "pymysql" else "the tls handshake failed; does source.tls_ca sign"
    assert expected in done.stderr.lower(), done.stderr


def _session_cipher(engine) -> tuple[str, object]:
    """The session's cipher, and the DB-API connection it runs on."""
    with engine.connect() as conn:
        cipher = conn.exec_driver_sql("SHOW SESSION STATUS LIKE 'Ssl_cipher'").fetchone()[1]
        return cipher, conn.connection.dbapi_connection


def test_preferred_tls_with_pymysql_encrypts_without_loading_the_ca_store(tls_mariadb, agent_db):
    import pymysql

    from run_otel.config.loading import build_config
    from run_otel.source.engine import make_engine

    server, _pki = tls_mariadb
    url = with_driver(server.url("mysql"), "pymysql")
    # The precondition: PyMySQL's own preferred mode encrypts, with a context that loaded the CA store.
    own = pymysql.connect(host="127.0.0.1", port=server.port, user="root", password=server.ROOT_PASSWORD)
    assert own.ctx.cert_store_stats()["x509_ca"] > 0
    own.close()
    source = build_config({"source": {"url": url}}).source
    assert source.tls_mode == "preferred"
    engine = make_engine(source.connect_url(), source.connect_timeout_seconds, source)
    cipher, dbapi = _session_cipher(engine)
    assert cipher, "the session is not encrypted"
    assert dbapi.ctx.cert_store_stats()["x509_ca"] == 0  # built without the CA store
    engine.dispose()
    # Where the server offers no TLS, preferred still connects, in plain text.
    plain = build_config({"source": {"url": with_driver(agent_db.url, "pymysql")}}).source
    engine = make_engine(plain.connect_url(), plain.connect_timeout_seconds, plain)
    assert _session_cipher(engine)[0] == ""
    engine.dispose()


def test_required_tls_is_enforced_where_the_driver_would_fall_back_to_plain_text(agent_db, otlp, tmp_path):
    import mysql.connector

    add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 1 MINUTE"])
    # The precondition: this server has no TLS, and mysql-connector-python with TLS
    # enabled quietly connects in plain text.
    conn = mysql.connector.connect(
        host="127.0.0.1", port=agent_db.server.port, user="root", password=agent_db.server.ROOT_PASSWORD, ssl_disabled=False
    )
    cursor = conn.cursor()
    cursor.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
    assert cursor.fetchone()[1] == ""
    conn.close()
    source = {"tls_mode": "required", "url": with_driver(agent_db.url, "mysqlconnector")}
    done = run_cli("once", "--config", config_file(agent_db, tmp_path, otlp, source=source))
    assert done.returncode == 1
    assert "source.tls_mode = required, but the session is not encrypted" in done.stderr, done.stderr
    assert not otlp.receiver.spans()


def test_required_tls_against_a_server_without_tls_says_so(agent_db, otlp, tmp_path):
    source = {"tls_mode": "required", "url": with_driver(agent_db.url, "pymysql")}
    done = run_cli("once", "--config", config_file(agent_db, tmp_path, otlp, source=source))
    assert done.returncode == 1
    assert "the server offers no TLS" in done.stderr, done.stderr
    assert "does source.tls_ca sign" not in done.stderr  # no certificate was ever offered


def test_a_missing_tls_file_is_a_config_error(tmp_path):
    config = write_config(
        tmp_path / "c.toml",
        {
            "source": {
                "url": "mysql+pymysql://r@127.0.0.1/a",
                "tls_mode": "verify_ca",
                "tls_ca": "/nonexistent/ca.pem",
            }
        },
    )
    done = run_cli("once", "--config", str(config))
    assert done.returncode == 2
    assert "source.tls_ca: no such file: /nonexistent/ca.pem" in done.stderr


def test_a_ca_without_a_verifying_mode_is_a_config_error(tmp_path):
    (tmp_path / "ca.pem").write_text("x")
    config = write_config(
        tmp_path / "c.toml", {"source": {"url": "mysql+pymysql://r@127.0.0.1/a", "tls_ca": str(tmp_path / "ca.pem")}}
    )
    done = run_cli("once", "--config", str(config))
    assert done.returncode == 2
    assert "set tls_mode to verify_identity" in done.stderr


def test_caching_sha2_password_has_its_rsa_support():
    """MySQL 8's default authentication encrypts the password with the server's RSA key
    when there is no TLS; PyMySQL needs cryptography for that."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from pymysql import _auth

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert len(_auth.sha2_rsa_encrypt(b"hunter2", b"x" * 20, public)) == 256
