"""What reading the agent's database raises, and what a driver's or SQLAlchemy's error means."""

from __future__ import annotations

# Server errors that mean a statement hit the timeout rather than failed.
_TIMEOUT_ERRORS = {1969: "max_statement_time", 3024: "max_execution_time", 1205: "lock_wait_timeout"}
# Client errors that mean the connection is gone (the server restarted, a failover, a
# dropped network): 2003 cannot connect, 2006 server has gone away, 2013 lost during
# a query (also the read-timeout backstop's), 2055 mysql-connector's lost connection.
_CONNECTION_ERRORS = frozenset({2003, 2006, 2013, 2055})
# The same, in the words of an error that carries no code.
_LOST_WORDS = ("Lost connection to", "MySQL server has gone away", "Can't connect to")
_NO_SUCH_FUNCTION = 1305  # MySQL/MariaDB: FUNCTION ... does not exist
_TLS_FAILED = 2026  # the client's "SSL connection error", often with only OpenSSL's own words


class SourceError(RuntimeError):
    """The database could not be read. The message never holds a password."""


class ConnectionLost(SourceError):
    """The connection to the database was lost or refused: worth retrying."""


# The server's refusals of a login, and what to check for each: 1045 a wrong password, user or
# host, 1698 a user that may not log in with a password, 1044 a database closed to the user.
_ACCESS_DENIED = {
    1045: "the password, and that the user may connect from this host (the host in the message)",
    1698: "how the user authenticates: it may not log in with a password (unix_socket or auth_socket)",
    1044: "the user's grant: it may not use this database",
}


def _mysql_error(error: BaseException) -> tuple[int | None, str]:
    """The server's error number and message, as PyMySQL, mysqlclient and mysql-connector carry them."""
    args: tuple = tuple(getattr(error, "args", ()))
    code = getattr(error, "errno", None)
    if not (isinstance(code, int) and code > 0):
        code = args[0] if args and isinstance(args[0], int) else None
    message = getattr(error, "msg", None) or (args[1] if len(args) > 1 else str(error))
    return code, str(message)


def connect_failure(error: BaseException, password_file: str) -> str:
    """Why a first connection failed, in words that point at the fix: a refused login is not an
    unreachable server, and an unreadable password file is neither."""
    if isinstance(error, SourceError):
        return f"not connected: {error}"
    reason = getattr(error, "orig", None) or error
    code, message = _mysql_error(reason)
    if code not in _ACCESS_DENIED:
        return f"unreachable: {reason}"
    sent = f"source.password_file ({password_file})" if password_file else "the password in source.url"
    if "using password: NO" in message:
        sent = "no password was sent: set source.password_file"
    return f"reached, but the server denied access (MySQL error {code}: {message}); check {_ACCESS_DENIED[code]}; {sent}"


def unwrapped_driver_errors() -> tuple[type[Exception], ...]:
    """mysql-connector's C extension raises its own MySQLInterfaceError from rollback()
    without wrapping it, and SQLAlchemy re-raises what is not a DB-API error as it is: a
    server gone between a read and the connection's release would otherwise end a
    backfill with a traceback instead of the wait every other lost connection gets."""
    try:
        from _mysql_connector import MySQLInterfaceError
    except ImportError:
        return ()
    return (MySQLInterfaceError,)


def _lost(where: str, reason: object) -> ConnectionLost:
    return ConnectionLost(
        f"database {where}: lost the connection (the server restarted or went away, or the network dropped it): {reason}"
    )


def read_failed(exc: Exception, where: str, statement_timeout: float, summarizes_evidence: bool) -> SourceError:
    """The SourceError for a failed read of the database ``where`` names (a URL safe to print)."""
    from sqlalchemy.exc import SQLAlchemyError  # here: what imports SourceError alone needs no SQLAlchemy

    if not isinstance(exc, SQLAlchemyError):  # the driver's own, unwrapped
        code = getattr(exc, "errno", None)
        if code in _CONNECTION_ERRORS or str(exc).startswith(_LOST_WORDS):
            return _lost(where, exc)
        return SourceError(f"database {where}: {exc}")
    reason = getattr(exc, "orig", None) or exc.__class__.__name__
    code = getattr(reason, "args", (None,))[0] if getattr(reason, "args", None) else None
    # SQLAlchemy's own disconnect test knows each driver's words for it, such as
    # mysql-connector's "MySQL Connection not available" with no error code.
    if code in _CONNECTION_ERRORS or getattr(exc, "connection_invalidated", False):
        return _lost(where, reason)
    if code in _TIMEOUT_ERRORS:
        reason = (
            f"a statement ran past source.statement_timeout_seconds ({statement_timeout:g}s; "
            f"{_TIMEOUT_ERRORS[code]}): is a table locked? {reason}"
        )
    elif code == _TLS_FAILED and "doesn't support it" in str(reason):  # the drivers' words for a server without TLS
        reason = f'{reason}: the server offers no TLS; turn it on there, or set source.tls_mode = "preferred" to allow plain text'
    elif code == _TLS_FAILED:
        reason = f"{reason}: the TLS handshake failed; does source.tls_ca sign the server's certificate?"
    elif code == _NO_SUCH_FUNCTION and summarizes_evidence:
        reason = f"{reason}: this server has no JSON functions; set source.evidence_in_database = false"
    return SourceError(f"database {where}: {reason}")
