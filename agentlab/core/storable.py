"""What PostgreSQL can store: one check for every value the kit writes to a TEXT or JSONB column.

PostgreSQL text (and so JSONB) cannot hold a NUL byte (``\\x00``; in JSON ``\\u0000``, SQLSTATE 22P05
"unsupported Unicode escape sequence"), and a Python string with a lone surrogate cannot even be
encoded to UTF-8. A model can send either in any argument or tool call id. The kit refuses such a
value where it comes in (the argument models, :class:`agentlab.core.toolspec.StrictArgs`; the tools
node for call ids; the approval node for a request), and escapes it in the texts it writes itself
(events, an outbox row's ``last_error``), so that one bad value never makes a statement fail.

Source: PostgreSQL docs "Character Types" (the character with code zero cannot be stored) and
"JSON Types" (``\\u0000`` is rejected).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

UNSTORABLE_REASON = "holds a character that cannot be stored (a NUL byte or an invalid code point); send the text without it"


def storable(text: str) -> bool:
    """Whether PostgreSQL can store ``text``: no NUL byte and valid UTF-8 (no lone surrogate)."""
    if text.isascii():
        return "\x00" not in text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def unstorable_path(value: Any, path: str = "") -> str | None:
    """The path (``"args.reference"``, ``"items[2]"``) of the first text in ``value`` that cannot be
    stored, looking through mappings (keys and values), lists and tuples; None when all of it can."""
    if isinstance(value, str):
        return None if storable(value) else (path or "value")
    if isinstance(value, Mapping):
        for k, v in value.items():
            sub = f"{path}.{k}" if path else str(k)
            if isinstance(k, str) and not storable(k):
                return path or "a key"
            found = unstorable_path(v, sub)
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = unstorable_path(v, f"{path}[{i}]")
            if found:
                return found
    return None


def storable_text(text: str) -> str:
    """``text`` made storable: NUL written as ``\\x00``, a lone surrogate as ``?``. Unchanged when it already is."""
    if storable(text):
        return text
    return text.replace("\x00", "\\x00").encode("utf-8", "replace").decode("utf-8")
