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
import logging
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentlab.runtime import db
from agentlab.core.errors import find_leaks
from agentlab.runtime.harness import Harness
from agentlab.core.tools_node import Outcome
from agentlab.core.safeguards import preset
from agentlab.domains.billing.tools import TOOLS

EXAMPLES = int(os.environ.get("AGENTLAB_HYPOTHESIS_EXAMPLES", "2000"))

SNAPSHOT = """
SELECT (SELECT coalesce(sum(credit_cents), 0) FROM customers),
       (SELECT count(*) FROM invoices), (SELECT count(*) FROM credit_memos), (SELECT count(*) FROM refunds),
       (SELECT count(*) FROM outbox), (SELECT count(*) FROM tool_executions)
"""
LEDGER_ROWS = "SELECT count(*) FROM tool_executions WHERE thread_id = %s"

HOSTILE_TEXT = [
    "42", "1e3", "3.5", "-5", "7'", "12'", "' OR 1=1 --", "1; DROP TABLE customers; --", "$1", "%s", "%(x)s", "{}",
    "\x00", "nul\x00byte", "💸💸", "ʻOkina ñ 中文", "\u202eevil", "2026-02-30", "03/01/2026", "2026-03-01", "NaN",
    "Infinity", "RMA-1042", "a" * 300, "tenant_id", "customers_credit_nonnegative", "postgresql://u:secret@db:5432/x",
    "SELECT * FROM pg_shadow", "\\", "\"", "'", "true", "null", "lone \ud800 surrogate",
]
HOSTILE_KEYS = ["amout_cents", "tenant_id", "id", "customer", "customerId", "amount", "__proto__", "'; --",
                "credit_cents", "", "💸"]

scalars = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63 - 1, 2**63, -(2**63), 10**30, 1_000_000_000, 1_000_000_001]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=24),
    st.sampled_from(HOSTILE_TEXT),
)
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=6), scalars, max_size=2))


def plausible(customer_ids: list[int], *, hostile: bool = True):
    """Arguments for a real tool. Clean: every value well formed, so the batch reaches the SQL and meets
    the database's own refusals (CHECK when credit runs out, UNIQUE on a repeated key, FOREIGN KEY on an
    invented invoice, a customer that does not exist). Hostile: some fields wrong, keys dropped or added."""
    good = {
        "customer_id": st.sampled_from([*customer_ids, 1, 2, 999_999_999]),
        "amount_cents": st.one_of(st.integers(1, 20_000), st.sampled_from([1_000_000_000])),
        "billing_period": st.sampled_from(["2026-03-01", "2026-04-01", "2026-05-01"]),
        "reference": st.sampled_from(["RMA-1", "RMA-2", "TOPUP-1", "A.b_c:d-9"]),
        "reason": st.one_of(st.text(max_size=40), st.sampled_from(HOSTILE_TEXT)) if hostile else st.text(max_size=40),
        "invoice_id": st.one_of(st.none(), st.integers(1, 50), st.sampled_from([7_000_000_000])),
        "from_date": st.sampled_from(["2026-01-01", "2026-06-30"] if hostile else ["2026-01-01"]),
        "to_date": st.sampled_from(["2026-01-31", "2026-06-01"]),
    }
    specs = st.sampled_from(list(TOOLS.values()))
    missing, bad, extra = st.integers(0, 9), st.integers(0, 4), st.integers(0, 7)
    extra_key = st.one_of(st.sampled_from(HOSTILE_KEYS), st.text(max_size=10))

    @st.composite
    def build(draw):
        spec = draw(specs)
        args = {}
        for name in spec.arg_names:
            if hostile and draw(missing) == 0:
                continue  # a missing key
            args[name] = draw(values) if hostile and draw(bad) == 0 else draw(good[name])
        if hostile and draw(extra) == 0:
            args[draw(extra_key)] = draw(values)
        return spec.name, args

    return build()


def junk():
    name = st.one_of(st.sampled_from(["DropTable", "apply_credit", "ApplyCredit ", "", "SELECT 1", "💸"]),
                     st.text(max_size=12), st.none(), st.integers())
    args = st.one_of(st.dictionaries(st.one_of(st.sampled_from(HOSTILE_KEYS), st.text(max_size=8)), values,
                                     max_size=4), values)
    return st.tuples(name, args)


@pytest.fixture(autouse=True)
def _quiet_events():
    """Thousands of batches: keep their events out of the log capture (they still go to the events table)."""
    logger = logging.getLogger("agentlab.core.events")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def batches(customer_ids: list[int]):
    """Half the batches clean (unique ids, well-formed calls: they run SQL), half hostile (odd, missing and
    duplicated ids, unknown tools, hostile arguments)."""
    # strategies are built once: hypothesis is slow to build them inside a draw
    call_id = st.one_of(st.sampled_from(["c1", "c2", "c3", "", None, "c1 ", "💸", "'", "c\x00", "c\ud800", 7]),
                        st.text(max_size=8))
    clean_call = plausible(customer_ids, hostile=False)
    hostile_call = st.one_of(plausible(customer_ids), plausible(customer_ids), junk())
    sizes, modes, coin = st.integers(1, 5), st.integers(0, 3), st.booleans()

    @st.composite
    def build(draw):
        clean = draw(coin)
        calls = []
        for i in range(draw(sizes)):
            name, args = draw(clean_call if clean else hostile_call)
            call = {"name": name, "args": args, "type": "tool_call", "id": f"call_{i}"}
            if not clean:
                mode = draw(modes)
                if mode == 0:
                    call["id"] = draw(call_id)  # duplicates, empty and odd ids
                elif mode == 1 and draw(coin):
                    del call["id"]  # no id at all
            calls.append(call)
        return calls

    return build()


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
