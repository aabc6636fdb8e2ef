"""Case C19: a permanent server error treated as a passing outage.

A tool call id of 6,000 characters made the ledger INSERT fail with SQLSTATE 54000 ("index row size
exceeds btree maximum"); psycopg maps it to ``OperationalError``, the translator called it
infrastructure and the node was retried, the model told "temporarily unavailable". Now an
``OperationalError`` that carries a SQLSTATE is classified by its SQLSTATE; only the passing outages
of :data:`agentlab.core.errors.PASSING_OUTAGES` are retried. An over-long id is refused before any SQL,
and a 54000 the server does raise (a thread id too long for the ledger's key) is ``FAILED
[invalid_arguments]`` for its call, not a retry."""

from __future__ import annotations

import dataclasses
import inspect
import secrets

import psycopg
import pytest
from psycopg import errors as pgerr

from agentlab.core.errors import PASSING_OUTAGES, is_infrastructure, translate
from agentlab.core.messages import CALL_ID_TOO_LONG, NOT_APPLIED_PREFIX
from agentlab.core.safeguards import preset
from conftest import scalar

# From PostgreSQL's Appendix A, read independently of the translator: the conditions that pass by
# themselves (a lost or refused connection, a shutdown or restart, a serialization failure or deadlock,
# exhausted resources, a busy lock or object, a session / transaction timeout).
OUTAGES_BY_THE_DOCS = {
    "08000", "08003", "08006", "08001", "08004", "08007", "40000", "40001", "40003", "40P01",
    "53000", "53100", "53200", "53300", "55006", "55P03", "57000", "57P01", "57P02", "57P03", "57P05",
    "25P03", "25P04",
}
NEVER_PASSING_CLASSES = ("54", "58", "2F", "38", "39", "3B", "27", "F0", "HV")
CREDIT = "SELECT credit_cents FROM customers WHERE id = 1"


def server_error_classes():
    for _, cls in inspect.getmembers(pgerr, inspect.isclass):
        if issubclass(cls, psycopg.Error) and getattr(cls, "sqlstate", None):
            yield cls


def test_c19_every_error_called_infrastructure_really_is_a_passing_outage():
    retried = {cls.sqlstate for cls in server_error_classes() if is_infrastructure(cls("x"))}
    assert retried <= OUTAGES_BY_THE_DOCS, sorted(retried - OUTAGES_BY_THE_DOCS)
    assert PASSING_OUTAGES <= OUTAGES_BY_THE_DOCS
    assert {"08006", "40001", "40P01", "55P03", "57P01"} <= retried  # and the real outages still are


def test_c19_permanent_classes_are_never_retried():
    permanent = [cls for cls in server_error_classes() if cls.sqlstate[:2] in NEVER_PASSING_CLASSES]
    assert {cls.sqlstate[:2] for cls in permanent} == set(NEVER_PASSING_CLASSES)
    assert [cls.__name__ for cls in permanent if is_infrastructure(cls("x"))] == []
    assert [c.__name__ for c in (pgerr.DatabaseDropped, pgerr.ProtocolViolation, pgerr.ConfigurationLimitExceeded)
            if is_infrastructure(c("x"))] == []
    tr = translate(pgerr.ProgramLimitExceeded("index row size 6016 exceeds btree version 4 maximum 2704"))
    assert (tr.category.value, tr.infrastructure) == ("invalid_arguments", False)
    assert tr.message.startswith("FAILED [invalid_arguments]") and "index" not in tr.message

    class UnknownOperational(psycopg.OperationalError):  # an OperationalError with a SQLSTATE no rule names
        sqlstate = "5ZZZZ"

    assert not is_infrastructure(UnknownOperational("x"))
    assert is_infrastructure(psycopg.OperationalError("server closed the connection unexpectedly"))  # no SQLSTATE


def calls(first_id: str) -> list[dict]:
    return [{"name": "ApplyCredit", "args": {"customer_id": 1, "amount_cents": 300}, "id": first_id, "type": "tool_call"},
            {"name": "LookupCustomer", "args": {"customer_id": 1}, "id": "call_b", "type": "tool_call"}]


async def test_c19_a_6000_character_call_id_is_refused_once_without_retry(harness):
    node = harness.node(preset("full"))
    batch = await node.run_batch(calls("call_" + "x" * 5995), thread_id="t-c19", tenant_id="acme", attempt=1)

    assert batch.results[0].content == f"FAILED [invalid_arguments]: {CALL_ID_TOO_LONG}"
    assert batch.results[1].content.startswith(NOT_APPLIED_PREFIX)  # atomic policy: the sibling is not applied
    assert await scalar(harness, CREDIT) == 5000
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 0


async def test_c19_a_real_54000_from_the_ledger_fails_its_call_and_is_not_retried(harness):
    # full without isolation and with no tenant: the ledger INSERT is the first statement to index the thread
    node = harness.node(dataclasses.replace(preset("full"), isolation=False))
    thread = "t-c19-" + secrets.token_hex(1800)  # 3,606 incompressible characters: the key's index row is too big
    # final_attempt=False: an error classified as infrastructure would be raised here for the graph to retry
    batch = await node.run_batch(calls("call_a"), thread_id=thread, attempt=1)

    assert [r.category for r in batch.results] == ["invalid_arguments", "not_applied"]
    assert batch.results[0].translation.sqlstate == "54000"
    assert batch.results[0].content.startswith("FAILED [invalid_arguments]: a value is too large")
    assert batch.rolled_back


async def test_c19_under_full_a_thread_id_too_long_for_the_index_is_permanent_not_retried(harness):
    """Under full the thread's tenant binding indexes the thread id first: a batch-level 54000, raised
    (the run fails once with the server's error) instead of being retried as an outage."""
    node = harness.node(preset("full"))
    with pytest.raises(pgerr.ProgramLimitExceeded) as raised:
        await node.run_batch(calls("call_a"), thread_id="t-c19-" + secrets.token_hex(1800), tenant_id="acme")
    assert not is_infrastructure(raised.value)
    assert await scalar(harness, CREDIT) == 5000
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 0
    assert await scalar(harness, CREDIT) == 5000
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 0
