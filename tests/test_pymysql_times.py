"""The fast DATETIME decoder given to PyMySQL returns what PyMySQL's own decoder returns, for the
server's values and for any other text, in the fast loop; on MariaDB, test_drivers.py holds the
spans of both drivers byte-identical."""

from __future__ import annotations

from datetime import datetime

from hypothesis import given, settings
from hypothesis import strategies as st
from pymysql.converters import convert_datetime

from run_otel.source.pymysql_times import decode_datetime


def _outcome(decode, value) -> tuple:
    try:
        decoded = decode(value)
    except Exception as exc:  # PyMySQL's decoder raises on some text: so must this one, alike
        return ("raises", type(exc))
    return (type(decoded), decoded)


def _same(value) -> None:
    assert _outcome(decode_datetime, value) == _outcome(convert_datetime, value), value


def _server(moment: datetime, digits: int) -> str:
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    return text + "." + f"{moment.microsecond:06d}"[:digits] if digits else text


@settings(max_examples=500)
@given(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)), st.integers(0, 6))
def test_what_the_server_sends_decodes_as_pymysql_decodes_it(moment, digits):
    text = _server(moment, digits)
    _same(text)
    _same(text.encode())


# Near-misses of the server's form: its characters and the ones fromisoformat reads otherwise.
_NEAR = st.text(alphabet="0123456789-: .TWZ+²٣", min_size=8, max_size=30)


@settings(max_examples=1500)
@given(
    st.one_of(
        _NEAR,
        st.builds(
            lambda t, i, c: t[:i] + c + t[i + 1 :],
            st.datetimes().map(lambda m: _server(m, 6)),
            st.integers(0, 25),
            st.sampled_from("0-: .TWZ+²a"),
        ),
    )
)
def test_any_other_text_decodes_as_pymysql_decodes_it(text):
    _same(text)


def test_the_values_pymysql_returns_as_text_stay_text():
    for text in ("0000-00-00 00:00:00", "2026-02-30 10:00:00", "2026-12-07 24:00:00", "2026-W49-1 10:11:12"):
        _same(text)
    assert decode_datetime(b"0000-00-00 00:00:00") == "0000-00-00 00:00:00"  # the precondition: PyMySQL's text
    assert decode_datetime(b"2026-12-07 10:11:12.5") == datetime(2026, 12, 7, 10, 11, 12, 500000)
