"""Text from the database made safe to show on a terminal: the one sanitizer every
command passes a row's strings through before it prints them.

A query, a tool name or an error message is whatever the agent stored. Written
raw, ``ESC ] 0 ; … BEL`` retitles the operator's terminal, ``ESC [ 2 J`` clears
it, a carriage return overwrites the line before it, and a bidirectional
override makes text read differently from its bytes. Each such character is
shown as its escape (``\\x1b``, ``\\n``, ``\\u202e``) instead: visible, never
interpreted, in a tty and in a pipe alike.
"""

from __future__ import annotations

import re

# C0 controls, DEL and the C1 controls (U+009B is a one-character CSI on some terminals),
# and the bidirectional embeddings, overrides and isolates ("Trojan Source").
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def terminal_safe(text: object) -> str:
    """``text`` as a string with every control character shown escaped."""
    return _CONTROL.sub(_escaped, str(text))
