"""C43 (and the guard's share of C44, C45): a tool handler that ends, escapes or outlives the batch's transaction.

A user's tool runs ``COMMIT`` (or ``ROLLBACK``, ``END``, ``conn.commit()``, a hand-written ``RELEASE``, a
session-level ``SET``, ``SET ROLE``...) on the connection it is given, between two valid calls of one batch.
Whatever it tries, no call is reported other than as it is stored, the offending call is FAILED and its
error names the tool and the rule; under the atomic policy nothing of the batch commits. Checked on both
strategies (the reference and the pipelined one) and read back from the database.
"""

from __future__ import annotations

import pytest
from psycopg import sql

from agentlab.core.batch import Outcome, PipelinedStrategy, SavepointStrategy, TransactionalToolsNode
from agentlab.core.batch.guard import (
    ENDS_TRANSACTION,
    ESCAPES_ROLE,
    ESCAPES_SAVEPOINT,
    LEAVES_SESSION_STATE,
    HandlerContractViolation,
    broken_rule,
)
from agentlab.core.errors import find_leaks
from agentlab.core.safeguards import Policy, preset
from agentlab.core.toolspec import StrictArgs, Toolset, tool
from agentlab.domains.billing.tools import TOOLS

CREDIT = "SELECT credit_cents FROM customers WHERE id = 1"
MEMOS = "SELECT count(*) FROM credit_memos WHERE customer_id = 1"
LEDGER = "SELECT count(*) FROM tool_executions WHERE thread_id = %s"


class Misbehave(StrictArgs):
    """A user's tool whose handler does something with the batch's connection it must not."""

    customer_id: int


def misbehaving(action):
    async def handler(conn, args, ctx):
        await conn.execute("UPDATE customers SET credit_cents = credit_cents - 7 WHERE id = %s", (args["customer_id"],))
        await action(conn)
        return {"ok": True}
    return handler


ACTIONS = {
    "COMMIT": lambda conn: conn.execute("COMMIT"),
    "ROLLBACK": lambda conn: conn.execute("ROLLBACK"),
    "end; (lower case, a comment first)": lambda conn: conn.execute("/* done */ end;"),
    "conn.commit()": lambda conn: conn.commit(),
    "conn.rollback()": lambda conn: conn.rollback(),
    "sql.SQL COMMIT": lambda conn: conn.execute(sql.SQL("COMMIT")),
    "a cursor's COMMIT": lambda conn: _cursor(conn, "COMMIT"),
    "the cursor's connection": lambda conn: _via_cursor_connection(conn),
    "RELEASE tool_call": lambda conn: conn.execute('RELEASE "tool_call"'),
    "ROLLBACK TO tool_call": lambda conn: conn.execute('ROLLBACK TO SAVEPOINT "tool_call"'),
    "SELECT 1; COMMIT": lambda conn: conn.execute("SELECT 1; COMMIT"),
}
RULES = {"RELEASE tool_call": ESCAPES_SAVEPOINT, "ROLLBACK TO tool_call": ESCAPES_SAVEPOINT}


async def _cursor(conn, text):
    async with conn.cursor() as cur:
        await cur.execute(text)


async def _via_cursor_connection(conn):
    cur = await conn.execute("SELECT 1")
    await cur.connection.commit()


def node_for(h, action, policy, strategy):
    toolset = Toolset([*TOOLS.values(), tool(Misbehave, misbehaving(action), writes=True)])
    return TransactionalToolsNode(h.pool, preset("full").replace(policy=policy), toolset=toolset, provider=h.provider,
                                  events=h.events, error_hints=h.domain.error_hints, strategy=strategy)


def batch(reference: str = "RMA-43"):
    return [
        {"name": "CreateCreditMemo", "args": {"customer_id": 1, "amount_cents": 1000, "reference": reference},
         "id": "memo", "type": "tool_call"},
        {"name": "Misbehave", "args": {"customer_id": 1}, "id": "bad", "type": "tool_call"},
        {"name": "ApplyCredit", "args": {"customer_id": 1, "amount_cents": 1000}, "id": "apply", "type": "tool_call"},
    ]


async def one(h, query, params=()):
    async with h.pool.connection() as conn:
        return (await (await conn.execute(query, params)).fetchone())[0]


@pytest.mark.parametrize("strategy", [SavepointStrategy(), PipelinedStrategy()], ids=["reference", "pipelined"])
@pytest.mark.parametrize("policy", [Policy.ATOMIC, Policy.PARTIAL])
@pytest.mark.parametrize("what", list(ACTIONS))
async def test_c43_a_handler_that_ends_the_transaction_is_refused_and_every_call_reported_as_stored(
        harness, what, policy, strategy, caplog):
    h = harness
    thread = f"t-c43-{policy.value}"
    result = await node_for(h, ACTIONS[what], policy, strategy).run_batch(batch(), thread_id=thread, tenant_id="acme")
    outcomes = [r.outcome for r in result.results]
    credit, memos, ledger = await one(h, CREDIT), await one(h, MEMOS), await one(h, LEDGER, (thread,))
    assert outcomes[1] is Outcome.FAILED
    assert result.results[1].category == "internal" and "Misbehave" in result.results[1].content
    assert find_leaks(result.results[1].content) == []
    if policy is Policy.ATOMIC:
        assert outcomes == [Outcome.NOT_APPLIED, Outcome.FAILED, Outcome.NOT_APPLIED]
        assert (credit, memos, ledger) == (5000, 0, 0), "under atomic nothing of the batch commits"  # nor its 7
    else:
        assert outcomes == [Outcome.APPLIED, Outcome.FAILED, Outcome.APPLIED]
        assert (credit, memos, ledger) == (4000, 1, 2), "partial: the applied calls, not the refused call's 7"
    detail = " ".join(str(r.translation.detail) for r in result.results if r.translation)
    assert "Misbehave" in detail and RULES.get(what, ENDS_TRANSACTION) in detail


@pytest.mark.parametrize("statement, rule", [
    ("SET search_path TO lax, public", LEAVES_SESSION_STATE),
    ("SET statement_timeout = 0", LEAVES_SESSION_STATE),
    ("RESET ALL", LEAVES_SESSION_STATE),
    ("DISCARD ALL", LEAVES_SESSION_STATE),
    ("SET ROLE postgres", ESCAPES_ROLE),
    ("RESET ROLE", ESCAPES_ROLE),
    ("SET LOCAL ROLE postgres", ESCAPES_ROLE),
    ("select set_config('role', 'postgres', true)", ESCAPES_ROLE),
    ("SET LOCAL agentlab.tenant_id = 'globex'", ESCAPES_ROLE),
    ("SELECT set_config('agentlab.tenant_id', 'globex', true)", ESCAPES_ROLE),
    ("BEGIN", ESCAPES_SAVEPOINT),
    ("SAVEPOINT mine", ESCAPES_SAVEPOINT),
    ("PREPARE TRANSACTION 'x'", ENDS_TRANSACTION),
    ("abort", ENDS_TRANSACTION),
])
def test_c43_the_guard_names_the_rule_of_each_statement_it_refuses(statement, rule):
    assert broken_rule(statement) == rule
    assert HandlerContractViolation("T", rule, statement).rule == rule


@pytest.mark.parametrize("statement", [
    "SELECT 1", "SET LOCAL statement_timeout = '1s'", "SET CONSTRAINTS ALL DEFERRED", "UPDATE t SET endpoint = 1",
    "select 'x; commit'", "select $$; commit$$", "-- commit\nselect 1", "WITH c AS (SELECT 1) SELECT * FROM c",
    "SELECT set_config('app.note', 'x', true)", "PREPARE p AS SELECT 1",
])
def test_c43_the_guard_lets_ordinary_statements_through(statement):
    assert broken_rule(statement) is None


async def test_c43_a_handler_may_nest_its_own_block_with_conn_transaction(harness):
    """The supported way to nest: psycopg's ``conn.transaction()`` inside the call's savepoint."""
    async def nested(conn):
        async with conn.transaction():
            await conn.execute("UPDATE customers SET credit_cents = credit_cents - 1 WHERE id = 1")

    for strategy in (SavepointStrategy(), PipelinedStrategy()):
        result = await node_for(harness, nested, Policy.ATOMIC, strategy).run_batch(
            batch(type(strategy).__name__), thread_id=f"t-c43-nest-{type(strategy).__name__}", tenant_id="acme")
        assert [r.outcome for r in result.results] == [Outcome.APPLIED] * 3
    assert await one(harness, CREDIT) == 5000 - 2 * (1000 + 7 + 1)


async def test_c43_a_commit_behind_the_guards_back_is_reported_as_stored(harness):
    """A handler that reaches the raw connection (a private attribute) and commits: the reference strategy
    sees the transaction gone after the handler, stops, and reports each call as the ledger says it is
    stored: the memo committed by the handler's COMMIT is APPLIED, the handler's call FAILED, the last call
    NOT APPLIED (it never ran)."""
    async def behind_the_guard(conn):
        await conn._target.execute("COMMIT")

    node = node_for(harness, behind_the_guard, Policy.ATOMIC, SavepointStrategy())
    result = await node.run_batch(batch(), thread_id="t-c43-behind", tenant_id="acme")
    assert [r.outcome for r in result.results] == [Outcome.APPLIED, Outcome.FAILED, Outcome.NOT_APPLIED]
    assert (await one(harness, MEMOS), await one(harness, LEDGER, ("t-c43-behind",))) == (1, 1)
    assert "Misbehave" in result.results[1].translation.detail
