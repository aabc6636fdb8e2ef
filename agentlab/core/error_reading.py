"""How the translator reads an exception: as data, never trusted, and never raising.

An error's own attributes may be of any type or raise when read (a foreign error class, a hostile
``__str__``): :func:`attribute_of` and :func:`text_or_none` answer None then, :func:`text_of` a note. The
SQLSTATE (:func:`sqlstate_of`, five characters per PostgreSQL Appendix A "PostgreSQL Error Codes"), the
class's dotted name (:func:`class_name`), the redacted detail for the log and the events table
(:func:`detail_of`, with psycopg's ``diag`` fields) and an exception group's members, depth first
(:func:`leaves_of`), are read this way for :mod:`agentlab.core.errors`.
"""

from __future__ import annotations

import re
from typing import Any

_MAX_GROUP_DEPTH = 32  # nesting beyond this is read as a member of its own (no real group is that deep)
_GROUP_MEMBERS = BaseExceptionGroup.__dict__["exceptions"]  # the members as stored, whatever a subclass overrides


def leaves_of(exc: BaseException) -> list[BaseException]:
    """The members of ``exc``, depth first, with nested groups flattened; ``[exc]`` when it is no group
    (or an empty one, which only a subclass can make)."""
    out: list[BaseException] = []
    seen: set[int] = set()

    def walk(e: BaseException, depth: int) -> None:
        if not issubclass(type(e), BaseExceptionGroup) or depth >= _MAX_GROUP_DEPTH or id(e) in seen:
            out.append(e)
            return
        seen.add(id(e))
        members = _GROUP_MEMBERS.__get__(e)
        if not members:
            out.append(e)
        for m in members:
            walk(m, depth + 1)

    walk(exc, 0)
    return out


_SQLSTATE = re.compile(r"[0-9A-Z]{5}")


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE ``exc`` carries (five characters, digits and capitals), or None: a ``sqlstate`` of
    another type or form, or one whose reading raises, is none."""
    state = text_or_none(attribute_of(exc, "sqlstate"))
    return state if state is not None and _SQLSTATE.fullmatch(state) else None


def attribute_of(obj: Any, name: str) -> Any:
    """``getattr(obj, name, None)``, or None when reading it raises (a property of a foreign error class)."""
    try:
        return getattr(obj, name, None)
    except Exception:  # noqa: BLE001 - an attribute that cannot be read is an attribute that is absent
        return None


def text_or_none(value: Any) -> str | None:
    """``value`` as a plain ``str`` when it is text (a ``str`` subclass is copied, its methods unused), else None."""
    return str.__str__(value) if issubclass(type(value), str) else None


def text_of(exc: BaseException) -> str:
    """``str(exc)``, or a note naming its class when that raises."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - an error whose __str__ fails still gets an answer
        return f"<str() of a {type(exc).__name__} raised>"


def class_name(exc: BaseException) -> str:
    """``exc``'s class as ``module.QualName`` (``?`` for a module that is not text), as events record it."""
    module = text_or_none(attribute_of(type(exc), "__module__")) or "?"
    return f"{module}.{type(exc).__qualname__}"


def detail_of(exc: BaseException) -> str:
    """What the log and the events table hold about ``exc``: its class, its text and psycopg's ``diag``
    fields (schema, table, column, constraint, context) when it has them, redacted
    (:func:`agentlab.core.redact.redact`). Never model-facing."""
    from agentlab.core.redact import redact

    text = f"{class_name(exc)}: {text_of(exc)}"
    diag = attribute_of(exc, "diag")
    if diag is not None:
        extra = {k: text_or_none(attribute_of(diag, k))
                 for k in ("schema_name", "table_name", "column_name", "constraint_name", "context")}
        extra = {k: v for k, v in extra.items() if v}
        if extra:
            text += " " + " ".join(f"{k}={v}" for k, v in extra.items())
    return redact(text)

