"""PyMySQL's reading of a result's rows, compiled with the rest of the hot path.

PyMySQL reads each row packet through about ten Python calls (the header, the body, the
packet object, the EOF and error checks) and each field through three more (the length, the
bytes, the conversion): together most of a tool row's CPU with that driver, the largest share
of a backfill's. :func:`read_row` reads a row's fields in one loop: the same lengths, the same
slices, the same ``decode`` and the same converters in the same order. :func:`read_packets`
reads the row packets the connection has already received the same way, up to the first one
that is not plainly a whole row in its sequence (the EOF or an error packet, one cut by the end
of what was received, one out of sequence or continued in the next, one with a field that does
not read): PyMySQL's own reader takes that one, and says what is wrong as it always has.
Property tests hold both to PyMySQL's readers.
"""

from __future__ import annotations

from typing import Any, Final

_NULL: Final = 251  # the length prefix of a NULL field
_ERROR: Final = 0xFF  # the first byte of an error packet
_EOF: Final = 0xFE  # the first byte of an EOF packet shorter than 9 bytes
_LONGEST: Final = 0xFFFFFF  # a packet of this length continues in the next one


class Unreadable(Exception):
    """A row this reader leaves to PyMySQL's own, for its error or its answer."""


def read_row(data: bytes, position: int, converters: list[tuple[Any, Any]]) -> tuple[Any, ...]:
    """The fields of the row packet ``data`` from ``position``, one per ``(encoding, converter)``."""
    return _read_fields(data, position, len(data), converters)


def read_packets(received: bytes, sequence: int, converters: list[tuple[Any, Any]], rows: list[Any]) -> tuple[int, int]:
    """Appends to ``rows`` the rows of the whole row packets at the start of ``received``, the
    bytes a connection has received and not read, the first numbered ``sequence``. Returns the
    bytes those packets take and the sequence number after them."""
    position = 0
    end = len(received)
    while position + 4 < end:
        size = received[position] | received[position + 1] << 8 | received[position + 2] << 16
        body = position + 4
        if received[position + 3] != sequence or size == 0 or size >= _LONGEST or body + size > end:
            break
        first = received[body]
        if first == _ERROR or (first == _EOF and size < 9):
            break
        try:
            row = _read_fields(received, body, body + size, converters)
        except Exception:  # Unreadable, or a value PyMySQL refuses: its reader reads the packet again and says so
            break
        rows.append(row)
        position = body + size
        sequence = (sequence + 1) & 0xFF
    return position, sequence


def _read_fields(data: bytes, position: int, end: int, converters: list[tuple[Any, Any]]) -> tuple[Any, ...]:
    row: list[Any] = []
    for encoding, converter in converters:
        if position >= end:
            break  # fewer fields than columns: PyMySQL stops there too
        size = data[position]
        position += 1
        if size == _NULL:
            row.append(None)
            continue
        if size > _NULL:
            size, position = _long_length(data, position, size)
        if position + size > end:
            raise Unreadable
        value: Any = data[position : position + size]
        position += size
        if encoding is not None:
            value = value.decode(encoding)
        if converter is not None:
            value = converter(value)
        row.append(value)
    return tuple(row)


def _long_length(data: bytes, position: int, prefix: int) -> tuple[int, int]:
    """A length of 2, 3 or 8 bytes after its prefix; any other prefix is left to PyMySQL. A length
    cut by the packet's end moves the position past it, where the caller stops."""
    width = 2 if prefix == 252 else 3 if prefix == 253 else 8 if prefix == 254 else 0
    if width == 0:
        raise Unreadable
    return int.from_bytes(data[position : position + width], "little"), position + width
