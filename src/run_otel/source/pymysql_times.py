"""PyMySQL's conversions, with its DATETIME and TIMESTAMP decoder made fast for what MariaDB and
MySQL send.

PyMySQL parses each such value with a regular expression and seven int() calls, about 2 µs in
pure Python: a fifth of its whole read of a tool row. ``datetime.fromisoformat`` parses the
server's own form (``YYYY-MM-DD hh:mm:ss`` and up to six digits of fraction) in C, in a tenth of
that. Anything else (a zero date, a value out of range) goes to PyMySQL's decoder, so every
value decodes as PyMySQL decodes it; a property test holds the two together.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pymysql.constants import FIELD_TYPE
from pymysql.converters import conversions, convert_datetime


def _server_form(text: str) -> bool:
    """``YYYY-MM-DD hh:mm:ss`` with an optional ``.`` and one to six digits: nothing else
    ``fromisoformat`` would read differently (a week date, a zone, a ``T``)."""
    size = len(text)
    if size != 19 and not (21 <= size <= 26 and text[19] == "." and _digits(text[20:])):
        return False
    return (
        text[4] == "-"
        and text[7] == "-"
        and text[10] == " "
        and text[13] == ":"
        and text[16] == ":"
        and _digits(text[:4] + text[5:7] + text[8:10] + text[11:13] + text[14:16] + text[17:19])
    )


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()  # isdigit() alone takes "²" and other scripts' digits


def decode_datetime(value: Any) -> Any:
    """A DATETIME or TIMESTAMP as PyMySQL's ``convert_datetime`` returns it."""
    text = value.decode("ascii") if isinstance(value, (bytes, bytearray)) else value
    if _server_form(text):
        try:
            return datetime.fromisoformat(text)
        except ValueError:
            pass  # a month 13, a 30 February: PyMySQL's answer for those
    return convert_datetime(value)


CONVERSIONS = {**conversions, FIELD_TYPE.DATETIME: decode_datetime, FIELD_TYPE.TIMESTAMP: decode_datetime}
