"""The error translator: one table from exception class / SQLSTATE to what the model is told.

Exception tree of the kit's own errors::

    AgentlabError                   base of every error the kit raises on purpose
    ├── DatabaseUnavailable         (agentlab.runtime.conninfo) no server could be reached or started
    │   └── DatabaseMissing         the server answers, the run's database is gone (dropped)
    ├── HarnessClosed               (agentlab.runtime.harness) a closed harness was asked to run
    ├── ToolError                   a tool refused a call for a reason the model can act on
    │   ├── NotFound                a record named by an argument does not exist (for this tenant)
    │   └── UnknownTool             the model named a tool that does not exist
    └── ProviderError               (agentlab.sim.provider) the payment provider refused or failed

Every other exception is mapped by :data:`RULES`, most specific first, to a :class:`Translation`:
a category, whether it is an *infrastructure* error (the graph's retry policy re-runs the node)
or a *recoverable* one (the model is told and can fix its call), and a model-facing message built
from constant templates. Model-facing text never holds SQL, table, column or constraint names,
DSNs, hosts, secrets or stack traces; the full detail goes to the log and the events table.

:func:`translate` and :func:`is_infrastructure` are total: they answer for every ``BaseException``
and never raise. One that is not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``) is an internal
error, never retried; an error's ``sqlstate``, ``diag`` and ``str()`` are read as data (one of another
type, or whose reading raises, counts as absent); an exception group is judged by its members: it is
infrastructure only when every member is, and is told to the model as its first member that is not.

Sources: PostgreSQL Appendix A "PostgreSQL Error Codes" for the SQLSTATE classes; psycopg's
``psycopg.errors`` for the classes that carry them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

import psycopg

from agentlab.core.messages import (
    EARLIER_CALL_FAILED,
    FAILED_TEMPLATE,
    INFRA_UNAVAILABLE,
    NOT_APPLIED_TEMPLATE,
)


class AgentlabError(Exception):
    """Base of the kit's own errors."""


class ToolError(AgentlabError):
    """Raised by a tool for a reason the model can act on; ``hint`` is model-facing and safe."""

    category: Category

    def __init__(self, hint: str, category: Category | None = None):
        super().__init__(hint)
        self.hint = hint
        if category is not None:
            self.category = category


class Category(str, Enum):
    """What kind of failure a tool call met; the model reacts by category."""

    INVALID_ARGUMENTS = "invalid_arguments"
    NOT_FOUND = "not_found"
    BUSINESS_RULE = "business_rule"
    CONFLICT = "conflict"
    TIMEOUT = "timeout"
    TRANSIENT = "transient"
    NOT_APPLIED = "not_applied"
    REJECTED = "rejected"
    BUDGET = "budget"
    INTERNAL = "internal"


ToolError.category = Category.INTERNAL


class NotFound(ToolError):
    """Raised when a record named by an argument does not exist (or is not visible to this tenant)."""

    category = Category.NOT_FOUND


class UnknownTool(ToolError):
    """Raised when the model calls a tool name that is not in the registry."""

    category = Category.INVALID_ARGUMENTS


class ProviderError(AgentlabError):
    """Raised by the payment provider; see :mod:`agentlab.sim.provider` for the subclasses."""


class ProviderTimeout(ProviderError, TimeoutError):
    """Raised when the provider's answer did not arrive in time; the payment may or may not exist."""


class IdempotencyConflict(ProviderError):
    """Raised when an idempotency key is reused with other parameters (Stripe: ``idempotency_error``)."""


class ProviderUnavailable(ProviderError, ConnectionError):
    """Raised when the provider refused the request before doing any work (HTTP 503)."""


class DomainError(AgentlabError):
    """Raised when a domain or a toolset is wrong (a tool that is not strict, two tools with one name, a
    migration that edits an earlier one, an invariant that raises), before any episode runs."""


class SimulatedCrash(BaseException):
    """Raised by fault injection to stand for a process dying at that point.

    A ``BaseException`` (like ``SystemExit``), so no ``except Exception`` in the code under test
    catches it: transactions roll back as they would when the process dies, and the run stops.
    """


FK_REASON = "a record named by an id does not exist; check the ids."
INTERNAL_REASON = "the tool failed because of an internal error; do not retry this call."
INVALID_ARGUMENTS_REASON = "the arguments are not valid; check every argument."


@dataclass(frozen=True)
class ErrorHints:
    """What a domain adds to the translator (``Domain.error_hints``); the core's texts stay for the rest.

    Attributes:
        constraints: constraint name -> model-facing reason, used when a class-23 violation (SQLSTATE
            23xxx) names that constraint (``diag.constraint_name``).
        sqlstates: SQLSTATE (five characters) -> model-facing reason replacing the core rule's text for
            this domain; category and retrying stay the core's (e.g. billing's ``"23503"`` names its
            look-up tool).
        identifiers: the domain's internal names (tables, columns, constraints) that must never reach
            the model; :func:`find_leaks` flags them on top of the core's own.

    Every text is constant and model-facing: no SQL, table, column or constraint names (checked by
    :meth:`agentlab.core.domain.Domain.validate`).
    """

    constraints: Mapping[str, str] = field(default_factory=dict)
    sqlstates: Mapping[str, str] = field(default_factory=dict)
    identifiers: tuple[str, ...] = ()

    def reason(self, sqlstate: str | None, constraint: str | None, default: str) -> str:
        """The text for an error with ``sqlstate`` naming ``constraint``: the constraint's hint (class 23
        only), else the SQLSTATE's, else ``default`` (the core rule's)."""
        if constraint and (sqlstate or "").startswith("23") and constraint in self.constraints:
            return self.constraints[constraint]
        return self.sqlstates.get(sqlstate or "", default)


NO_HINTS = ErrorHints()


@dataclass(frozen=True)
class Rule:
    """One row of the translation table.

    ``match`` is an exception class (``isinstance``) or a SQLSTATE: five characters for one
    condition, two for a whole class. ``infrastructure`` True means the node is retried.
    """

    match: type[BaseException] | str
    category: Category
    infrastructure: bool
    reason: str
    without_sqlstate: bool = False  # a class rule for errors that carry no SQLSTATE (client side) only

    def matches(self, exc: BaseException) -> bool:
        """Whether this rule is ``exc``'s: by its SQLSTATE (:func:`sqlstate_of`) or its class (``type(exc)``,
        not ``isinstance``, which an error's ``__class__`` could answer for it)."""
        return self._matches(type(exc), sqlstate_of(exc))

    def _matches(self, kind: type, state: str | None) -> bool:
        if isinstance(self.match, str):
            state = state or ""
            return state.startswith(self.match) if len(self.match) == 2 else state == self.match
        if self.without_sqlstate and state:
            return False
        return issubclass(kind, self.match)


RULES: tuple[Rule, ...] = (
    # the transaction was already aborted by an earlier call: never this call's own fault (C09)
    Rule("25P02", Category.NOT_APPLIED, False, EARLIER_CALL_FAILED),
    # class 23: integrity constraints (the schema's last line of defence)
    Rule("23514", Category.BUSINESS_RULE, False, "a value breaks a business rule; change the amount or the record."),
    Rule("23505", Category.CONFLICT, False, "this record already exists; do not create it again."),
    Rule("23503", Category.NOT_FOUND, False, FK_REASON),
    Rule("23502", Category.INVALID_ARGUMENTS, False, "a required value is missing; send every required argument."),
    Rule("23P01", Category.CONFLICT, False, "this record overlaps an existing one; do not create it again."),
    Rule("23", Category.CONFLICT, False, "the change conflicts with existing records; do not send it again as is."),
    # class 22: data exceptions (a value the database cannot take)
    Rule("22P02", Category.INVALID_ARGUMENTS, False, "an argument has the wrong type or format (for example a number sent as quoted text)."),
    Rule("22003", Category.INVALID_ARGUMENTS, False, "a number is out of range; send a smaller value."),
    Rule("22007", Category.INVALID_ARGUMENTS, False, "a date is not valid; use the form YYYY-MM-DD."),
    Rule("22008", Category.INVALID_ARGUMENTS, False, "a date is not valid; use the form YYYY-MM-DD."),
    Rule("22001", Category.INVALID_ARGUMENTS, False, "a text value is too long; send a shorter one."),
    Rule("22", Category.INVALID_ARGUMENTS, False, "an argument has a value that cannot be stored; check every argument."),
    # client-side data errors: a NUL byte or a lone surrogate in a text argument never reaches the server
    Rule(psycopg.DataError, Category.INVALID_ARGUMENTS, False, "an argument contains characters that cannot be stored; remove them."),
    Rule(UnicodeError, Category.INVALID_ARGUMENTS, False, "an argument contains characters that cannot be stored; remove them."),
    # timeouts: a statement that ran too long is told to the model; a busy lock is retried
    Rule("57014", Category.TIMEOUT, False, "the operation took too long and was cancelled; nothing was applied. Try again later."),
    Rule("55P03", Category.TRANSIENT, True, "the record is busy with another operation; nothing was applied. Try again."),
    # passing outages (SQLSTATEs in PASSING_OUTAGES): the graph re-runs the node
    *(Rule(state, Category.TRANSIENT, True, INFRA_UNAVAILABLE) for state in (
        "40001", "40P01", "40000", "40003",  # serialization failure, deadlock, rollback, completion unknown
        "57P01", "57P02", "57P03", "57P05", "57000",  # admin / crash shutdown, cannot connect now, idle session
        "08000", "08003", "08006", "08001", "08004", "08007",  # connection exceptions
        "53000", "53100", "53200", "53300",  # insufficient resources, disk full, out of memory, too many connections
        "25P03", "25P04",  # idle-in-transaction and transaction timeouts
        "55006",  # object in use
    )),
    # permanent server errors: re-running the same batch meets the same error (case C19)
    Rule("40002", Category.CONFLICT, False, "the change conflicts with existing records; do not send it again as is."),
    Rule("54", Category.INVALID_ARGUMENTS, False, "a value is too large for the database to handle; send shorter "
         "values, and each call with a plain, short tool call id."),
    *(Rule(cls, Category.INTERNAL, False, INTERNAL_REASON)
      for cls in ("08", "40", "53", "55", "57", "58", "2F", "38", "39", "3B", "27", "F0", "HV", "25")),
    # class 28: the tool's own credentials were refused; permanent, so neither retried nor fixable by the model
    Rule("28", Category.INTERNAL, False, "the tool cannot reach its database; this is not something you can fix. "
         "Do not retry this call."),
    Rule("42883", Category.INVALID_ARGUMENTS, False, "an argument has the wrong type; check every argument's type."),
    Rule("42804", Category.INVALID_ARGUMENTS, False, "an argument has the wrong type; check every argument's type."),
    Rule("42501", Category.NOT_FOUND, False, "no such record was found; check the ids."),  # privilege / row security
    # client-side infrastructure: lost connections, pool exhaustion, OS-level timeouts
    Rule(psycopg.OperationalError, Category.TRANSIENT, True, INFRA_UNAVAILABLE, without_sqlstate=True),
    Rule(psycopg.InterfaceError, Category.TRANSIENT, True, INFRA_UNAVAILABLE),
    Rule(ConnectionError, Category.TRANSIENT, True, INFRA_UNAVAILABLE),
    Rule(TimeoutError, Category.TRANSIENT, True, INFRA_UNAVAILABLE),
    # everything else is a bug: the model cannot fix it by changing its call
    Rule(psycopg.Error, Category.INTERNAL, False, INTERNAL_REASON),
    Rule(Exception, Category.INTERNAL, False, INTERNAL_REASON),
    # not an Exception at all (KeyboardInterrupt, SystemExit, GeneratorExit, SimulatedCrash): never retried
    Rule(BaseException, Category.INTERNAL, False, INTERNAL_REASON),
)
# What an Exception no other rule names meets; the completeness test fails on any psycopg error that does.
FALLBACK_RULE = next(r for r in RULES if r.match is Exception)

# SQLSTATE classes whose every psycopg error class the table claims to map to a specific rule
# (tests/test_errors.py walks psycopg.errors and fails on any that reaches FALLBACK or psycopg.Error).
COVERED_SQLSTATE_CLASSES = ("08", "22", "23", "25", "27", "28", "2F", "38", "39", "3B", "40", "53", "54", "55", "57",
                            "58", "F0", "HV")
# The SQLSTATEs that are passing outages, retried by the graph (PostgreSQL Appendix A): anything else
# the server reports, an OperationalError included, is permanent for this batch.
PASSING_OUTAGES = frozenset(r.match for r in RULES if isinstance(r.match, str) and r.infrastructure)


@dataclass(frozen=True)
class Translation:
    """What one exception means. ``message`` is model-facing; ``detail`` is for the log only."""

    category: Category
    infrastructure: bool
    message: str
    reason: str
    sqlstate: str | None
    error_class: str
    detail: str
    rule: Rule | None = None


def _pydantic_reason(exc: Any, allowed: tuple[str, ...], identifiers: tuple[str, ...] = ()) -> str:
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


def rules_for(hints: ErrorHints) -> tuple[Rule, ...]:
    """:data:`RULES` as a domain's model is told them: each rule's text replaced by ``hints.sqlstates``."""
    return tuple(replace(r, reason=hints.sqlstates[r.match]) if isinstance(r.match, str) and r.match in hints.sqlstates
                 else r for r in RULES)


def translate(exc: BaseException, *, allowed_args: tuple[str, ...] = (), sanitize: bool = True,
              hints: ErrorHints | None = None) -> Translation:
    """Map ``exc`` to a :class:`Translation`; answers for every ``BaseException`` and never raises.

    An error's own attributes are read as data, never trusted: a ``sqlstate`` that is not a five-character
    text, a ``diag`` or ``str(exc)`` that raises, count as absent. An exception group is translated as
    its first member (depth first) that is not an infrastructure error, the one the model can act on
    (when all are: as its first, retried), under the group's class and with its members in the detail.

    Args:
        exc: what a tool call raised.
        allowed_args: the tool's argument names, listed when the model sent an unknown one.
        sanitize: False reproduces the naive path: the model sees ``"<Class>: <str(exc)>"`` verbatim.
        hints: the domain's texts for its own constraints (``Domain.error_hints``); None: the core's only.
    """
    hints = hints or NO_HINTS
    leaves = _leaves(exc)
    member = _deciding(leaves)
    tr = _translate_one(member, allowed_args, sanitize, hints)
    if member is exc:
        return tr
    members = "; ".join(_detail(m) for m in leaves[:_MEMBERS_SHOWN])
    more = len(leaves) - _MEMBERS_SHOWN
    detail = f"{_detail(exc)} [members: {members}{f'; and {more} more' if more > 0 else ''}]"
    return replace(tr, error_class=_class_name(exc), detail=detail)


def _translate_one(exc: BaseException, allowed_args: tuple[str, ...], sanitize: bool, hints: ErrorHints) -> Translation:
    from pydantic import ValidationError

    sqlstate = sqlstate_of(exc)
    kind = type(exc)
    rule = None
    if issubclass(kind, ValidationError):
        category, infra = Category.INVALID_ARGUMENTS, False
        try:
            reason = _pydantic_reason(exc, allowed_args, hints.identifiers)
        except Exception:  # noqa: BLE001 - a ValidationError of its own making whose errors() fails
            reason = INVALID_ARGUMENTS_REASON
    elif issubclass(kind, ToolError):
        category, infra = _category_of(exc), False
        reason = _text_or_none(_attribute(exc, "hint")) or INTERNAL_REASON
    else:
        rule = next(r for r in RULES if r._matches(kind, sqlstate))  # the last rule matches every BaseException
        category, infra, reason = rule.category, rule.infrastructure, rule.reason
        constraint = _text_or_none(_attribute(_attribute(exc, "diag"), "constraint_name"))
        reason = hints.reason(sqlstate, constraint, reason)
    if category is Category.NOT_APPLIED or infra:
        message = NOT_APPLIED_TEMPLATE.format(reason=reason)
    else:
        message = FAILED_TEMPLATE.format(category=category.value, reason=reason)
    if not sanitize and rule is not None and category is not Category.NOT_APPLIED:
        message = f"{kind.__name__}: {_text(exc)}".strip()
    return Translation(category, infra, message, reason, sqlstate, _class_name(exc), _detail(exc), rule)


def is_infrastructure(exc: BaseException) -> bool:
    """True when ``exc`` is an infrastructure error the graph should retry (the RetryPolicy's ``retry_on``).

    Unlike LangGraph's default ``retry_on``, constraint violations and other data errors are never
    retried: re-running the same call cannot fix them. A ``BaseException`` that is not an ``Exception``
    (``KeyboardInterrupt``, ``SystemExit``) never is. An exception group is one when every member is
    (a group of lost connections); any other member makes it not retryable. Never raises.
    """
    return all(_is_infrastructure_one(m) for m in _leaves(exc))


def _is_infrastructure_one(exc: BaseException) -> bool:
    from pydantic import ValidationError

    kind = type(exc)
    if issubclass(kind, (ValidationError, ToolError)):
        return False
    state = sqlstate_of(exc)
    return next(r for r in RULES if r._matches(kind, state)).infrastructure


def _deciding(leaves: list[BaseException]) -> BaseException:
    """What an exception group (its :func:`_leaves`) is translated as: its first member (depth first) that
    is not an infrastructure error, the one the model can act on; when all are, its first."""
    return next((m for m in leaves if not _is_infrastructure_one(m)), leaves[0])


_MAX_GROUP_DEPTH = 32  # nesting beyond this is read as a member of its own (no real group is that deep)
_MEMBERS_SHOWN = 5  # members of a group named in a translation's detail
_GROUP_MEMBERS = BaseExceptionGroup.__dict__["exceptions"]  # the members as stored, whatever a subclass overrides


def _leaves(exc: BaseException) -> list[BaseException]:
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
    state = _text_or_none(_attribute(exc, "sqlstate"))
    return state if state is not None and _SQLSTATE.fullmatch(state) else None


def _attribute(obj: Any, name: str) -> Any:
    """``getattr(obj, name, None)``, or None when reading it raises (a property of a foreign error class)."""
    try:
        return getattr(obj, name, None)
    except Exception:  # noqa: BLE001 - an attribute that cannot be read is an attribute that is absent
        return None


def _text_or_none(value: Any) -> str | None:
    """``value`` as a plain ``str`` when it is text (a ``str`` subclass is copied, its methods unused), else None."""
    return str.__str__(value) if issubclass(type(value), str) else None


def _text(exc: BaseException) -> str:
    """``str(exc)``, or a note naming its class when that raises."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - an error whose __str__ fails still gets an answer
        return f"<str() of a {type(exc).__name__} raised>"


def _class_name(exc: BaseException) -> str:
    module = _text_or_none(_attribute(type(exc), "__module__")) or "?"
    return f"{module}.{type(exc).__qualname__}"


def _category_of(exc: ToolError) -> Category:
    """A ``ToolError``'s category; one that is not a :class:`Category` (nor a value of one) is INTERNAL."""
    category = _attribute(exc, "category")
    if issubclass(type(category), Category):
        return category
    try:
        return Category(_text_or_none(category))
    except ValueError:
        return Category.INTERNAL


def _detail(exc: BaseException) -> str:
    from agentlab.core.redact import redact

    text = f"{_class_name(exc)}: {_text(exc)}"
    diag = _attribute(exc, "diag")
    if diag is not None:
        extra = {k: _text_or_none(_attribute(diag, k))
                 for k in ("schema_name", "table_name", "column_name", "constraint_name", "context")}
        extra = {k: v for k, v in extra.items() if v}
        if extra:
            text += " " + " ".join(f"{k}={v}" for k, v in extra.items())
    return redact(text)


# --------------------------------------------------------------------------- leak detection

# The core's internal identifiers that must never reach the model; a domain adds its own
# (ErrorHints.identifiers). Tool argument names (customer_id, amount_cents, ...) are the tools' public
# API and are allowed.
INTERNAL_IDENTIFIERS = (
    "tool_executions", "schema_migrations", "idempotency_key", "dedupe_key", "outbox", "checkpoint_blobs",
    "checkpoint_writes", "psycopg",
)
LEAK_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("dsn", re.compile(r"postgres(?:ql)?://|\b(?:password|passwd|pwd|dbname|sslmode|user)\s*=", re.I)),
    ("secret", re.compile(r"\bpassword\b|\bsecret\b|\bsk_(?:live|test)_\w+", re.I)),
    ("host", re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b|\blocalhost\b|\.s\.PGSQL|\bhost\s*=|\bport\s*=", re.I)),
    ("sql", re.compile(r"\b(?:SELECT|INSERT|UPDATE|DELETE)\b[\s\S]{0,120}?\b(?:FROM|INTO|SET|WHERE)\b", re.I)),
    ("sql", re.compile(r"\b(?:LINE \d+:|DETAIL:|CONTEXT:|HINT:)|\b(?:SQLSTATE|syntax for type|violates)\b", re.I)),
    ("identifier", re.compile(r"\b(?:relation|constraint|column|table|schema)\s+\"[^\"]+\"", re.I)),
    ("identifier", re.compile(r"\b(?:public|lax|provider|pg_catalog)\.[A-Za-z_]\w*|\bpg_[a-z_]{3,}")),
    ("stack_trace", re.compile(r"Traceback \(most recent call last\)|File \"[^\"]+\", line \d+")),
)


@functools.lru_cache(maxsize=32)
def _identifier_pattern(identifiers: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile(r"(?<!\w)(?:" + "|".join(re.escape(i) for i in (*INTERNAL_IDENTIFIERS, *identifiers)) + r")(?!\w)",
                      re.I)


def find_leaks(text: str, identifiers: Iterable[str] = ()) -> list[str]:
    """Kinds of leak found in a model-facing ``text`` (empty when clean): dsn, secret, host, sql, identifier,
    stack_trace. ``identifiers``: a domain's internal names (``ErrorHints.identifiers``), flagged as
    identifier leaks on top of the core's :data:`INTERNAL_IDENTIFIERS`."""
    text = text or ""
    kinds = {kind for kind, pattern in LEAK_PATTERNS if pattern.search(text)}
    if _identifier_pattern(tuple(identifiers)).search(text):
        kinds.add("identifier")
    return sorted(kinds)
