"""What the model is told when a tool's arguments fail validation (a pydantic ``ValidationError``).

:func:`pydantic_reason` turns each of the error's entries into one short constant sentence naming the
argument (``argument 'amount_cents' must be a whole number ...``), never echoing an argument name that
is an internal identifier (:func:`agentlab.core.leaks.find_leaks`).
"""

from __future__ import annotations

import re
from typing import Any

from agentlab.core.leaks import find_leaks


def pydantic_reason(exc: Any, allowed: tuple[str, ...], identifiers: tuple[str, ...] = ()) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err.get("loc", ()))
        kind = err.get("type", "")
        ctx = err.get("ctx") or {}
        got = type(err.get("input")).__name__ if "input" in err else None
        got = {"str": "text", "NoneType": "null", "bool": "a boolean", "float": "a decimal number", "int": "an integer"}.get(
            got or "", got
        )
        if kind == "extra_forbidden":
            name = loc if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,40}", loc or "") else None
            if name and find_leaks(name, identifiers):  # e.g. an internal column name: do not echo it back
                name = None
            what = f"'{name}' is not an argument of this tool" if name else "an unknown argument was sent"
            parts.append(f"{what} (allowed: {', '.join(allowed)})" if allowed else what)
            continue
        field = f"argument '{loc}'" if loc else "the arguments"
        if kind == "missing":
            parts.append(f"{field} is required")
        elif kind in ("int_type", "int_parsing", "int_from_float"):
            parts.append(f"{field} must be a whole number (a JSON integer), not {got}")
        elif kind == "greater_than":
            parts.append(f"{field} must be greater than {ctx.get('gt')}")
        elif kind == "greater_than_equal":
            parts.append(f"{field} must be at least {ctx.get('ge')}")
        elif kind in ("less_than_equal", "less_than"):
            parts.append(f"{field} must be at most {ctx.get('le', ctx.get('lt'))}")
        elif kind == "string_type":
            parts.append(f"{field} must be text, not {got}")
        elif kind in ("string_too_long",):
            parts.append(f"{field} is too long (at most {ctx.get('max_length')} characters)")
        elif kind in ("string_too_short",):
            n = ctx.get("min_length")
            parts.append(f"{field} is too short (at least {n} character{'s' if n != 1 else ''})")
        elif kind == "string_pattern_mismatch":
            parts.append(f"{field} has the wrong format")
        elif kind in ("value_error", "assertion_error"):
            msg = str(err.get("msg", "")).removeprefix("Value error, ").removeprefix("Assertion failed, ")
            parts.append(f"{field}: {msg}")
        elif kind == "model_type" or kind == "dict_type":
            parts.append("the arguments must be a JSON object")
        else:
            parts.append(f"{field} is not valid")
    return "; ".join(parts) + "."
