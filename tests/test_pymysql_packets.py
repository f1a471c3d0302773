"""The compiled reading of a result's row packets (``CompiledRows._read_rowdata_packet`` with
:func:`read_packets`) ends as PyMySQL's own does, for any stream a server or a broken network
gives it: the same rows, the same error, the same sequence number, the same bytes left unread,
the connection closed alike. The stream arrives in pieces of any size through a buffer of any
size, so packets lie whole in the buffer, across its end, or across the socket's reads."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pymysql.connections import Connection, MySQLResult
from test_pymysql_rows import _VALUES, _packet, rows

from run_otel.source.pymysql_connection import CompiledRows
from run_otel.source.pymysql_rows import read_packets


class _Raw(io.RawIOBase):
    """The socket as PyMySQL's buffered reader reads it: the stream in the given pieces, then the
    end of the stream or ``error``."""

    def __init__(self, data: bytes, pieces: list[int], error: BaseException | None):
        self._data, self._pieces, self._error, self._at = data, list(pieces), error, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._at >= len(self._data):
            if self._error is not None:
                raise self._error
            return 0
        size = min(len(buffer), self._pieces.pop(0) if self._pieces else len(buffer), len(self._data) - self._at)
        buffer[:size] = self._data[self._at : self._at + size]
        self._at += size
        return size


class _Socket:
    def settimeout(self, _timeout) -> None:
        pass

    def close(self) -> None:
        pass


def _header(size: int, sequence: int) -> bytes:
    return size.to_bytes(3, "little") + bytes([sequence & 0xFF])


def _result(kind: type[MySQLResult], stream: bytes, pieces: list[int], buffer: int, error, sequence: int, converters):
    """A result of ``kind`` about to read its rows from ``stream``, on a connection that never connected."""
    connection = Connection.__new__(Connection)  # what reading a result uses of a connection, without connecting
    connection.encoding, connection._result = "utf8", None
    connection._sock, connection._rfile = _Socket(), io.BufferedReader(_Raw(stream, pieces, error), buffer)
    connection._next_seq_id, connection._read_timeout, connection._current_timeout = sequence, None, None
    result = kind(connection)
    result.converters, result.field_count = converters, len(converters)
    return result, connection


def _read(kind: type[MySQLResult], stream: bytes, pieces: list[int], buffer: int, error, sequence: int, converters):
    result, connection = _result(kind, stream, pieces, buffer, error, sequence, converters)
    try:
        result._read_rowdata_packet()
        outcome: tuple = ("rows", [[(type(v), v) for v in row] for row in result.rows], result.warning_count, result.has_next)
    except Exception as exc:  # a stream PyMySQL refuses must be refused alike
        outcome = ("raises", type(exc), str(exc))
    closed = connection._rfile is None
    try:
        rest = None if closed else connection._rfile.read()
    except OSError as exc:
        rest = ("raises", type(exc))
    return outcome, connection._next_seq_id, closed, rest


_ERROR_PACKET = b"\xff\x15\x04#28000Access denied"
_TRAILING = b"\x05\x00\x00\x07next!"  # what follows the result: left unread by both


@st.composite
def streams(draw):
    converters, fields, widths = draw(rows())
    kinds = [_packet(fields, widths), _packet([draw(st.one_of(st.none(), _VALUES[c])) for c in converters], widths)]
    bodies = [kinds[k] for k in draw(st.lists(st.integers(0, 1), max_size=40))]  # a result of up to 40 rows
    status = draw(st.integers(0, 0xFFFF))
    bodies.append(b"\xfe" + draw(st.integers(0, 0xFFFF)).to_bytes(2, "little") + status.to_bytes(2, "little"))
    sequence = draw(st.integers(0, 255))
    damage = draw(st.sampled_from(["none", "none", "sequence", "error", "cut field", "cut stream", "empty packet"]))
    at = draw(st.integers(0, len(bodies) - 1))
    numbers = [sequence + k for k in range(len(bodies))]
    if damage == "sequence":
        numbers[at] += draw(st.sampled_from([1, 2, 255 - (numbers[at] & 0xFF)]))  # the last one: a 0, MariaDB's shutdown
    elif damage == "error":
        bodies[at] = _ERROR_PACKET
    elif damage == "cut field":
        bodies[at] = bodies[at] + b"\xfc\x10"  # a length with no field after it
    elif damage == "empty packet":
        bodies[at] = b""
    stream = b"".join(_header(len(body), number) + body for body, number in zip(bodies, numbers)) + _TRAILING
    if damage == "cut stream":
        stream = stream[: draw(st.integers(0, len(stream)))]
    error = draw(st.sampled_from([None, ConnectionResetError(104, "Connection reset by peer"), TimeoutError("timed out")]))
    pieces = draw(st.lists(st.integers(1, 700), max_size=30))
    buffer = draw(st.sampled_from([16, 64, 300, 8192]))
    return stream, pieces, buffer, error, sequence & 0xFF, converters


@settings(max_examples=1500)
@given(streams())
def test_a_result_reads_and_fails_as_pymysql_reads_it(stream):
    assert _read(CompiledRows, *stream) == _read(MySQLResult, *stream)


class _Counted(CompiledRows):
    packets = 0

    def _read_row_from_packet(self, packet):
        _Counted.packets += 1
        return super()._read_row_from_packet(packet)


def test_rows_already_received_are_read_in_one_pass():
    # The precondition of the property above: the compiled loop reads the rows, not PyMySQL's.
    converters = [(None, int), ("utf8", None)]
    bodies = [_packet([str(n).encode(), b"tool row"], ["short", "short"]) for n in range(300)]
    stream = b"".join(_header(len(body), k) + body for k, body in enumerate(bodies))
    stream += _header(5, 300) + b"\xfe\x00\x00\x02\x00"
    outcome, sequence, closed, rest = _read(_Counted, stream, [], 1 << 16, None, 0, converters)
    assert outcome[0] == "rows" and len(outcome[1]) == 300 and sequence == 301 % 256 and not closed and rest == b""
    assert _Counted.packets == 1, "only the first row goes through PyMySQL's packet reader"


def test_read_packets_stops_where_a_packet_is_not_a_plain_row():
    converters = [("utf8", None)]
    row = _header(3, 7) + b"\x02ok"
    rows_read: list = []
    assert read_packets(row + row[:5], 7, converters, rows_read) == (7, 8)  # the second is cut by the buffer's end
    assert read_packets(row + _header(5, 8) + b"\xfe\x00\x00\x02\x00", 7, converters, rows_read) == (7, 8)  # EOF
    assert read_packets(row + _header(3, 9) + b"\x02ok", 7, converters, rows_read) == (7, 8)  # out of sequence
    assert read_packets(_header(3, 255) + b"\x02ok" + _header(3, 0) + b"\x02ok", 255, converters, rows_read) == (14, 1)
    assert rows_read == [("ok",)] * 5
    # A result of no columns reads any packet as an empty row: the EOF and error packets are told by their first byte.
    eof, error = _header(5, 7) + b"\xfe\x00\x00\x02\x00", _header(len(_ERROR_PACKET), 7) + _ERROR_PACKET
    assert read_packets(eof, 7, [], rows_read) == read_packets(error, 7, [], rows_read) == (0, 7)


def test_a_connection_lost_between_rows_fails_as_pymysql_says():
    # Between two packets the compiled reader is the one that reads the socket: its errors are PyMySQL's.
    stream = _header(3, 0) + b"\x02ok"
    for error in (ConnectionResetError(104, "Connection reset by peer"), TimeoutError("timed out")):
        compiled = _read(CompiledRows, stream, [], 8192, error, 0, [("utf8", None)])
        assert compiled == _read(MySQLResult, stream, [], 8192, error, 0, [("utf8", None)])
        (kind, exception, message), _, closed, _ = compiled
        assert (kind, exception.__name__, closed) == ("raises", "OperationalError", True)
        assert "Lost connection to MySQL server during query" in message and str(error) in message


def test_an_interrupted_read_between_rows_closes_the_connection_as_pymysql_does():
    stream = _header(3, 0) + b"\x02ok"
    for kind in (MySQLResult, CompiledRows):
        result, connection = _result(kind, stream, [], 8192, KeyboardInterrupt(), 0, [("utf8", None)])
        with pytest.raises(KeyboardInterrupt):
            result._read_rowdata_packet()
        assert connection._rfile is None, kind.__name__
