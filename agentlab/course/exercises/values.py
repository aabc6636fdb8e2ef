"""How an exercise check compares a learner's value with the expected one: by type and content.

``got == want`` lets the learner's object decide: an object whose ``__eq__`` always returns True, a dict
or str subclass that overrides it, pass every value, and ``True == 1`` passes a count. :func:`same` never
calls a method of the learner's value; it reads the value's type (``type(got)``, which cannot be
overridden, unlike ``isinstance`` through ``__class__``) and its content through the built-in types' own
methods (``dict.items``, ``list.__iter__``, ``str.__eq__``):

- ``None``, ``bool``, ``int``, ``str`` and ``bytes`` match only their exact type (a ``bool`` is not a
  count, ``1.0`` is not ``1``, a ``str`` subclass is not a ``str``), then compare by value;
- a ``float`` matches an exact ``float`` of the same value (within ``rel_tol=1e-9``), NaN only NaN;
- a ``dict`` matches a ``dict`` (a ``Counter`` or ``defaultdict`` too: read as a dict) with the same keys
  (each key compared by :func:`same`) and the same value under each, a ``list`` a ``list`` and a
  ``tuple`` a ``tuple`` of the same length, element by element;
- a NumPy scalar counts as the Python number it holds (``numpy.int64(3)`` is ``3``).

An expected value of any other type (none of the exercises has one) is compared with its own ``==``,
called on the expected side only, and matches only a value of exactly its type.
"""

from __future__ import annotations

import math
import sys
from typing import Any

__all__ = ["described", "same", "shown"]

_EXACT = (type(None), bool, int, str, bytes)
_REL_TOL = 1e-9  # floats: how close two values must be, relative to the larger


def _native(value: Any) -> Any:
    """A NumPy scalar as the Python value it holds; anything else as it is. NumPy is only looked at when
    something already imported it, and only its own scalar types are unwrapped (an object that merely
    has ``item()`` and ``shape`` is not)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None and issubclass(type(value), numpy.generic):
        return value.item()
    return value


def _native_deep(value: Any) -> Any:
    """:func:`_native` inside plain dicts, lists and tuples too, for showing (``[3]``, not ``[np.int64(3)]``)."""
    kind = type(value)
    if kind is dict:
        return {_native_deep(k): _native_deep(v) for k, v in value.items()}
    if kind in (list, tuple):
        return kind(_native_deep(v) for v in value)
    return _native(value)


def _same_float(got: float, want: float) -> bool:
    if math.isnan(want) or math.isnan(got):
        return math.isnan(want) and math.isnan(got)
    return math.isclose(got, want, rel_tol=_REL_TOL)


def _same_dict(got: dict, want: dict) -> bool:
    pairs = list(dict.items(got))
    if len(pairs) != len(want):
        return False
    for key, value in want.items():
        matches = [v for k, v in pairs if same(k, key)]
        if len(matches) != 1 or not same(matches[0], value):
            return False
    return True


def _same_items(got: list | tuple, want: list | tuple, base: type) -> bool:
    items = list(base.__iter__(got))
    return len(items) == len(want) and all(same(g, w) for g, w in zip(items, want))


def same(got: Any, want: Any) -> bool:
    """Whether the learner's ``got`` is ``want`` by type and content (see the module's docstring); never
    calls a method ``got`` defines, never raises."""
    got, want = _native(got), _native(want)
    kind = type(want)
    if kind in _EXACT:
        return type(got) is kind and kind.__eq__(want, got) is True
    if kind is float:
        return type(got) is float and _same_float(got, want)
    if isinstance(want, dict):
        return issubclass(type(got), dict) and _same_dict(got, want)
    if kind in (list, tuple):
        return issubclass(type(got), kind) and _same_items(got, want, kind)
    try:
        return type(got) is kind and bool(want == got)
    except Exception:  # noqa: BLE001 - a comparison that fails is not a match
        return False


def shown(value: Any) -> str:
    """``repr(value)`` on one line; a DataFrame, Series or array by its type and shape; a value whose
    ``repr`` raises by its type alone. Never raises."""
    try:
        value = _native_deep(value)
    except Exception:  # noqa: BLE001 - a key of the learner's whose __hash__ raises: show it as it is
        value = _native(value)
    name = type(value).__name__
    try:
        shape = getattr(value, "shape", None)
    except Exception:  # noqa: BLE001 - a property of the learner's that raises: no shape
        shape = None
    if type(shape) is tuple and shape != ():
        return f"<a {name} of shape {shape}>"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - the learner's __repr__ failed: show what can be shown
        return f"<a {name} whose repr raised>"
    return str.replace(text, "\n", " ") if type(text) is str else f"<a {name}>"


def described(value: Any) -> str:
    """:func:`shown` and the value's type, ``1 (int)``, ``True (bool)``: what a FAILED line shows of the
    value given and of the one expected, so that ``True`` for ``1`` or ``'3'`` for ``3`` is plain to see."""
    text, name = shown(value), type(_native(value)).__name__
    return text if text.startswith(f"<a {name} ") else f"{text} ({name})"
