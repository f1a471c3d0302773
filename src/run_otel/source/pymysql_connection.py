"""The PyMySQL connection run-otel reads the source with: PyMySQL's own, with two of its steps
made cheaper, each through the hook PyMySQL has for it.

Rows. PyMySQL reads each packet and each field of a row in Python; ``pymysql_rows`` reads them
the same way, compiled: the packets the connection has already received in one pass
(``MySQLResult._read_rowdata_packet``), any other packet by PyMySQL's own ``_read_packet``, and
its fields by :func:`pymysql_rows.read_row` (``MySQLResult._read_row_from_packet``). PyMySQL
builds its result object in ``Connection._read_query_result``, which is the only place to give it
another one; that method is repeated here as PyMySQL 1.x has it. A PyMySQL whose result or
connection lacks one of these reads as it always has, slower; the tests fail if that happens.

TLS. In its preferred mode (``source.tls_mode = "preferred"``, the default) PyMySQL encrypts where
the server offers TLS and verifies nothing, yet builds each connection's context with
``ssl.create_default_context()``, which loads every certificate of the system's CA store: 20 to 50
ms of CPU a connection, for certificates it never checks. Here the connections get one context
built without them, with the same protocol floor and options, and PyMySQL's own hook
(``Connection._create_ssl_ctx``) is kept for every mode that verifies.
"""

from __future__ import annotations

import ssl
from typing import Any

from pymysql import err
from pymysql.connections import Connection, MySQLResult
from pymysql.constants import CR
from sqlalchemy import Engine, event

from .pymysql_rows import Unreadable, read_packets, read_row

ROWS_HOOKED = all(
    callable(getattr(owner, name, None))
    for owner, name in (
        (MySQLResult, "_read_row_from_packet"),
        (MySQLResult, "_read_rowdata_packet"),
        (MySQLResult, "_check_packet_is_eof"),
        (Connection, "_read_packet"),
        (Connection, "_force_close"),
    )
)


def unverified_context() -> ssl.SSLContext:
    """A client context that checks neither the certificate nor the host name, as PyMySQL's preferred mode."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class CompiledRows(MySQLResult):
    """A result whose rows are read by :func:`read_packets` and :func:`read_row`."""

    def _read_rowdata_packet(self) -> None:
        connection: Any = self.connection  # type: ignore[has-type]
        rows: list[tuple[Any, ...]] = []
        while True:
            packet = connection._read_packet()
            if self._check_packet_is_eof(packet):
                self.connection = None  # as PyMySQL: no cycle between the result and its connection
                break
            rows.append(self._read_row_from_packet(packet))
            # A row packet is always followed by another, or by the EOF: waiting for one is PyMySQL's next read.
            while used := self._read_received(connection, rows):
                connection._rfile.read(used)
        self.affected_rows = len(rows)
        self.rows = tuple(rows)

    def _read_received(self, connection: Any, rows: list[tuple[Any, ...]]) -> int:
        """Reads the whole row packets the connection has received; returns the bytes they took."""
        try:
            received = connection._rfile.peek(1)  # all that is buffered; a read of the socket only when nothing is
        except OSError as exc:  # as PyMySQL's own read of the socket (Connection._read_bytes)
            connection._force_close()
            raise err.OperationalError(CR.CR_SERVER_LOST, f"Lost connection to MySQL server during query ({exc})") from exc
        except BaseException:
            connection._force_close()
            raise
        used, connection._next_seq_id = read_packets(received, connection._next_seq_id, self.converters, rows)
        return used

    def _read_row_from_packet(self, packet: Any) -> tuple[Any, ...]:
        try:
            return read_row(packet._data, packet._position, self.converters)
        except Unreadable:
            return super()._read_row_from_packet(packet)  # type: ignore[no-any-return]


class SourceConnection(Connection):
    """A PyMySQL connection whose rows are read compiled and whose preferred-mode TLS context is given."""

    def __init__(self, *args: Any, preferred_context: ssl.SSLContext | None = None, **kwargs: Any) -> None:
        self._preferred_context = preferred_context
        super().__init__(*args, **kwargs)

    def _create_ssl_ctx(self, sslp: Any) -> ssl.SSLContext:
        if sslp == {} and self._preferred_context is not None:  # preferred: no CA, no certificate, nothing to verify
            return self._preferred_context
        return super()._create_ssl_ctx(sslp)  # type: ignore[no-any-return]

    def _read_query_result(self, unbuffered: bool = False) -> Any:
        if unbuffered or not ROWS_HOOKED:
            return super()._read_query_result(unbuffered)
        self._result = None
        result = CompiledRows(self)
        result.read()
        self._result = result
        if result.server_status is not None:
            self.server_status = result.server_status
        return result.affected_rows


def connect_as_source(engine: Engine, preferred_tls: bool) -> None:
    """The engine's PyMySQL connections made as :class:`SourceConnection`; with ``preferred_tls``,
    all with one context that loads no CA store."""
    context = unverified_context() if preferred_tls else None

    @event.listens_for(engine, "do_connect")
    def connect(_dialect: Any, _record: Any, cargs: tuple, cparams: dict) -> Connection:
        return SourceConnection(*cargs, preferred_context=context, **cparams)
