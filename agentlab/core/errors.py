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
How an error is read as data is :mod:`agentlab.core.error_reading`; what a ``ValidationError`` tells the
model, :mod:`agentlab.core.argument_errors`; leak detection (``find_leaks``), :mod:`agentlab.core.leaks`
(their names stay importable from here).

Sources: PostgreSQL Appendix A "PostgreSQL Error Codes" for the SQLSTATE classes; psycopg's
``psycopg.errors`` for the classes that carry them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

import psycopg

from agentlab.core.argument_errors import pydantic_reason
from agentlab.core.error_reading import (  # noqa: F401 (sqlstate_of: its home moved; it stays importable here)
    attribute_of,
    class_name,
    detail_of,
    leaves_of,
    sqlstate_of,
    text_of,
    text_or_none,
)
from agentlab.core.leaks import INTERNAL_IDENTIFIERS, LEAK_PATTERNS, find_leaks  # noqa: F401 (their home moved)
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


class ProviderRejected(ProviderError):
    """Raised when the provider refused the request itself, before doing any work (HTTP 400, Stripe's
    ``invalid_request_error``: an amount over its maximum): sending the same request again gets the same answer."""


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


def rules_for(hints: ErrorHints) -> tuple[Rule, ...]:
    """:data:`RULES` as a domain's model is told them: each rule's text replaced by ``hints.sqlstates``."""
    return tuple(replace(r, reason=hints.sqlstates[r.match]) if isinstance(r.match, str) and r.match in hints.sqlstates
                 else r for r in RULES)


_MEMBERS_SHOWN = 5  # members of a group named in a translation's detail


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
    leaves = leaves_of(exc)
    member = _deciding(leaves)
    tr = _translate_one(member, allowed_args, sanitize, hints)
    if member is exc:
        return tr
    members = "; ".join(detail_of(m) for m in leaves[:_MEMBERS_SHOWN])
    more = len(leaves) - _MEMBERS_SHOWN
    detail = f"{detail_of(exc)} [members: {members}{f'; and {more} more' if more > 0 else ''}]"
    return replace(tr, error_class=class_name(exc), detail=detail)


def _translate_one(exc: BaseException, allowed_args: tuple[str, ...], sanitize: bool, hints: ErrorHints) -> Translation:
    from pydantic import ValidationError

    sqlstate = sqlstate_of(exc)
    kind = type(exc)
    rule = None
    if issubclass(kind, ValidationError):
        category, infra = Category.INVALID_ARGUMENTS, False
        try:
            reason = pydantic_reason(exc, allowed_args, hints.identifiers)
        except Exception:  # noqa: BLE001 - a ValidationError of its own making whose errors() fails
            reason = INVALID_ARGUMENTS_REASON
    elif issubclass(kind, ToolError):
        category, infra = _category_of(exc), False
        reason = text_or_none(attribute_of(exc, "hint")) or INTERNAL_REASON
    else:
        rule = next(r for r in RULES if r._matches(kind, sqlstate))  # the last rule matches every BaseException
        category, infra, reason = rule.category, rule.infrastructure, rule.reason
        constraint = text_or_none(attribute_of(attribute_of(exc, "diag"), "constraint_name"))
        reason = hints.reason(sqlstate, constraint, reason)
    if category is Category.NOT_APPLIED or infra:
        message = NOT_APPLIED_TEMPLATE.format(reason=reason)
    else:
        message = FAILED_TEMPLATE.format(category=category.value, reason=reason)
    if not sanitize and rule is not None and category is not Category.NOT_APPLIED:
        message = f"{kind.__name__}: {text_of(exc)}".strip()
    return Translation(category, infra, message, reason, sqlstate, class_name(exc), detail_of(exc), rule)


def is_infrastructure(exc: BaseException) -> bool:
    """True when ``exc`` is an infrastructure error the graph should retry (the RetryPolicy's ``retry_on``).

    Unlike LangGraph's default ``retry_on``, constraint violations and other data errors are never
    retried: re-running the same call cannot fix them. A ``BaseException`` that is not an ``Exception``
    (``KeyboardInterrupt``, ``SystemExit``) never is. An exception group is one when every member is
    (a group of lost connections); any other member makes it not retryable. Never raises.
    """
    return all(_is_infrastructure_one(m) for m in leaves_of(exc))


def _is_infrastructure_one(exc: BaseException) -> bool:
    from pydantic import ValidationError

    kind = type(exc)
    if issubclass(kind, (ValidationError, ToolError)):
        return False
    state = sqlstate_of(exc)
    return next(r for r in RULES if r._matches(kind, state)).infrastructure


def _deciding(leaves: list[BaseException]) -> BaseException:
    """What an exception group (its :func:`leaves_of`) is translated as: its first member (depth first) that
    is not an infrastructure error, the one the model can act on; when all are, its first."""
    return next((m for m in leaves if not _is_infrastructure_one(m)), leaves[0])


def _category_of(exc: ToolError) -> Category:
    """A ``ToolError``'s category; one that is not a :class:`Category` (nor a value of one) is INTERNAL."""
    category = attribute_of(exc, "category")
    if issubclass(type(category), Category):
        return category
    try:
        return Category(text_or_none(category))
    except ValueError:
        return Category.INTERNAL
