"""The mysql-connector connection run-otel reads the source with: the C extension's own, its rows
taken as the extension makes them.

``CMySQLConnection.get_rows`` goes over each row in Python after the C extension has made it: it
copies the tuple to a list, asks the extension whether it converts, walks every column for a
VECTOR type, and copies the list back to a tuple. For a result where none of that changes a row
(the extension converts, no converter class, no VECTOR column, all the rows at once, no prepared
statement), :meth:`SourceCMySQLConnection.get_rows` keeps the extension's tuples as they come, with
the same errors; any other result is read by the extension's ``get_rows``. SQLAlchemy connects
with ``mysql.connector.connect``, which picks this class's parent when nothing asks for a pool,
failover, option files or pure Python; the engine's ``do_connect`` listener makes this class
there, and leaves the rest to ``connect``.
"""

from __future__ import annotations

from typing import Any

from mysql.connector.constants import CNX_POOL_ARGS, FieldType
from mysql.connector.errors import InterfaceError, get_mysql_exception
from sqlalchemy import Engine, event

try:
    from _mysql_connector import MySQLInterfaceError
    from mysql.connector.connection_cext import CMySQLConnection
except ImportError:  # no C extension: mysql.connector.connect's pure-Python connection reads alone
    C_EXTENSION = False
else:
    C_EXTENSION = True

# What makes mysql.connector.connect take another path than the C connection.
_OTHER_PATHS = frozenset({"use_pure", "dns_srv", "read_default_file", "option_files", "failover", *CNX_POOL_ARGS})
_VECTOR = getattr(FieldType, "VECTOR", None)


def _rows(fetch_row: Any) -> list[tuple[Any, ...]]:
    rows = []
    row = fetch_row()
    while row:
        rows.append(row)
        row = fetch_row()
    return rows


if C_EXTENSION:

    class SourceCMySQLConnection(CMySQLConnection):
        """The C extension's connection, whose whole results keep the extension's tuples."""

        def get_rows(
            self,
            count: int | None = None,
            binary: bool = False,
            columns: Any = None,
            raw: bool | None = None,
            prep_stmt: Any = None,
            **kwargs: Any,
        ) -> tuple[list[tuple[Any, ...]], Any]:
            as_made = count is None and prep_stmt is None and not (self._raw if raw is None else raw) and not self.converter
            if not (as_made and self._cmysql and self.unread_result and not self._cmysql.raw()) or any(
                column[1] == _VECTOR for column in self._columns
            ):
                return super().get_rows(count, binary, columns, raw, prep_stmt, **kwargs)  # type: ignore[no-any-return]
            try:
                rows = _rows(self._cmysql.fetch_row)
                eof = self.fetch_eof_columns()["eof"]
                self.free_result()
            except MySQLInterfaceError as err:  # as the extension's own get_rows says it
                self.free_result()
                if hasattr(err, "errno"):
                    raise get_mysql_exception(err.errno, msg=err.msg, sqlstate=err.sqlstate) from err
                raise InterfaceError(str(err)) from err
            return rows, eof


def connect_as_source(engine: Engine) -> None:
    """The engine's mysql-connector connections made as :class:`SourceCMySQLConnection` where
    ``mysql.connector.connect`` would make the C extension's."""
    if not C_EXTENSION:
        return

    @event.listens_for(engine, "do_connect")
    def connect(_dialect: Any, _record: Any, cargs: tuple, cparams: dict) -> Any:
        if _OTHER_PATHS.intersection(cparams):
            return None  # SQLAlchemy goes on to mysql.connector.connect
        return SourceCMySQLConnection(*cargs, **cparams)
