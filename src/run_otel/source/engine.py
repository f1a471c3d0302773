"""The engine for the agent's database and the state store: drivers, TLS, the
session's read-only settings and statement timeout, and URLs safe to print.

A database that stops answering without closing the connection (a frozen server, a hung proxy
or load balancer) must fail the poll within a known time. The server ends every statement at
``source.statement_timeout_seconds``; the socket's read timeout, that plus
``source.connect_timeout_seconds``, is the backstop for a server that sends nothing at all. A new
connection's handshake, and the ping that checks a pooled connection before it is reused, get
``source.connect_timeout_seconds`` alone: a server answers those at once, and holding each to
the backstop made one checkout wait it out twice (the ping, then the reconnect).
"""

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
        connect_args = {"connect_timeout": _whole(connect_timeout), "charset": "utf8mb4"}
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
        _hold_the_ping(engine, source.connect_timeout_seconds)
        if source.password_file:
            read_on_connect(engine, source.password_file)
        if url.get_driver_name() == "pymysql":
            from .pymysql_connection import connect_as_source

            # after the password file's listener, which fills in the password
            connect_as_source(engine, preferred_tls=source.tls_mode == "preferred")
        elif url.get_driver_name() == "mysqlconnector":
            from .mysqlconnector_connection import connect_as_source as connect_with_c_rows

            connect_with_c_rows(engine)
    return engine


def _whole(seconds: float) -> int:
    """Seconds as the drivers take them: mysql-connector only whole ones, and never 0 (no limit)."""
    return max(1, int(seconds))


def _backstop(source: SourceConfig) -> int:
    """The socket read timeout of a statement: past the server's own limit by the connect timeout,
    so that a statement the server ends still fails with the server's own words."""
    return _whole(source.statement_timeout_seconds + source.connect_timeout_seconds)


def _settable_read_timeout(dbapi_connection: Any) -> bool:
    """Whether the driver reads the connection's read timeout afresh at each packet: PyMySQL does.
    mysql-connector's C extension and mysqlclient fix it when the connection opens."""
    try:
        from pymysql.connections import Connection
    except ImportError:  # pragma: no cover - PyMySQL is a dependency
        return False
    return isinstance(dbapi_connection, Connection) and hasattr(dbapi_connection, "_read_timeout")


def _hold_the_ping(engine: Engine, seconds: float) -> None:
    """The pool's check of a connection before it is reused, held to ``seconds`` (the connect
    timeout) rather than the statement backstop. Where the driver fixes the read timeout when the
    connection opens, the check is skipped: it would wait out the whole backstop, and a connection
    the server closed fails its first statement at once anyway (the poll is retried on a new one)."""
    ping = engine.dialect.do_ping
    limit = _whole(seconds)

    def do_ping(dbapi_connection: Any) -> bool:
        if not _settable_read_timeout(dbapi_connection):
            return True
        backstop = dbapi_connection._read_timeout
        dbapi_connection._read_timeout = limit
        try:
            return bool(ping(dbapi_connection))
        finally:
            dbapi_connection._read_timeout = backstop

    engine.dialect.do_ping = do_ping  # type: ignore[method-assign]


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
    backstop = _backstop(source)
    args: dict = {"read_timeout": backstop, "write_timeout": backstop}
    if url.get_driver_name() == "pymysql":
        # PyMySQL reads the server's greeting under the read timeout (the C clients under the
        # connect timeout): the handshake gets the connect timeout, and the session setup below
        # raises it to the backstop once the connection is open.
        args["read_timeout"] = _whole(source.connect_timeout_seconds)
        from .pymysql_times import CONVERSIONS

        args["conv"] = CONVERSIONS  # its DATETIME decoder, a fifth of a tool row's read, in C
    args.update(_TLS_ARGS.get(url.get_driver_name(), _mysqlclient_tls)(source))
    return args


def _pymysql_tls(source: SourceConfig) -> dict:
    """PyMySQL's arguments for source.tls_mode; "preferred" is its own default."""
    if source.tls_mode == "disabled":
        return {"ssl_disabled": True}
    if source.tls_mode == "preferred":
        return {}  # its own default; the context comes from pymysql_connection.py
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
    whole, backstop = _whole(seconds), _backstop(source)
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
        if _settable_read_timeout(dbapi_connection):
            # The handshake and the setup are done under the connect timeout: statements get the backstop.
            dbapi_connection._read_timeout = backstop

    return on_connect
