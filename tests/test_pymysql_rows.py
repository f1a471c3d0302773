"""The compiled row reader given to PyMySQL reads every row packet as PyMySQL's own
``_read_row_from_packet`` does: the same values, types and errors, for the conversions the
source's columns get and for packets cut short or oddly encoded. On MariaDB, test_drivers.py
holds the spans of a PyMySQL read this way byte-identical to mysql-connector's."""

from __future__ import annotations

from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pymysql.connections import MySQLResult
from pymysql.protocol import MysqlPacket

from run_otel.source.pymysql_connection import ROWS_HOOKED, CompiledRows
from run_otel.source.pymysql_rows import Unreadable, read_row
from run_otel.source.pymysql_times import decode_datetime

# (encoding, converter) as PyMySQL builds them from the source's column types and CONVERSIONS.
TEXT, BINARY, INTEGER, DATETIME = ("utf8", None), (None, None), (None, int), (None, decode_datetime)


def _length(size: int, width: str) -> bytes:
    """A length as the server may write it: in one byte, or behind a 252, 253 or 254 prefix."""
    if width == "short" and size < 251:
        return bytes([size])
    if width == "short" or width == "2" and size >= 1 << 16:
        width = "3" if size < 1 << 24 else "8"
    prefix, count = {"2": (252, 2), "3": (253, 3), "8": (254, 8)}[width]
    return bytes([prefix]) + size.to_bytes(count, "little")


def _packet(fields: list[bytes | None], widths: list[str]) -> bytes:
    out = b""
    for value, width in zip(fields, widths):
        out += b"\xfb" if value is None else _length(len(value), width) + value
    return out


def _outcome(read):
    try:
        row = read()
    except Exception as exc:  # a row PyMySQL refuses must be refused alike
        return ("raises", type(exc))
    return ("row", [(type(v), v) for v in row])


def _pymysql(data: bytes, converters) -> tuple:
    result = MySQLResult.__new__(MySQLResult)
    result.converters, result.unbuffered_active = converters, False
    return _outcome(lambda: MySQLResult._read_row_from_packet(result, MysqlPacket(data, "utf8")))


def _compiled(data: bytes, converters) -> tuple:
    result = CompiledRows.__new__(CompiledRows)
    result.converters, result.unbuffered_active = converters, False
    return _outcome(lambda: result._read_row_from_packet(MysqlPacket(data, "utf8")))


_VALUES = {
    TEXT: st.one_of(st.text(max_size=300).map(str.encode), st.binary(max_size=40)),  # and bytes that are not UTF-8
    BINARY: st.binary(max_size=300),
    INTEGER: st.one_of(st.integers(-(2**63), 2**64).map(lambda n: str(n).encode()), st.binary(max_size=6)),
    DATETIME: st.one_of(
        st.datetimes(min_value=datetime(1000, 1, 1)).map(lambda m: m.isoformat(" ").encode()),
        st.sampled_from([b"0000-00-00 00:00:00", b"2026-02-30 10:00:00", b"2026-12-07 10:00:00.5", b"bad"]),
    ),
}


@st.composite
def rows(draw):
    converters = draw(st.lists(st.sampled_from(list(_VALUES)), min_size=1, max_size=18))
    fields = [draw(st.one_of(st.none(), _VALUES[c])) for c in converters]
    widths = draw(st.lists(st.sampled_from(["short", "short", "2", "3", "8"]), min_size=len(fields), max_size=len(fields)))
    return converters, fields, widths


@settings(max_examples=1500)
@given(rows())
def test_a_row_the_server_sends_reads_as_pymysql_reads_it(row):
    converters, fields, widths = row
    data = _packet(fields, widths)
    _assert_read_here(data, converters)
    assert _compiled(data, converters) == _pymysql(data, converters)


def _assert_read_here(data: bytes, converters) -> None:
    """The precondition: a well-formed row is read by :func:`read_row`, not handed back to PyMySQL."""
    try:
        read_row(data, 0, converters)
    except Unreadable:
        raise AssertionError(f"a well-formed row went to PyMySQL's reader: {data!r}") from None
    except Exception:  # a conversion PyMySQL refuses too, compared by the caller
        pass


@settings(max_examples=1500)
@given(rows(), st.data())
def test_a_packet_cut_short_or_oddly_prefixed_reads_or_fails_as_pymysql_does(row, data):
    converters, fields, widths = row
    packet = _packet(fields, widths)
    cut = data.draw(st.integers(0, len(packet)))
    odd = data.draw(st.sampled_from([b"", b"\xff", b"\xfc\x01", b"\xfd\x00\x01", b"\xfe\x05", b"\x05ab"]))
    damaged = packet[:cut] + odd
    more = converters + data.draw(st.lists(st.sampled_from(list(_VALUES)), max_size=3))  # fewer fields than columns
    assert _compiled(damaged, more) == _pymysql(damaged, more)


def test_every_kind_of_length_is_read():
    # The precondition of the properties above: each width reaches read_row and gives the field.
    for width in ("short", "2", "3", "8"):
        data = _packet([b"42", None, b"x" * 300], [width] * 3)
        assert read_row(data, 0, [INTEGER, TEXT, TEXT]) == (42, None, "x" * 300)
    with pytest.raises(Unreadable):
        read_row(b"\xff", 0, [TEXT])  # a prefix PyMySQL has its own answer for


def test_this_pymysql_takes_the_compiled_reader():
    assert ROWS_HOOKED, "PyMySQL's result has no _read_row_from_packet: the source reads rows in pure Python"
