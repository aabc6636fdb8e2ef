"""The error translator: one table from exception class / SQLSTATE to what the model is told.

Exception tree of the kit's own errors::

    AgentlabError                   base of every error the kit raises on purpose
    ├── DatabaseUnavailable         (agentlab.runtime.db) no server could be reached or started
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
    FAILED_TEMPLATE, NOT_APPLIED_TEMPLATE, EARLIER_CALL_FAILED, INFRA_UNAVAILABLE,
)


class AgentlabError(Exception):
    """Base of the kit's own errors."""


class ToolError(AgentlabError):
    """Raised by a tool for a reason the model can act on; ``hint`` is model-facing and safe."""

    category: "Category"

    def __init__(self, hint: str, category: "Category | None" = None):
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
        if isinstance(self.match, str):
            state = getattr(exc, "sqlstate", None) or ""
            return state.startswith(self.match) if len(self.match) == 2 else state == self.match
        if self.without_sqlstate and getattr(exc, "sqlstate", None):
            return False
        return isinstance(exc, self.match)


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
    *(Rule(cls, Category.INTERNAL, False, "the tool failed because of an internal error; do not retry this call.")
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
    Rule(psycopg.Error, Category.INTERNAL, False, "the tool failed because of an internal error; do not retry this call."),
    Rule(Exception, Category.INTERNAL, False, "the tool failed because of an internal error; do not retry this call."),
)
FALLBACK_RULE = RULES[-1]

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
    """Map ``exc`` to a :class:`Translation`.

    Args:
        exc: what a tool call raised.
        allowed_args: the tool's argument names, listed when the model sent an unknown one.
        sanitize: False reproduces the naive path: the model sees ``"<Class>: <str(exc)>"`` verbatim.
        hints: the domain's texts for its own constraints (``Domain.error_hints``); None: the core's only.
    """
    hints = hints or NO_HINTS
    from pydantic import ValidationError

    sqlstate = getattr(exc, "sqlstate", None)
    error_class = f"{type(exc).__module__}.{type(exc).__qualname__}"
    detail = _detail(exc)
    if isinstance(exc, ValidationError):
        reason = _pydantic_reason(exc, allowed_args, hints.identifiers)
        rule, category, infra = None, Category.INVALID_ARGUMENTS, False
    elif isinstance(exc, ToolError):
        rule, category, infra, reason = None, exc.category, False, exc.hint
    else:
        rule = next(r for r in RULES if r.matches(exc))
        category, infra, reason = rule.category, rule.infrastructure, rule.reason
        constraint = getattr(getattr(exc, "diag", None), "constraint_name", None)
        reason = hints.reason(sqlstate, constraint, reason)
    if category is Category.NOT_APPLIED or infra:
        message = NOT_APPLIED_TEMPLATE.format(reason=reason)
    else:
        message = FAILED_TEMPLATE.format(category=category.value, reason=reason)
    if not sanitize and not isinstance(exc, (ValidationError, ToolError)) and category is not Category.NOT_APPLIED:
        message = f"{type(exc).__name__}: {exc}".strip()
    return Translation(category, infra, message, reason, sqlstate, error_class, detail, rule)


def is_infrastructure(exc: BaseException) -> bool:
    """True when ``exc`` is an infrastructure error the graph should retry (the RetryPolicy's ``retry_on``).

    Unlike LangGraph's default ``retry_on``, constraint violations and other data errors are never
    retried: re-running the same call cannot fix them.
    """
    from pydantic import ValidationError

    if isinstance(exc, (ValidationError, ToolError)):
        return False
    return next(r for r in RULES if r.matches(exc)).infrastructure


def _detail(exc: BaseException) -> str:
    from agentlab.core.redact import redact

    text = f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"
    diag = getattr(exc, "diag", None)
    if diag is not None:
        extra = {
            k: getattr(diag, k, None)
            for k in ("schema_name", "table_name", "column_name", "constraint_name", "context")
        }
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
