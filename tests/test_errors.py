"""The error translator: completeness over psycopg's classes, sanitized texts, and case C13."""

from __future__ import annotations

import inspect
import logging

import psycopg
from psycopg import errors as pgerr

from agentlab.core import errors
from agentlab.core.errors import (
    COVERED_SQLSTATE_CLASSES,
    FALLBACK_RULE,
    RULES,
    Category,
    find_leaks,
    is_infrastructure,
    translate,
)
from agentlab.core.safeguards import preset
from agentlab.core.tools_node import Outcome, TransactionalToolsNode
from agentlab.core.toolspec import Toolset, ToolSpec
from agentlab.domains import billing
from agentlab.domains.billing import errors as billing_errors
from agentlab.domains.billing.tools import LookupCustomer
from conftest import fetch

GENERIC = {FALLBACK_RULE, next(r for r in RULES if r.match is psycopg.Error)}


def psycopg_error_classes():
    for _, cls in inspect.getmembers(pgerr, inspect.isclass):
        if issubclass(cls, psycopg.Error) and getattr(cls, "sqlstate", None):
            yield cls


def test_every_psycopg_error_in_a_covered_class_has_a_specific_rule():
    unmapped = []
    for cls in psycopg_error_classes():
        if cls.sqlstate[:2] in COVERED_SQLSTATE_CLASSES:
            exc = cls("x")
            rule = next(r for r in RULES if r.matches(exc))
            if rule in GENERIC:
                unmapped.append(f"{cls.__name__} {cls.sqlstate}")
    assert unmapped == []


def test_covered_classes_are_really_present_in_psycopg():
    present = {cls.sqlstate[:2] for cls in psycopg_error_classes()}
    assert set(COVERED_SQLSTATE_CLASSES) <= present


def test_constraint_violations_are_never_retried_but_lost_connections_are():
    assert not is_infrastructure(pgerr.UniqueViolation("dup"))
    assert not is_infrastructure(pgerr.CheckViolation("check"))
    assert not is_infrastructure(pgerr.QueryCanceled("statement timeout"))
    assert is_infrastructure(pgerr.AdminShutdown("terminating connection"))
    assert is_infrastructure(pgerr.LockNotAvailable("lock timeout"))
    assert is_infrastructure(pgerr.SerializationFailure("could not serialize"))
    assert is_infrastructure(psycopg.OperationalError("server closed the connection unexpectedly"))
    assert is_infrastructure(ConnectionError("reset"))


def test_aborted_transaction_is_not_the_calls_own_fault():
    tr = translate(pgerr.InFailedSqlTransaction("current transaction is aborted"))
    assert tr.category is Category.NOT_APPLIED
    assert tr.message.startswith("NOT APPLIED: an earlier call in this batch failed")


def test_every_model_facing_constant_is_leak_free():
    hints = billing_errors.HINTS
    texts = [r.reason for r in RULES] + [r.reason for r in billing_errors.RULES]
    texts += [*hints.constraints.values(), *hints.sqlstates.values()]
    texts += [getattr(errors, n) for n in dir(errors) if n.isupper() and isinstance(getattr(errors, n), str)
              and n not in ("FAILED_PREFIX", "NOT_APPLIED_PREFIX")]
    assert [t for t in texts if find_leaks(t, hints.identifiers)] == []


class _Diag:
    def __init__(self, constraint_name):
        self.constraint_name = constraint_name


def _with_constraint(cls, constraint: str) -> psycopg.Error:
    """A ``cls`` error whose diagnostics name ``constraint``, as the server's would."""
    return type(cls.__name__, (cls,), {"diag": _Diag(constraint)})("violates constraint")


def test_the_core_knows_no_domain_and_billing_brings_its_own_hints():
    over = _with_constraint(pgerr.CheckViolation, "customers_credit_nonnegative")
    dup = _with_constraint(pgerr.UniqueViolation, "invoices_one_per_period")
    fk = _with_constraint(pgerr.ForeignKeyViolation, "credit_memos_invoice_fk")
    # the core alone: its generic texts, and no billing name in them
    assert translate(over).reason == "a value breaks a business rule; change the amount or the record."
    assert translate(dup).reason == "this record already exists; do not create it again."
    assert translate(fk).reason == "a record named by an id does not exist; check the ids."
    assert all("LookupCustomer" not in r.reason for r in RULES)
    # billing's domain value carries the hints the node translates with
    hints = billing.DOMAIN.error_hints
    assert hints is billing_errors.HINTS
    assert translate(over, hints=hints).reason.startswith("the customer's credit balance is too low")
    assert translate(dup, hints=hints).reason.startswith("an invoice for this customer and billing period")
    assert "LookupCustomer" in translate(fk, hints=hints).reason
    assert translate(over, hints=hints).category is Category.BUSINESS_RULE  # the text changes, never the rule
    # a constraint billing does not name keeps the core's text
    other = _with_constraint(pgerr.UniqueViolation, "outbox_dedupe_key_unique")
    assert translate(other, hints=hints).reason == "this record already exists; do not create it again."
    # billing's internal names are flagged only with billing's identifiers
    assert find_leaks("SELECT-free text naming credit_cents") == []
    assert find_leaks("SELECT-free text naming credit_cents", hints.identifiers) == ["identifier"]


def test_raw_errors_are_caught_by_the_leak_detector():
    raw = ('UniqueViolation: duplicate key value violates unique constraint "invoices_one_per_period"\n'
           "DETAIL:  Key (customer_id, billing_period)=(1, 2026-03-01) already exists.")
    assert "sql" in find_leaks(raw) and "identifier" in find_leaks(raw)
    assert "dsn" in find_leaks("could not connect to postgresql://app:hunter2@db.internal:5432/prod")
    assert find_leaks("FAILED [conflict]: an invoice for this customer and billing period already exists") == []


SECRET_ERROR = (
    "connection to postgresql://billing_admin:s3cr3t-pw@db-primary.internal:5432/prod failed while running "
    "SELECT credit_cents FROM customers WHERE id = 7"
)


async def _explode(conn, args, ctx):
    raise RuntimeError(SECRET_ERROR)


async def test_c13_a_secret_in_an_error_reaches_the_log_not_the_model(harness, monkeypatch, caplog):
    exploding = Toolset([ToolSpec("LookupCustomer", LookupCustomer, _explode, writes=False)])
    node = TransactionalToolsNode(harness.pool, preset("full"), toolset=exploding, events=harness.events)
    with caplog.at_level(logging.INFO, logger="agentlab.core.events"):
        batch = await node.run_batch([{"name": "LookupCustomer", "args": {"customer_id": 7}, "id": "call_secret",
                                       "type": "tool_call"}], thread_id="t-c13", tenant_id="acme")
    await harness.events.flush()
    (result,) = batch.results
    assert result.outcome is Outcome.FAILED
    assert result.content.startswith("FAILED [internal]: ")
    for secret in ("s3cr3t", "db-primary", "internal:5432", "SELECT", "credit_cents", "customers", "postgresql://"):
        assert secret not in result.content
    assert find_leaks(result.content) == []
    rows = await fetch(harness, "SELECT detail, error_class FROM events WHERE tool_call_id = 'call_secret'")
    (detail, error_class), = rows
    assert "SELECT credit_cents FROM customers" in detail and "db-primary.internal" in detail
    assert "s3cr3t" not in detail and "***" in detail  # the password is redacted even in the log
    assert error_class == "builtins.RuntimeError"
    logged = [r for r in caplog.records if getattr(r, "agentlab_event", {}).get("tool_call_id") == "call_secret"]
    assert logged and "SELECT credit_cents" in logged[0].agentlab_event["detail"]


def test_postgres_report_labels_are_caught_by_the_leak_detector():
    assert find_leaks('date/time field value out of range: "2026-02-30"\nCONTEXT:  unnamed portal parameter $1') == ["sql"]
    assert find_leaks("LINE 1: UPDATE x") == ["sql"]
    assert find_leaks("DETAIL:  Key (a)=(1) already exists.") == ["sql"]
    assert find_leaks("HINT:  No operator matches the given name") == ["sql"]
    assert find_leaks("FAILED [invalid_arguments]: a date is not valid; use the form YYYY-MM-DD.") == []


def test_redact_hides_a_password_holding_an_unencoded_at_sign():
    from agentlab.core.redact import redact

    out = redact("cannot connect to postgresql://postgres:pa@ss@db.internal:5432/app (refused)")
    assert "ss@" not in out
    assert out == "cannot connect to postgresql://postgres:***@db.internal:5432/app (refused)"
