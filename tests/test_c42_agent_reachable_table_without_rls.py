"""Case C42: a user's table that the agent role can write without row-level security.

``examples/payouts.py`` granted the agent role its two tables and nothing more: a thread of tenant globex
sending ``SendPayout`` for tenant acme's account was applied (acme's balance 10,000 -> 1,000, the provider
paid 9,000). Now the example turns row-level security on (its second migration), so that call answers
``FAILED [not_found]`` as billing does for another tenant's customer, and the kit refuses any domain whose
schema leaves the agent role a table without row-level security that it does not declare shared
(``Domain.shared_tables``): the check reads the catalog after the domain's migrations."""

from __future__ import annotations

import dataclasses

import psycopg
import pytest
from langchain_core.messages import ToolMessage

from agentlab import (
    AGENT_ROLE,
    TENANT_PREDICATE,
    Domain,
    DomainError,
    Harness,
    Migration,
    PlannedCall,
    Toolset,
    migrate_domain,
    preset,
    run_config,
    unisolated_tables,
)
from agentlab.core.schema import SHARED_TABLES
from agentlab.runtime import db
from agentlab.runtime.domains import resolve_domain
from agentlab.sim.model import ScriptedChatModel

PAYOUTS = "examples.payouts:DOMAIN"
OPENING_CENTS = 10_000

# another domain: two tables in its own schema, the first isolated by tenant, the second left open
LEDGERBOOK = f"""
    CREATE SCHEMA ledgerbook;
    CREATE TABLE ledgerbook.entry (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, tenant_id text NOT NULL,
                                   amount_cents bigint NOT NULL);
    CREATE TABLE ledgerbook.rate (currency text PRIMARY KEY, per_euro numeric NOT NULL);
    GRANT USAGE ON SCHEMA ledgerbook TO {AGENT_ROLE};
    GRANT SELECT, INSERT ON ledgerbook.entry TO {AGENT_ROLE};
    GRANT SELECT, UPDATE ON ledgerbook.rate TO {AGENT_ROLE};
    ALTER TABLE ledgerbook.entry ENABLE ROW LEVEL SECURITY;
    CREATE POLICY entry_tenant ON ledgerbook.entry TO {AGENT_ROLE} USING ({TENANT_PREDICATE})
        WITH CHECK ({TENANT_PREDICATE});
"""
CATALOG = """
SELECT c.relrowsecurity, has_table_privilege(%(role)s, c.oid, 'SELECT'), has_table_privilege(%(role)s, c.oid, 'UPDATE')
FROM pg_class c WHERE c.oid = to_regclass(%(table)s)
"""


def ledgerbook(**changes) -> Domain:
    return Domain("ledgerbook", toolset=Toolset([]), scenarios={}, create_rows=None,
                  migrations=(Migration("entries and rates", LEDGERBOOK),), **changes)


async def scalar(conn, query: str, params=()):
    return (await (await conn.execute(query, params)).fetchone())[0]


async def test_c42_globex_cannot_pay_out_of_acmes_account_under_full():
    async with await Harness.open(purpose="c42", domain=PAYOUTS) as h:
        async with h.pool.connection() as conn:
            acme = await scalar(conn, "INSERT INTO payouts.account (tenant_id, balance_cents) VALUES ('acme', %s) "
                                      "RETURNING id", (OPENING_CENTS,))
        call = PlannedCall("SendPayout", {"account_id": acme, "reference": "INV-9", "amount_cents": 9000})
        graph = h.graph(preset("full"), ScriptedChatModel(script=[[call]]))
        state = await graph.ainvoke({"messages": [("user", "Pay out 90 euros to my bank.")]},
                                    run_config(h.thread("c42"), tenant_id="globex"))
        drained = await h.worker.drain()

        replies = [m for m in state["messages"] if isinstance(m, ToolMessage)]
        assert [str(m.content) for m in replies] == ["FAILED [not_found]: no account has this id; check the account id."]
        async with h.pool.connection() as conn:  # the owner's view: row security hides nothing here
            assert await scalar(conn, "SELECT balance_cents FROM payouts.account WHERE id = %s", (acme,)) == OPENING_CENTS
            assert await scalar(conn, "SELECT count(*) FROM payouts.payout") == 0
            assert await scalar(conn, "SELECT count(*) FROM public.outbox") == 0
            assert await scalar(conn, "SELECT count(*) FROM provider.payments") == 0
            assert await scalar(conn, "SELECT count(*) FROM tool_executions") == 0
        assert drained.dispatched == 0


async def test_c42_the_example_as_first_shipped_is_refused_naming_both_tables():
    shipped = resolve_domain(PAYOUTS)
    first_only = dataclasses.replace(shipped, migrations=shipped.migrations[:1])
    with pytest.raises(DomainError) as refused:
        await Harness.open(purpose="c42", domain=first_only)
    text = str(refused.value)
    assert "payouts.account (SELECT, UPDATE) and payouts.payout (SELECT, INSERT) without row-level security" in text
    assert "shared_tables=('payouts.account', 'payouts.payout')" in text


def test_c42_the_example_leaves_the_agent_role_no_table_without_row_security(database_url):
    with psycopg.connect(database_url, autocommit=True) as conn:
        migrate_domain(conn, resolve_domain(PAYOUTS))
        assert set(unisolated_tables(conn)) == set(SHARED_TABLES)
        for table in ("payouts.account", "payouts.payout"):
            assert conn.execute(CATALOG, {"role": AGENT_ROLE, "table": table}).fetchone()[:2] == (True, True)


def test_c42_another_domains_second_table_is_refused_and_nothing_is_applied(database_url):
    with psycopg.connect(database_url, autocommit=True) as conn:
        with pytest.raises(DomainError, match=r"can reach ledgerbook\.rate \(SELECT, UPDATE\) without row-level") as refused:
            migrate_domain(conn, ledgerbook())
        assert "ledgerbook.entry" not in str(refused.value)
        assert conn.execute("SELECT to_regnamespace('ledgerbook')").fetchone()[0] is None
        assert conn.execute("SELECT count(*) FROM schema_migrations WHERE owner = 'ledgerbook'").fetchone()[0] == 0


def test_c42_a_table_declared_shared_is_migrated_and_stays_open(database_url):
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert migrate_domain(conn, ledgerbook(shared_tables=("ledgerbook.rate",))) == [0]
        assert conn.execute(CATALOG, {"role": AGENT_ROLE, "table": "ledgerbook.rate"}).fetchone() == (False, True, True)
        assert set(unisolated_tables(conn)) == {*SHARED_TABLES, "ledgerbook.rate"}
        assert migrate_domain(conn, ledgerbook(shared_tables=("ledgerbook.rate",))) == []  # checked again: holds


def test_c42_a_shared_table_that_does_not_exist_or_is_not_qualified_is_refused(database_url):
    with (psycopg.connect(database_url, autocommit=True) as conn,
          pytest.raises(DomainError, match=r"declares ledgerbook\.rates shared, but its migrations create no")):
        migrate_domain(conn, ledgerbook(shared_tables=("ledgerbook.rates",)))
    with pytest.raises(DomainError, match="shared_tables must be a tuple of"):
        ledgerbook(shared_tables="ledgerbook.rate")
    with pytest.raises(DomainError, match="shared_tables must be a tuple of"):
        ledgerbook(shared_tables=("rate",))


def test_c42_retail_declares_exactly_the_tables_its_tools_reach():
    retail = resolve_domain("retail")
    url = db.create_database("c42", retail)  # built through migrate_domain: refused if one were undeclared
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            assert set(unisolated_tables(conn)) == {*SHARED_TABLES, *retail.shared_tables}
    finally:
        db.drop_database(url)
