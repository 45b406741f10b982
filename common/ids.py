"""Job and device ids: one form, checked wherever an id comes in (the client, the command line,
task payloads) and again where a Redis key is built from one (`keys.py`).

An id is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit: it never
holds ':' (which separates the parts of a key), a SCAN wildcard, white space or a path
separator, so no id can name another record's key.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
ID_RULE = "1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
SHOWN_CHARS = 40  # of a refused id, in the message

Identifier = Annotated[str, Field(pattern=ID_PATTERN, description=f"an id: {ID_RULE}")]
_ID = re.compile(ID_PATTERN)


class InvalidIdError(ValueError):
    """A job or device id that is not of the allowed form; the message names the field."""


def is_id(value: object) -> bool:
    """Whether `value` is a job or device id."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def checked_id(value: object, field: str) -> str:
    """`value` if it is an id; InvalidIdError naming `field` and the allowed form otherwise
    (the value shown on one line, cut to SHOWN_CHARS characters)."""
    if is_id(value):
        return str(value)
    shown = repr(value)
    if isinstance(value, str) and len(value) > SHOWN_CHARS:
        shown = f"{value[:SHOWN_CHARS]!r}... ({len(value)} characters)"
    raise InvalidIdError(f"{field}: {shown} is not allowed: {ID_RULE}")
