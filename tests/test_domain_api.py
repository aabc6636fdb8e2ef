"""The domain API: a throwaway domain defined here (one table, one tool, one invariant) gets the tools
node, the graph and the failure lab without editing the package; a wrong domain is refused up front."""

from __future__ import annotations

import dataclasses

import psycopg
import pytest
from pydantic import ConfigDict, Field

from agentlab import (
    AGENT_ROLE,
    TENANT_PREDICATE,
    C,
    Domain,
    DomainError,
    ErrorHints,
    Harness,
    Invariant,
    Migration,
    PlannedCall,
    Scenario,
    StrictArgs,
    Toolset,
    ToolSpec,
    build_graph,
    migrate_domain,
    preset,
    run_config,
    run_experiment,
    tool,
)
from agentlab.sim.model import ScriptedChatModel

OPENING_CENTS = 10_000


class Withdraw(StrictArgs):
    """Take ``amount_cents`` from a wallet. Writes."""

    wallet_id: int = Field(gt=0)
    amount_cents: int = Field(gt=0)


async def withdraw(conn, args, ctx) -> dict:
    cur = await conn.execute("UPDATE wallets.wallet SET balance_cents = balance_cents - %s WHERE id = %s "
                             "RETURNING balance_cents", (args["amount_cents"], args["wallet_id"]))
    row = await cur.fetchone()
    return {"wallet_id": args["wallet_id"], "balance_cents": row[0]}


async def create_wallets(conn, scenario, schema: str) -> list[int]:
    cur = await conn.execute("INSERT INTO wallets.wallet (tenant_id, balance_cents) SELECT %s, unnest(%s::bigint[]) "
                             "RETURNING id", (scenario.tenant_id, list(scenario.customers)))
    return sorted(r[0] for r in await cur.fetchall())


async def balance_as_intended(ctx) -> list[str]:
    cur = await ctx.conn.execute("SELECT id, balance_cents FROM wallets.wallet WHERE id = ANY(%s) ORDER BY id",
                                 (ctx.ids,))
    return [f"wallet {wid}: {have} cents, intended {want}"
            for (wid, have), want in zip(await cur.fetchall(), ctx.scenario.intended) if have != want]


MIGRATIONS = (Migration("wallets", f"""
    CREATE SCHEMA wallets;
    CREATE TABLE wallets.wallet (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, tenant_id text NOT NULL,
                                 balance_cents bigint NOT NULL CHECK (balance_cents >= 0));
    GRANT USAGE ON SCHEMA wallets TO {AGENT_ROLE};
    GRANT SELECT, UPDATE (balance_cents) ON wallets.wallet TO {AGENT_ROLE};
    ALTER TABLE wallets.wallet ENABLE ROW LEVEL SECURITY;
    CREATE POLICY wallet_tenant ON wallets.wallet TO {AGENT_ROLE} USING ({TENANT_PREDICATE});
"""),)
PAY = Scenario("pay", "two withdrawals", "Pay the two bills from my wallet.", customers=(OPENING_CENTS,),
               steps=((PlannedCall("Withdraw", {"wallet_id": C(0), "amount_cents": 2500}),
                       PlannedCall("Withdraw", {"wallet_id": C(0), "amount_cents": 1500})),),
               intended=(OPENING_CENTS - 4000,))
WALLETS = Domain("wallets", toolset=Toolset([tool(Withdraw, withdraw, writes=True)]), scenarios={"pay": PAY},
                 create_rows=create_wallets, migrations=MIGRATIONS,
                 invariants=(Invariant("wallet_balance", balance_as_intended, "each balance as the scenario meant"),))


async def test_a_throwaway_domain_runs_through_the_node_and_the_graph():
    async with await Harness.open(purpose="domain", domain=WALLETS) as h:
        ids = await h.create_customers(PAY, preset("full"))
        graph = build_graph(ScriptedChatModel(script=PAY.script(ids), seed=0), h.node(preset("full")),
                            checkpointer=h.saver)
        await graph.ainvoke({"messages": [("user", PAY.prompt)]}, run_config("wallet-1", tenant_id="acme"))
        async with h.pool.connection() as conn:
            row = await (await conn.execute("SELECT balance_cents FROM wallets.wallet WHERE id = %s", (ids[0],))).fetchone()
            ledger = await (await conn.execute("SELECT count(*) FROM tool_executions WHERE thread_id = 'wallet-1'")).fetchone()
        assert row[0] == OPENING_CENTS - 4000
        assert ledger[0] == 2


async def test_a_small_chaos_experiment_on_the_throwaway_domain():
    result = await run_experiment(2, ["savepoints", "full"], ["none", "crash_before_checkpoint"], seed=0,
                                  progress=False, domain=WALLETS)
    cells = result.rows.groupby(["fault", "preset"])["violations"].sum()
    assert "wallet_balance" in result.rows.columns
    # without the ledger the resumed thread withdraws again: the domain's own invariant sees it
    assert result.rows.query("preset == 'savepoints' and fault == 'crash_before_checkpoint'")["wallet_balance"].sum() > 0
    assert cells.xs("full", level="preset").sum() == 0
    assert cells[("none", "savepoints")] == 0


WALLET_HINT = "the wallet holds less than this amount; withdraw at most its balance."


async def test_the_node_tells_the_model_the_domains_own_hint_and_the_core_text_otherwise():
    over = [{"name": "Withdraw", "args": {"wallet_id": 0, "amount_cents": 2 * OPENING_CENTS}, "id": "over",
             "type": "tool_call"}]
    hinted = dataclasses.replace(WALLETS, error_hints=ErrorHints(
        constraints={"wallet_balance_cents_check": WALLET_HINT}, identifiers=("wallet_balance_cents_check",)))
    told = {}
    for domain in (WALLETS, hinted):
        async with await Harness.open(purpose="domain", domain=domain) as h:
            ids = await h.create_customers(PAY, preset("full"))
            over[0]["args"]["wallet_id"] = ids[0]
            batch = await h.node(preset("full")).run_batch(over, thread_id=f"hint-{domain is hinted}", tenant_id="acme")
            async with h.pool.connection() as conn:
                row = await (await conn.execute("SELECT balance_cents FROM wallets.wallet WHERE id = %s",
                                                (ids[0],))).fetchone()
            assert row[0] == OPENING_CENTS  # refused by the CHECK: nothing withdrawn
            told[domain is hinted] = batch.results[0].content
    assert told == {False: "FAILED [business_rule]: a value breaks a business rule; change the amount or the record.",
                    True: f"FAILED [business_rule]: {WALLET_HINT}"}


def test_an_error_hint_that_leaks_is_refused():
    with pytest.raises(DomainError, match="error hint for 'wallet_balance_cents_check'"):
        dataclasses.replace(WALLETS, error_hints=ErrorHints(
            constraints={"wallet_balance_cents_check": "wallet_balance_cents_check failed"},
            identifiers=("wallet_balance_cents_check",)))


def test_a_tool_whose_argument_model_is_not_strict_is_refused():
    class Loose(StrictArgs):
        model_config = ConfigDict(strict=False, extra="ignore")
        n: int

    with pytest.raises(DomainError, match="not strict"):
        Toolset([tool(Loose, withdraw, writes=True)])


def test_two_tools_with_one_name_are_refused():
    with pytest.raises(DomainError, match="two tools are named 'Withdraw'"):
        Toolset([tool(Withdraw, withdraw, writes=True), ToolSpec("Withdraw", Withdraw, withdraw, writes=False)])


def test_a_scenario_calling_an_unknown_tool_is_refused():
    bad = Scenario("bad", "", "", (1,), ((PlannedCall("Deposit", {}),),), (1,))
    with pytest.raises(DomainError, match="'Deposit', which is not one of its tools"):
        Domain("wallets", toolset=WALLETS.toolset, scenarios={"bad": bad}, create_rows=create_wallets)


async def test_a_migration_edited_after_it_was_applied_is_refused(harness):
    with psycopg.connect(harness.url, autocommit=True) as conn:
        assert migrate_domain(conn, WALLETS) == [0]
        assert migrate_domain(conn, WALLETS) == []
        edited = Domain("wallets", toolset=WALLETS.toolset, scenarios={}, create_rows=create_wallets,
                        migrations=(Migration("wallets", MIGRATIONS[0].sql + "\nSELECT 1;"),))
        with pytest.raises(DomainError, match="migration 0 .* was edited"):
            migrate_domain(conn, edited)


async def test_an_invariant_that_raises_is_a_domain_error_not_a_violation():
    async def broken(ctx) -> list[str]:
        raise KeyError("balance")

    domain = Domain("wallets", toolset=WALLETS.toolset, scenarios={"pay": PAY}, create_rows=create_wallets,
                    migrations=MIGRATIONS, invariants=(Invariant("broken", broken),))
    with pytest.raises(DomainError, match="invariant 'broken' raised KeyError"):
        await run_experiment(1, ["full"], ["none"], progress=False, domain=domain)
