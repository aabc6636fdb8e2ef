"""Least privilege and tenant isolation, on a real PostgreSQL: asserted from the database's rows.

Seed customers (data/customers.csv): 1 and 2 belong to tenant ``acme``, 3 and 4 to ``globex``. The
thread's tenant is ``acme`` unless a test says otherwise; customer 3 is "another tenant's id".
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets

import psycopg
import pytest
from langchain_core.messages import AIMessage
from psycopg_pool import AsyncConnectionPool

from agentlab.core.errors import Category, find_leaks, translate
from agentlab.core.graph import run_config
from agentlab.core.isolation import TenantRequired
from agentlab.core.safeguards import PRESETS, Safeguards, preset
from agentlab.core.schema import AGENT_ROLE, ENSURE_ROLE, TENANT_SETTING
from agentlab.core.tools_node import Outcome, TransactionalToolsNode
from agentlab.domains.billing.scenarios import get_scenario
from agentlab.domains.billing.tools import TOOLS
from agentlab.lab.tenancy import (
    FORBIDDEN_STATEMENTS,
    agent_privileges,
    compare_isolation,
    create_foreign_customer,
    cross_tenant_effects,
    try_as_agent,
    with_foreign_customer,
)
from conftest import fetch, scalar

TENANT = "acme"
FOREIGN_ID = 3  # globex
MISSING_ID = 987_654  # no customer at all

SNAPSHOT = """
SELECT (SELECT credit_cents FROM customers WHERE id = 3), (SELECT count(*) FROM invoices),
       (SELECT count(*) FROM credit_memos), (SELECT count(*) FROM refunds), (SELECT count(*) FROM outbox),
       (SELECT count(*) FROM provider.payments), (SELECT count(*) FROM tool_executions)
"""

# One call per tool, naming customer ``{cid}``; QueueCharge needs an invoice of that customer first.
TOOL_ARGS = {
    "LookupCustomer": {},
    "ListRefunds": {"from_date": "2026-01-01", "to_date": "2026-02-01"},
    "ApplyCredit": {"amount_cents": 100},
    "CreateInvoice": {"billing_period": "2026-05-01", "amount_cents": 1000},
    "CreateCreditMemo": {"reference": "RMA-77", "amount_cents": 100},
    "QueueRefund": {"reference": "RMA-78", "amount_cents": 100},
    "QueueCharge": {"billing_period": "2026-03-01", "amount_cents": 100},
}
FOREIGN_INVOICE = (
    "INSERT INTO invoices (tenant_id, customer_id, billing_period, amount_cents) "
    "VALUES ('globex', 3, '2026-03-01', 1000) RETURNING id"
)


def calls(*specs):
    return [{"name": n, "args": a, "id": f"call_{i}", "type": "tool_call"} for i, (n, a) in enumerate(specs)]


def call_for(tool: str, cid: int, **extra) -> list[dict]:
    return calls((tool, {"customer_id": cid, **TOOL_ARGS[tool], **extra}))


async def snapshot(h) -> tuple:
    return tuple((await fetch(h, SNAPSHOT))[0])


# --------------------------------------------------------------------------- reads and writes


@pytest.mark.parametrize("tool", list(TOOL_ARGS))
async def test_another_tenants_id_reads_nothing_and_writes_nothing_under_isolation(harness, tool):
    await fetch(harness, FOREIGN_INVOICE)
    node = harness.node(preset("full"))
    before = await snapshot(harness)
    foreign = await node.run_batch(call_for(tool, FOREIGN_ID), thread_id="t-iso-1", tenant_id=TENANT)
    missing = await node.run_batch(call_for(tool, MISSING_ID), thread_id="t-iso-2", tenant_id=TENANT)
    r = foreign.results[0]
    assert r.outcome is Outcome.FAILED and r.category == Category.NOT_FOUND.value
    assert "Globex" not in r.content and "7500" not in r.content
    # item 4: another tenant's id and an id that exists nowhere get the very same answer
    assert r.content == missing.results[0].content
    assert find_leaks(r.content) == []
    assert await snapshot(harness) == before


@pytest.mark.parametrize("tool", list(TOOL_ARGS))
async def test_another_tenants_id_is_read_or_written_without_isolation(harness, tool):
    await fetch(harness, FOREIGN_INVOICE)
    node = harness.node(preset("ledger"))
    assert not node.safeguards.isolation
    before = await snapshot(harness)
    batch = await node.run_batch(call_for(tool, FOREIGN_ID), thread_id="t-noiso", tenant_id=TENANT)
    r = batch.results[0]
    assert r.outcome is Outcome.APPLIED
    after = await snapshot(harness)
    if TOOLS[tool].writes:
        assert after[:6] != before[:6]  # a balance, a business row, an outbox row or a payment of globex
    elif tool == "LookupCustomer":
        assert "Globex Corporation" in r.content and "7500" in r.content  # another tenant's data, read


async def test_cross_tenant_effects_lists_what_full_without_isolation_did(harness):
    batch_calls = calls(
        ("ApplyCredit", {"customer_id": FOREIGN_ID, "amount_cents": 500}),
        ("CreateCreditMemo", {"customer_id": FOREIGN_ID, "reference": "RMA-9", "amount_cents": 500}),
        ("QueueRefund", {"customer_id": FOREIGN_ID, "reference": "RMA-9", "amount_cents": 500}),
        ("LookupCustomer", {"customer_id": FOREIGN_ID}),
        ("ApplyCredit", {"customer_id": 1, "amount_cents": 100}),
    )
    opening = {1: 5000, FOREIGN_ID: 7500}
    full = await harness.node(preset("full")).run_batch(batch_calls, thread_id="t-eff-1", tenant_id=TENANT)
    async with harness.pool.connection() as conn:
        msgs = [AIMessage(content="", tool_calls=batch_calls), *full.messages]
        assert await cross_tenant_effects(conn, "public", TENANT, [1], messages=msgs,
                                          opening_credit_cents=opening) == []

    open_ = preset("full").replace(isolation=False)  # only isolation differs
    unisolated = await harness.node(open_).run_batch(batch_calls, thread_id="t-eff-2", tenant_id=TENANT)
    assert unisolated.count(Outcome.APPLIED) == 5
    await harness.worker.drain()
    async with harness.pool.connection() as conn:
        msgs = [AIMessage(content="", tool_calls=batch_calls), *unisolated.messages]
        effects = await cross_tenant_effects(conn, "public", TENANT, [1], messages=msgs,
                                             opening_credit_cents=opening)
        since_now = await cross_tenant_effects(conn, "public", TENANT, [1, FOREIGN_ID],
                                               since=(await (await conn.execute("SELECT now()")).fetchone())[0])
    assert {(e.customer_id, e.customer_tenant, e.kind) for e in effects} == {
        (FOREIGN_ID, "globex", k) for k in ("credit_change", "credit_memo", "refund", "outbox", "payment", "read")
    }
    assert next(e for e in effects if e.kind == "credit_change").detail == "credit 7500 -> 7000 cents"
    assert since_now == []  # nothing was written after that moment


async def test_credit_memo_cannot_name_another_tenants_invoice(harness):
    foreign_invoice = (await fetch(harness, FOREIGN_INVOICE))[0][0]
    memo = {"customer_id": 1, "reference": "M-1", "amount_cents": 100}
    full = harness.node(preset("full"))
    other = await full.run_batch(calls(("CreateCreditMemo", {**memo, "invoice_id": foreign_invoice})),
                                 thread_id="t-memo-1", tenant_id=TENANT)
    none = await full.run_batch(calls(("CreateCreditMemo", {**memo, "invoice_id": MISSING_ID})),
                                thread_id="t-memo-2", tenant_id=TENANT)
    assert other.results[0].category == Category.NOT_FOUND.value
    assert other.results[0].content == none.results[0].content  # no hint that the invoice exists
    assert other.results[0].translation.sqlstate == "42501"  # refused by the WITH CHECK policy
    assert await scalar(harness, "SELECT count(*) FROM credit_memos") == 0

    ledger = harness.node(preset("ledger"))
    other = await ledger.run_batch(calls(("CreateCreditMemo", {**memo, "invoice_id": foreign_invoice})),
                                   thread_id="t-memo-3", tenant_id=TENANT)
    none = await ledger.run_batch(calls(("CreateCreditMemo", {**memo, "reference": "M-2",
                                                              "invoice_id": MISSING_ID})),
                                  thread_id="t-memo-4", tenant_id=TENANT)
    # without isolation the tenant-scoped foreign key (tenant_id, invoice_id) refuses it too, with the
    # same kind of answer as for an invoice that does not exist (raw text: this preset does not sanitize)
    assert other.results[0].outcome is Outcome.FAILED and other.results[0].translation.sqlstate == "23503"
    assert none.results[0].translation.sqlstate == "23503"
    assert await scalar(harness, "SELECT count(*) FROM credit_memos") == 0


async def test_a_write_refused_by_a_policy_is_42501_and_reads_as_not_found(harness):
    async with harness.pool.connection() as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as info:
            async with conn.transaction():
                await conn.execute(f"SELECT set_config('role', %s, true), set_config('{TENANT_SETTING}', %s, true)",
                                   (AGENT_ROLE, TENANT))
                await conn.execute("INSERT INTO invoices (tenant_id, customer_id, billing_period, amount_cents) "
                                   "VALUES ('globex', 3, '2026-03-01', 100)")
    assert info.value.sqlstate == "42501"
    assert "row-level security" in info.value.diag.message_primary
    tr = translate(info.value)
    assert tr.category is Category.NOT_FOUND and not tr.infrastructure
    assert find_leaks(tr.message) == []
    assert await scalar(harness, "SELECT count(*) FROM invoices") == 0


# --------------------------------------------------------------------------- what the role may do

REFUSED = [
    *FORBIDDEN_STATEMENTS,
    "DROP TABLE tool_executions",
    "TRUNCATE outbox",
    "DROP POLICY customers_tenant ON customers",
    "CREATE INDEX ON customers (name)",
    "INSERT INTO customers (tenant_id, name) VALUES ('acme', 'x')",
    "SELECT * FROM provider.idempotency_keys",
    "SELECT * FROM checkpoint_writes",
    "INSERT INTO events (node, outcome) VALUES ('tools', 'applied')",
    "UPDATE outbox SET status = 'dispatched'",
    "DELETE FROM outbox",
    "UPDATE tool_executions SET result = '{}'",
    "SELECT * FROM schema_migrations",
    f"CREATE ROLE agentlab_probe_{secrets.token_hex(3)}",
]


async def test_agent_role_cannot_drop_truncate_alter_or_read_the_provider(harness):
    async with harness.pool.connection() as conn:
        probes = [await try_as_agent(conn, stmt) for stmt in REFUSED]
        visible = await try_as_agent(conn, "SELECT id FROM customers")
        owner = (await (await conn.execute("SELECT current_user")).fetchone())[0]
    assert {p.statement: p.sqlstate for p in probes} == {stmt: "42501" for stmt in REFUSED}
    messages = {p.statement: p.message for p in probes}
    assert messages["DROP TABLE customers"] == "must be owner of table customers"
    assert messages["SELECT * FROM provider.payments"] == "permission denied for schema provider"
    assert not visible.refused and visible.rows == 2  # acme's two seed customers of six
    assert owner != AGENT_ROLE  # the probe's role switch ended with its transaction
    assert await scalar(harness, "SELECT count(*) FROM customers") == 6  # nothing was dropped or deleted


async def test_agent_role_has_exactly_the_privileges_the_tools_need(harness):
    async with harness.pool.connection() as conn:
        rows = {r["table"]: r for r in await agent_privileges(conn)}
    granted = {
        t: {k for k in ("select", "insert", "update", "delete", "truncate", "references", "trigger") if r[k]}
        for t, r in rows.items()
    }
    assert {t: g for t, g in granted.items() if g} == {
        "public.customers": {"select", "update"},
        "public.invoices": {"select", "insert"},
        "public.credit_memos": {"select", "insert"},
        "public.refunds": {"select", "insert"},
        "public.tool_executions": {"select", "insert"},
        "public.thread_tenants": {"select", "insert"},
        "public.outbox": {"select", "insert"},
    }
    assert rows["public.customers"]["update_columns_only"] and rows["public.outbox"]["select_columns_only"]
    assert {t for t, r in rows.items() if r["row_security"]} == {
        "public.customers", "public.invoices", "public.credit_memos", "public.refunds", "public.tool_executions",
        "public.thread_tenants"}
    for t in ("public.checkpoints", "public.checkpoint_blobs", "public.checkpoint_writes", "public.events",
              "provider.payments", "lax.customers"):
        assert granted[t] == set(), t
    assert not rows["provider.payments"]["schema_usage"] and not rows["lax.customers"]["schema_usage"]
    assert not any(r["schema_create"] for r in rows.values())


async def test_role_is_created_race_safely_by_concurrent_migrations(database_url):
    role = f"agentlab_race_{secrets.token_hex(4)}"
    ddl = ENSURE_ROLE.format(role=role)
    a = await psycopg.AsyncConnection.connect(database_url)
    b = await psycopg.AsyncConnection.connect(database_url)
    watcher = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    try:
        await a.execute(ddl)  # creates the role; not committed yet
        second = asyncio.create_task(b.execute(ddl))  # must wait on the first one's row
        for _ in range(200):
            cur = await watcher.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                        (b.info.backend_pid,))
            if (await cur.fetchone())[0] == "Lock":
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("the second CREATE ROLE never waited for the first")
        await a.commit()
        await second  # the duplicate is caught inside the DO block, not raised
        await b.commit()
        await b.execute(ddl)  # and a later run finds the role and does nothing
        await b.commit()
        cur = await watcher.execute("SELECT count(*), bool_and(NOT rolcanlogin) FROM pg_roles WHERE rolname = %s",
                                    (role,))
        assert await cur.fetchone() == (1, True)
    finally:
        for conn in (a, b):
            await conn.close()
        await watcher.execute(f'DROP ROLE IF EXISTS "{role}"')
        await watcher.close()


# --------------------------------------------------------------------------- the tenant's source


@pytest.mark.parametrize("tool", list(TOOL_ARGS))
async def test_a_tenant_argument_is_refused_before_any_sql(harness, tool):
    node = harness.node(preset("full"))
    before = await snapshot(harness)
    batch = await node.run_batch(call_for(tool, 1, tenant_id="globex"), thread_id="t-arg", tenant_id=TENANT)
    r = batch.results[0]
    assert r.outcome is Outcome.FAILED and r.category == Category.INVALID_ARGUMENTS.value
    # the rejection names the key the model sent (case C04), which tells it nothing it did not know
    assert "'tenant_id' is not an argument of this tool" in r.content
    assert find_leaks(r.content) == []
    assert await snapshot(harness) == before


async def test_a_tenant_argument_is_ignored_when_validation_is_off(harness):
    node = harness.node(preset("full").replace(validation=False))
    assert node.safeguards.isolation
    batch = await node.run_batch(calls(
        ("ApplyCredit", {"customer_id": FOREIGN_ID, "amount_cents": 100, "tenant_id": "globex"}),
        ("ApplyCredit", {"customer_id": 1, "amount_cents": 100, "tenant_id": "globex"}),
    ), thread_id="t-noval", tenant_id=TENANT)
    batch2 = await node.run_batch(calls(
        ("ApplyCredit", {"customer_id": 1, "amount_cents": 100, "tenant_id": "globex"}),
    ), thread_id="t-noval-2", tenant_id=TENANT)
    assert batch.results[0].category == Category.NOT_FOUND.value  # the config's tenant, not the argument
    assert batch2.results[0].outcome is Outcome.APPLIED
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = 3") == 7500
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = 1") == 4900


async def test_the_tenant_comes_from_the_graph_config(harness):
    sc = get_scenario("refund")
    other = dataclasses.replace(sc, tenant_id="globex")  # a globex thread, acme's customers
    ep = await harness.run_episode(other, "full")
    assert ep.error is None and ep.unanswered == []
    state = await harness.end_state(ep, [c.credit_cents for c in sc.customers])
    c = state["customers"][0]
    assert (c["final_credit_cents"], c["credit_memos"], c["refunds"], c["provider_refunds"]) == (5000, 0, 0, 0)
    replies = {m.content for m in ep.tool_messages if m.artifact["outcome"] == "failed"}
    assert "FAILED [not_found]: no customer has this id; check the customer id." in replies


async def test_a_batch_without_a_tenant_is_refused_before_any_sql(harness):
    node = harness.node(preset("full"))
    before = await snapshot(harness)
    for tenant in (None, "", "  ", 7):
        with pytest.raises(TenantRequired, match="tenant_id"):
            await node.run_batch(call_for("ApplyCredit", 1), thread_id="t-none", tenant_id=tenant)
    assert await snapshot(harness) == before
    assert run_config("t")["configurable"]["tenant_id"] is None
    graph = harness.graph(preset("full"), _model_for(get_scenario("refund"), [1]))
    with pytest.raises(TenantRequired):
        await graph.ainvoke({"messages": []}, run_config("t-graph"))
    assert await snapshot(harness) == before


def _model_for(sc, ids):
    from agentlab.sim.model import ScriptedChatModel

    return ScriptedChatModel(script=sc.script(ids))


async def test_role_and_tenant_end_with_the_batch_transaction(database_url):
    pool = AsyncConnectionPool(database_url, min_size=1, max_size=1, kwargs={"autocommit": True}, open=False)
    await pool.open(wait=True)
    try:
        node = TransactionalToolsNode(pool, preset("full"), toolset=TOOLS)
        ok = await node.run_batch(call_for("ApplyCredit", 1), thread_id="t-local-1", tenant_id=TENANT)
        bad = await node.run_batch(calls(("ApplyCredit", {"customer_id": 1, "amount_cents": 100}),
                                         ("ApplyCredit", {"customer_id": 1, "amount_cents": 10**8})),
                                   thread_id="t-local-2", tenant_id=TENANT)
        assert ok.results[0].outcome is Outcome.APPLIED and bad.rolled_back
        async with pool.connection() as conn:  # the pool's only connection, used by both batches
            cur = await conn.execute(f"SELECT current_user, coalesce(current_setting('{TENANT_SETTING}', true), '')")
            user, tenant = await cur.fetchone()
            assert user != AGENT_ROLE and tenant == ""
            assert (await (await conn.execute("SELECT count(*) FROM customers")).fetchone())[0] == 6
    finally:
        await pool.close()


# --------------------------------------------------------------------------- presets and episodes


def test_isolation_is_on_in_full_only_and_needs_constraints_and_a_transaction():
    assert {name for name, sg in PRESETS.items() if sg.isolation} == {"full"}
    with pytest.raises(ValueError, match="constraints=True"):
        Safeguards(constraints=False)
    with pytest.raises(ValueError, match="transaction=True"):
        Safeguards(transaction=False, savepoints=False, ledger=False)
    assert not Safeguards(constraints=False, isolation=False).isolation
    assert preset("full").replace(isolation=False).schema == "public"


@pytest.mark.parametrize("scenario", ["refund", "invoice"])
async def test_cross_tenant_fault_gives_effects_without_isolation_and_none_under_full(database_url, scenario):
    rows = {r["preset"]: r for r in await compare_isolation(("naive", "ledger", "full"), scenario, url=database_url)}
    full = rows["full"]
    assert full["cross_tenant_effects"] == 0 and full["error"] is None
    assert full["foreign_reply"] == "FAILED [not_found]: no customer has this id; check the customer id."
    assert full["own_final_credit_cents"] == full["own_intended_credit_cents"]
    assert full["foreign_final_credit_cents"] == full["foreign_opening_credit_cents"]
    for name in ("naive", "ledger"):
        assert rows[name]["cross_tenant_effects"] >= 1, name


async def test_compare_isolation_takes_a_safeguards_value_so_only_isolation_differs(database_url):
    without = preset("full").replace(isolation=False, name="full without isolation")
    rows = await compare_isolation([without, "full"], "refund", url=database_url)
    assert [(r["preset"], r["isolation"], r["cross_tenant_effects"], r["effect_kinds"]) for r in rows] == [
        ("full without isolation", False, 1, ["credit_memo"]), ("full", True, 0, [])]


async def test_foreign_customer_helpers(harness):
    sc = with_foreign_customer(get_scenario("refund"))
    assert [c.tenant_id for c in sc.customers] == ["acme", "globex"]
    assert sc.intended.final_credit_cents == (2500, 5000) and sc.intended.credit_memos == (1, 0)
    planned = [c for c in sc.steps[0] if c.fix is not None and c.tool != "QueueRefund"][0]
    assert planned.args["customer_id"].index == 1 and planned.fix["customer_id"].index == 0
    async with harness.pool.connection() as conn:
        cid = await create_foreign_customer(conn, "lax", "globex")
        tenant = (await (await conn.execute("SELECT tenant_id FROM lax.customers WHERE id = %s", (cid,))).fetchone())[0]
    assert tenant == "initech"
    with pytest.raises(ValueError):
        with_foreign_customer(get_scenario("refund"), index=2)  # QueueRefund already carries a fix


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("scenario", ["refund", "invoice"])
async def test_demo_scenarios_still_run_under_every_preset(harness, name, scenario):
    ep = await harness.run_episode(scenario, name)
    assert ep.error is None and ep.unanswered == []
    if name == "full":
        sc = get_scenario(scenario)
        state = await harness.end_state(ep)
        c = state["customers"][0]
        assert c["final_credit_cents"] == sc.intended.final_credit_cents[0]
        assert (c["provider_charges"], c["provider_refunds"]) == (sc.intended.provider_charges[0],
                                                                   sc.intended.provider_refunds[0])


@pytest.mark.parametrize("statement", [
    "INSERT INTO credit_memos (tenant_id, customer_id, reference, amount_cents) VALUES ('acme', 3, 'X-1', 100)",
    "INSERT INTO invoices (tenant_id, customer_id, billing_period, amount_cents) VALUES ('acme', 3, '2026-03-01', 100)",
    "INSERT INTO refunds (tenant_id, customer_id, reference, amount_cents) VALUES ('acme', 3, 'X-1', 100)",
])
async def test_a_row_naming_another_tenants_customer_under_its_own_tenant_is_refused(harness, statement):
    # row security checks the row's own tenant_id; the tenant-scoped foreign key checks the customer's
    async with await psycopg.AsyncConnection.connect(harness.url, autocommit=True) as conn:
        probe = await try_as_agent(conn, statement, tenant_id="acme")
    assert probe.sqlstate == "23503", probe
    async with await psycopg.AsyncConnection.connect(harness.url, autocommit=True) as conn:
        cur = await conn.execute("SELECT (SELECT count(*) FROM credit_memos) + (SELECT count(*) FROM invoices)"
                                 " + (SELECT count(*) FROM refunds)")
        assert (await cur.fetchone())[0] == 0
