"""Hostile input: generated batches of tool calls through the ``full`` node, on one database.

Arguments of every wrong type, huge and negative numbers, unicode, quotes, SQL fragments, missing and
extra keys, duplicated and missing call ids, unknown tools. For every batch: no exception escapes,
every distinct call id gets exactly one answer in call order, no answer leaks, and the batch is never
partial: either every call is applied (one ledger row each) or nothing changed in the database.

``AGENTLAB_HYPOTHESIS_EXAMPLES`` sets the number of examples (default 2000).
"""

from __future__ import annotations

import asyncio
import itertools
import os

from hostile import batches, quiet_events  # noqa: F401  (an autouse fixture)
from hypothesis import HealthCheck, given, settings

from agentlab.core.batch import Outcome
from agentlab.core.errors import find_leaks
from agentlab.core.safeguards import preset
from agentlab.runtime import db
from agentlab.runtime.harness import Harness

EXAMPLES = int(os.environ.get("AGENTLAB_HYPOTHESIS_EXAMPLES", "2000"))

SNAPSHOT = """
SELECT (SELECT coalesce(sum(credit_cents), 0) FROM customers),
       (SELECT count(*) FROM invoices), (SELECT count(*) FROM credit_memos), (SELECT count(*) FROM refunds),
       (SELECT count(*) FROM outbox), (SELECT count(*) FROM tool_executions)
"""
LEDGER_ROWS = "SELECT count(*) FROM tool_executions WHERE thread_id = %s"


async def snapshot(h: Harness) -> tuple:
    async with h.pool.connection() as conn:
        return await (await conn.execute(SNAPSHOT)).fetchone()


async def run_one(h: Harness, node, calls: list[dict], thread_id: str) -> None:
    before = await snapshot(h)
    result = await node.run_batch(calls, thread_id=thread_id, tenant_id="acme", final_attempt=True)  # raises: fails

    distinct = list(dict.fromkeys(str(c.get("id") or "") for c in calls))
    assert [r.call_id for r in result.results] == distinct, "one answer per distinct call id, in call order"
    messages = result.messages
    assert [m.tool_call_id for m in messages] == distinct
    for m in messages:
        assert m.content, "an answer is never empty"
        assert find_leaks(str(m.content)) == [], f"leak in {m.content!r}"

    applied = [r for r in result.results if r.outcome in (Outcome.APPLIED, Outcome.REPLAYED)]
    async with h.pool.connection() as conn:
        ledger = (await (await conn.execute(LEDGER_ROWS, (thread_id,))).fetchone())[0]
    if len(applied) == len(result.results):
        assert not result.rolled_back and ledger == len(result.results)
    else:
        assert not applied, "atomic policy: a batch with a failure has no applied call"
        assert result.rolled_back and ledger == 0
        assert await snapshot(h) == before, "a rolled-back batch leaves the database unchanged"


def test_hostile_batches_through_the_full_node():
    url = db.create_database("hostile")
    try:
        with asyncio.Runner() as runner:
            h = runner.run(Harness.open(url))
            try:
                async def customers() -> list[int]:
                    async with h.pool.connection() as conn:
                        cur = await conn.execute(
                            "INSERT INTO customers (tenant_id, name, credit_cents) "
                            "SELECT 'acme', 'Hostile ' || g, 100000 FROM generate_series(1, 3) g RETURNING id")
                        return [r[0] for r in await cur.fetchall()]

                ids = runner.run(customers())
                node = h.node(preset("full"))
                counter = itertools.count()
                examples = itertools.count()

                @settings(max_examples=EXAMPLES, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
                @given(calls=batches(ids))
                def check(calls):
                    next(examples)
                    runner.run(run_one(h, node, calls, f"t-hostile-{next(counter)}"))

                check()
                assert next(examples) >= EXAMPLES  # the examples really ran
            finally:
                runner.run(h.close())
    finally:
        db.drop_database(url)


async def test_a_call_id_postgres_cannot_store_is_refused_not_raised(harness):
    """Found by the test above: a NUL byte or a lone surrogate in a tool call id made the batch's ledger
    look-up raise, so no call was answered. Such an id is now refused before any SQL, like a duplicate."""
    node = harness.node(preset("full"))
    for bad in ("a\x00b", "\ud800"):
        calls = [{"name": "LookupCustomer", "args": {"customer_id": 1}, "id": bad, "type": "tool_call"},
                 {"name": "ApplyCredit", "args": {"customer_id": 1, "amount_cents": 100}, "id": "ok", "type": "tool_call"}]
        result = await node.run_batch(calls, thread_id="t-bad-id", tenant_id="acme")
        assert [r.outcome for r in result.results] == [Outcome.FAILED, Outcome.NOT_APPLIED]
        assert "cannot be stored" in result.results[0].content
    async with harness.pool.connection() as conn:
        credit = (await (await conn.execute("SELECT credit_cents FROM customers WHERE id = 1")).fetchone())[0]
    assert credit == 5000
