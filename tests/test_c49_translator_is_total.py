"""C49: the error translator is total.

``translate(e)`` and ``is_infrastructure(e)`` answer for every ``BaseException`` without raising: one
that is not an ``Exception``, one whose ``sqlstate``, ``diag`` or ``str()`` is of an unexpected type or
raises, and exception groups, classified by their members (one member that is not infrastructure makes
the group not retryable; a group of lost connections is retried). A property test builds exception
shapes (random classes and attributes, nested groups, causes and contexts with cycles) and checks that
neither function raises and that every translation is well formed and leak free.
"""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import errors as pgerr
from pydantic import BaseModel, ConfigDict, ValidationError

from agentlab.core.errors import (
    FALLBACK_RULE,
    INTERNAL_REASON,
    NO_HINTS,
    Category,
    NotFound,
    ProviderTimeout,
    SimulatedCrash,
    ToolError,
    Translation,
    find_leaks,
    is_infrastructure,
    translate,
)
from agentlab.core.messages import (
    FAILED_TEMPLATE,
    INFRA_UNAVAILABLE,
    NOT_APPLIED_TEMPLATE,
)
from agentlab.domains.billing.errors import HINTS

SECRET_SQL = "SELECT credit_cents FROM customers WHERE id = 7 via postgresql://admin:s3cr3t@10.0.0.5:5432/prod"


class Raises:
    """A descriptor whose reading raises, as a broken property of a foreign error class would (once the
    error is made: psycopg's own ``__init__`` reads ``sqlstate``)."""

    armed = True

    def __get__(self, obj, owner=None):
        if Raises.armed:
            raise RuntimeError(SECRET_SQL)


def made(cls, *args):
    """``cls(*args)``, with every :class:`Raises` quiet while the constructor runs."""
    Raises.armed = False
    try:
        return cls(*args)
    finally:
        Raises.armed = True


class CustomBase(BaseException):
    """A BaseException of a library's own, not an Exception."""


def well_formed(tr: Translation, exc: BaseException) -> None:
    assert isinstance(tr.category, Category) and type(tr.infrastructure) is bool
    assert tr.infrastructure is is_infrastructure(exc)
    if tr.infrastructure or tr.category is Category.NOT_APPLIED:
        assert tr.message == NOT_APPLIED_TEMPLATE.format(reason=tr.reason)
    else:
        assert tr.message == FAILED_TEMPLATE.format(category=tr.category.value, reason=tr.reason)
    assert tr.sqlstate is None or (type(tr.sqlstate) is str and len(tr.sqlstate) == 5)
    assert type(tr.error_class) is str and type(tr.detail) is str and type(tr.reason) is str
    assert "s3cr3t" not in tr.detail  # the detail is for the log: redacted, never the model's


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3), GeneratorExit(), CustomBase("x"),
                                 SimulatedCrash("mid-node"), StopIteration(), StopAsyncIteration()],
                         ids=lambda e: type(e).__name__)
def test_c49_a_base_exception_that_is_not_an_exception_is_an_internal_error_never_retried(exc):
    tr = translate(exc)
    well_formed(tr, exc)
    assert tr.category is Category.INTERNAL and not tr.infrastructure and tr.reason == INTERNAL_REASON
    assert not is_infrastructure(exc)


ODD = [23505, 8006.0, b"08006", None, object(), ["08006"], {"sqlstate": "08006"}, "", "08", "0800600", "08006 ",
       "lower", "\x00\x00\x00\x00\x00"]


@pytest.mark.parametrize("value", ODD, ids=lambda v: "object()" if type(v) is object else repr(v))
def test_c49_a_sqlstate_of_another_type_or_form_is_no_sqlstate(value):
    exc = type("Odd", (Exception,), {"sqlstate": value})("boom")
    tr = translate(exc, hints=HINTS)
    well_formed(tr, exc)
    assert tr.sqlstate is None and tr.rule is FALLBACK_RULE and not is_infrastructure(exc)


def test_c49_a_sqlstate_or_diag_whose_reading_raises_and_a_str_that_raises_are_read_as_absent():
    class Everything(psycopg.Error):
        sqlstate = Raises()
        diag = Raises()

        def __str__(self):
            raise ValueError(SECRET_SQL)

    everything = made(Everything, "x")
    tr = translate(everything, hints=HINTS)
    well_formed(tr, everything)
    assert tr.category is Category.INTERNAL and tr.detail.endswith("Everything: <str() of a Everything raised>")
    assert translate(everything, sanitize=False).message == "Everything: <str() of a Everything raised>"

    class OddDiag(pgerr.UniqueViolation):
        diag = type("Diag", (), {"constraint_name": 7, "table_name": Raises(), "column_name": b"c"})()

    dup = made(OddDiag, "dup")
    tr = translate(dup, hints=HINTS)
    well_formed(tr, dup)
    assert tr.sqlstate == "23505" and tr.reason == "this record already exists; do not create it again."


def test_c49_a_str_subclass_sqlstate_is_read_as_its_text_and_a_tool_error_of_odd_category_is_internal():
    class Lying(str):
        def startswith(self, *a):
            raise RuntimeError("no")

        def __eq__(self, other):
            return True

        __hash__ = str.__hash__

    exc = type("Lost", (Exception,), {"sqlstate": Lying("08006")})("gone")
    assert is_infrastructure(exc) and translate(exc).sqlstate == "08006"
    odd = ToolError("try another invoice", category="conflict")
    assert translate(odd).message == "FAILED [conflict]: try another invoice"
    worse = ToolError("x", category=object())
    worse.hint = 42
    assert translate(worse).message == FAILED_TEMPLATE.format(category="internal", reason=INTERNAL_REASON)


def test_c49_a_group_of_connection_errors_is_infrastructure_and_one_other_member_makes_it_not_retryable():
    lost = ExceptionGroup("batch", [psycopg.OperationalError("server closed the connection"), ConnectionError("reset"),
                                    ExceptionGroup("inner", [pgerr.AdminShutdown("terminating")])])
    assert is_infrastructure(lost)
    tr = translate(lost)
    well_formed(tr, lost)
    assert tr.reason == INFRA_UNAVAILABLE and tr.error_class == "builtins.ExceptionGroup"
    assert "AdminShutdown" in tr.detail and "ConnectionError" in tr.detail

    mixed = ExceptionGroup("batch", [psycopg.OperationalError("lost"),
                                     ExceptionGroup("inner", [ConnectionError("reset"), pgerr.UniqueViolation("dup")])])
    assert not is_infrastructure(mixed)
    tr = translate(mixed, hints=HINTS)
    well_formed(tr, mixed)
    assert tr.category is Category.CONFLICT and tr.sqlstate == "23505"  # the member the model can act on

    interrupted = BaseExceptionGroup("batch", [ConnectionError("reset"), KeyboardInterrupt()])
    assert not is_infrastructure(interrupted) and translate(interrupted).category is Category.INTERNAL


def test_c49_a_group_subclass_that_hides_its_members_is_still_read_by_them():
    class Hiding(ExceptionGroup):
        exceptions = Raises()

        def __str__(self):
            raise RuntimeError("no")

    group = made(Hiding, "x", [TimeoutError("slow"), ProviderTimeout("provider")])
    assert is_infrastructure(group)
    well_formed(translate(group), group)


# --------------------------------------------------------------------------- the property test

BASES = [BaseException, Exception, KeyboardInterrupt, SystemExit, GeneratorExit, CustomBase, SimulatedCrash,
         ValueError, RuntimeError, StopIteration, ConnectionError, TimeoutError, UnicodeError, psycopg.Error,
         psycopg.OperationalError, psycopg.InterfaceError, psycopg.DataError, pgerr.UniqueViolation,
         pgerr.CheckViolation, pgerr.AdminShutdown, pgerr.SerializationFailure, pgerr.InFailedSqlTransaction,
         pgerr.QueryCanceled, ToolError, NotFound, ProviderTimeout]
SQLSTATES = ["23505", "23503", "08006", "40001", "57P01", "25P02", "22P02", "XX000", "28P01", "42501"]


class Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    amount_cents: int


try:
    Model.model_validate({"amount_cents": "5", "credit_cents": 1})
except ValidationError as caught:
    VALIDATION_ERROR = caught

texts = st.one_of(st.text(max_size=30), st.sampled_from([SECRET_SQL, 'violates constraint "invoices_one_per_period"',
                                                         "Traceback (most recent call last)", ""]))
odd_values = st.one_of(st.none(), st.integers(), st.floats(), st.binary(max_size=6), texts, st.sampled_from(SQLSTATES),
                       st.just(Raises()), st.builds(object), st.lists(st.sampled_from(SQLSTATES), max_size=2))
diags = st.one_of(odd_values, st.builds(lambda attrs: type("Diag", (), attrs)(),
                                        st.dictionaries(st.sampled_from(["constraint_name", "table_name", "schema_name",
                                                                         "column_name", "context"]), odd_values)))


def _str_raising(self):
    raise RuntimeError(SECRET_SQL)


@st.composite
def error_classes(draw):
    base = draw(st.sampled_from(BASES))
    attrs = {}
    if draw(st.booleans()):
        attrs["sqlstate"] = draw(odd_values)
    if draw(st.booleans()):
        attrs["diag"] = draw(diags)
    if draw(st.booleans()):
        attrs["__str__"] = draw(st.sampled_from([_str_raising, lambda self: SECRET_SQL, lambda self: 7]))
    if issubclass(base, ToolError) and draw(st.booleans()):
        attrs["category"] = draw(st.one_of(st.sampled_from(list(Category)), odd_values))
    if draw(st.booleans()):
        attrs["__module__"] = draw(odd_values)
    return type(draw(st.sampled_from(["E", "Error", "Ölfehler", "x" * 60])), (base,), attrs)


@st.composite
def leaves(draw):
    if draw(st.integers(0, 9)) == 0:
        return VALIDATION_ERROR
    cls = draw(error_classes())
    # a ToolError's hint is model-facing by contract (the tool's own text): no leak is drawn into it
    message = draw(st.text(alphabet="abcdefgh ,.", max_size=20) if issubclass(cls, ToolError) else texts)
    return made(cls, message)


def _group(members, subclass):
    if subclass:
        base = ExceptionGroup if all(isinstance(m, Exception) for m in members) else BaseExceptionGroup
        cls = type("Group", (base,), {"exceptions": Raises(), "__str__": _str_raising})
        return made(cls, "group", members)
    return BaseExceptionGroup("group", members)


shapes = st.recursive(leaves(), lambda inner: st.builds(_group, st.lists(inner, min_size=1, max_size=4),
                                                        st.booleans()), max_leaves=12)


def _nodes(exc, out):
    out.append(exc)
    if isinstance(exc, BaseExceptionGroup):
        for m in BaseExceptionGroup.__dict__["exceptions"].__get__(exc):
            _nodes(m, out)
    return out


@st.composite
def exceptions(draw):
    """An exception shape whose nodes have causes and contexts among themselves, cycles included."""
    exc = draw(shapes)
    nodes = _nodes(exc, [])
    for node in nodes:
        if draw(st.booleans()):
            node.__cause__ = draw(st.sampled_from(nodes))  # possibly itself, possibly an ancestor
        if draw(st.booleans()):
            node.__context__ = draw(st.sampled_from(nodes))
    return exc


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(exceptions())
def test_c49_property_neither_function_raises_and_every_translation_is_well_formed(exc):
    infrastructure = is_infrastructure(exc)
    assert type(infrastructure) is bool
    for hints in (None, HINTS):
        tr = translate(exc, hints=hints, allowed_args=("amount_cents",))
        well_formed(tr, exc)
        assert find_leaks(tr.message, (hints or NO_HINTS).identifiers) == []
    raw = translate(exc, sanitize=False)  # the naive path may show the error's text, but still answers
    assert type(raw.message) is str and raw.infrastructure is infrastructure
