"""The engine for the agent's database and the state store: drivers, TLS, the
session's read-only settings and statement timeout, and URLs safe to print."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL
from sqlalchemy.exc import NoSuchModuleError

from ..config import VERIFYING_TLS_MODES, ConfigError, SourceConfig
from .errors import SourceError
from .password_file import read_on_connect

log = logging.getLogger(__name__)


def safe_url(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def make_engine(url: URL, connect_timeout: float = 10.0, source: SourceConfig | None = None, **kwargs: Any) -> Engine:
    """An engine with pre-ping, so a restarted database is reconnected transparently.

    For the agent's database (``source`` given) on MySQL/MariaDB, every session
    gets the statement timeout and, when configured, TLS.
    """
    connect_args: dict = {}
    if url.get_backend_name() == "mysql":
        connect_args = {"connect_timeout": max(1, int(connect_timeout)), "charset": "utf8mb4"}
        # Each poll must see rows committed since the last one.
        kwargs.setdefault("isolation_level", "READ COMMITTED")
        if source is not None:
            connect_args.update(_mysql_source_args(url, source))
    elif url.get_backend_name() == "sqlite" and source is not None:
        connect_args = {"timeout": source.statement_timeout_seconds}
    try:
        if url.get_driver_name() == "mysqlconnector":
            _warn_without_c_extension()
        engine = create_engine(url, pool_pre_ping=True, connect_args=connect_args, **kwargs)
    except NoSuchModuleError:
        hint = "; for MySQL and MariaDB use mysql+pymysql, mysql+mysqlconnector or mysql+mysqldb"
        raise ConfigError(
            f"{safe_url(url)}: SQLAlchemy knows no {url.drivername!r}" + (hint if url.get_backend_name() == "mysql" else "")
        ) from None
    except ImportError as exc:
        install = _DRIVER_EXTRAS.get(url.get_driver_name(), "install the driver's package")
        raise ConfigError(f"{safe_url(url)}: the driver is not installed (no module {exc.name!r}): {install}") from None
    if url.get_backend_name() == "mysql" and source is not None:
        event.listen(engine, "connect", _session_setup(source))
        if source.password_file:
            read_on_connect(engine, source.password_file)
    return engine


# The drivers run-otel ships an extra for, and how to get them.
_DRIVER_EXTRAS = {
    "mysqlconnector": "pip install 'run-otel[mysql-connector]'",
    "mysqldb": "apt-get install libmariadb-dev pkg-config, then pip install 'run-otel[mysqlclient]'",
}


def _warn_without_c_extension() -> None:
    """mysql-connector-python quietly runs in pure Python when its C extension does not
    load, several times slower than PyMySQL; say so once, where the engine is built."""
    import mysql.connector

    if not mysql.connector.HAVE_CEXT:
        log.warning(
            "mysql-connector-python's C extension did not load, so it runs in pure Python, slower than "
            "PyMySQL: use a mysql+pymysql:// URL, or a mysql-connector-python release built for this system's OpenSSL"
        )


def _mysql_source_args(url: URL, source: SourceConfig) -> dict:
    # The server-side limits below end a statement; the socket timeout is the
    # backstop for a server that stops answering altogether.
    backstop = int(source.statement_timeout_seconds) + 10
    args: dict = {"read_timeout": backstop, "write_timeout": backstop}
    args.update(_TLS_ARGS.get(url.get_driver_name(), _mysqlclient_tls)(source))
    return args


def _pymysql_tls(source: SourceConfig) -> dict:
    """PyMySQL's arguments for source.tls_mode; "preferred" is its own default."""
    if source.tls_mode == "disabled":
        return {"ssl_disabled": True}
    if source.tls_mode == "preferred":
        return {}
    verify = source.tls_mode in VERIFYING_TLS_MODES
    context = ssl.create_default_context(cafile=source.tls_ca or None)
    context.check_hostname = source.tls_mode == "verify_identity"
    if not verify:
        context.verify_mode = ssl.CERT_NONE
    if source.tls_cert:
        context.load_cert_chain(source.tls_cert, source.tls_key or None)
    return {"ssl": context}


def _mysqlclient_tls(source: SourceConfig) -> dict:
    """mysqlclient's form of the same settings."""
    files = {"ca": source.tls_ca, "cert": source.tls_cert, "key": source.tls_key}
    args: dict = {"ssl_mode": source.tls_mode.upper()}
    if any(files.values()):
        args["ssl"] = {k: v for k, v in files.items() if v}
    return args


def _mysqlconnector_tls(source: SourceConfig) -> dict:
    """mysql-connector-python's form. It has no "required" of its own: with TLS not
    disabled it falls back to plain text, so the session check below enforces it."""
    if source.tls_mode == "disabled":
        return {"ssl_disabled": True}
    files = {"ssl_ca": source.tls_ca, "ssl_cert": source.tls_cert, "ssl_key": source.tls_key}
    args: dict = {k: v for k, v in files.items() if v}
    if source.tls_mode in VERIFYING_TLS_MODES:
        args["ssl_verify_cert"] = True
        args["ssl_verify_identity"] = source.tls_mode == "verify_identity"
    return args


_TLS_ARGS = {"pymysql": _pymysql_tls, "mysqldb": _mysqlclient_tls, "mysqlconnector": _mysqlconnector_tls}


def _session_setup(source: SourceConfig) -> Callable[[Any, Any], None]:
    """Per-session limits: MariaDB's max_statement_time, MySQL's max_execution_time,
    and lock_wait_timeout for metadata locks (LOCK TABLES, ALTER TABLE) on both.
    Where TLS is required, the session must really be encrypted: a driver that falls
    back to plain text is refused here, whatever its own settings did."""
    seconds = source.statement_timeout_seconds
    whole = max(1, int(seconds))
    tls_required = source.tls_mode not in ("disabled", "preferred")

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SELECT VERSION()")
            mariadb = "mariadb" in str(cursor.fetchone()[0]).lower()
            limit = f"max_statement_time = {seconds:g}" if mariadb else f"max_execution_time = {int(seconds * 1000)}"
            cursor.execute(f"SET SESSION {limit}, SESSION lock_wait_timeout = {whole}")
            if tls_required:
                cursor.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
                row = cursor.fetchone()
                if not row or not row[1]:
                    raise SourceError(f"source.tls_mode = {source.tls_mode}, but the session is not encrypted")
        finally:
            cursor.close()

    return on_connect
