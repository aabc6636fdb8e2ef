"""Bring your own tool: a payout domain outside the package, on the kit's safety net.

One table with a natural key, one tool that moves money through the outbox, one invariant. Run its
fault x preset table with::

    python -m agentlab chaos --domain examples.payouts:DOMAIN --episodes 5

``SendPayout`` takes money from an account's balance, records the payout under its natural key
(account, reference) and queues the transfer in the outbox, all in the batch's transaction: the kit's
tools node gives it a savepoint, the ledger and the retry policy, the outbox worker pays it exactly once.
The invariant reads the database and the provider: each account's balance is its opening balance minus
the payouts the scenario meant, and the provider paid each of them once.

Tenant isolation: ``full`` runs the tools as the agent role, and the kit refuses a domain whose tables
that role can reach without row-level security (case C42). So the second migration turns it on: a tool
sees only the accounts of its thread's tenant, and the payouts of those accounts; another tenant's
account id answers ``FAILED [not_found]``, as an id that does not exist.
"""

from __future__ import annotations

from pydantic import Field

from agentlab import (
    AGENT_ROLE, REFUND_TOPIC, TENANT_PREDICATE, C, Domain, Invariant, Migration, NotFound, PlannedCall, Scenario,
    StrictArgs, Toolset, send_payment, tool,
)

# -- the schema: append-only, in a schema of its own; full runs the tools as the agent role: grant it what
#    the tool needs, and let it see one tenant's rows only
MIGRATIONS = (
    Migration("accounts and payouts", f"""
        CREATE SCHEMA payouts;
        CREATE TABLE payouts.account (
            id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            tenant_id     text NOT NULL,
            balance_cents bigint NOT NULL CHECK (balance_cents >= 0)
        );
        CREATE TABLE payouts.payout (
            id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            account_id   bigint NOT NULL REFERENCES payouts.account (id),
            reference    text NOT NULL,
            amount_cents bigint NOT NULL CHECK (amount_cents > 0),
            CONSTRAINT payout_natural_key UNIQUE (account_id, reference)
        );
        GRANT USAGE ON SCHEMA payouts TO {AGENT_ROLE};
        GRANT SELECT, UPDATE (balance_cents) ON payouts.account TO {AGENT_ROLE};
        GRANT SELECT, INSERT ON payouts.payout TO {AGENT_ROLE};
    """),
    Migration("row-level security by tenant: the agent role sees its thread's tenant's accounts only", f"""
        ALTER TABLE payouts.account ENABLE ROW LEVEL SECURITY;
        ALTER TABLE payouts.payout ENABLE ROW LEVEL SECURITY;
        CREATE POLICY account_tenant ON payouts.account TO {AGENT_ROLE}
            USING ({TENANT_PREDICATE}) WITH CHECK ({TENANT_PREDICATE});
        -- a payout belongs to its account's tenant: seen and written only through an account the tenant sees
        CREATE POLICY payout_tenant ON payouts.payout TO {AGENT_ROLE}
            USING (EXISTS (SELECT 1 FROM payouts.account a WHERE a.id = payout.account_id))
            WITH CHECK (EXISTS (SELECT 1 FROM payouts.account a WHERE a.id = payout.account_id));
    """),
)


# -- the tool: a strict argument model and a handler on the node's connection (it never commits)
class SendPayout(StrictArgs):
    """Pay ``amount_cents`` out of an account to its owner's bank, once per ``reference``. Writes; pays."""

    account_id: int = Field(gt=0, le=2**63 - 1)
    reference: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
    amount_cents: int = Field(gt=0, le=1_000_000_000)


async def send_payout(conn, args, ctx) -> dict:
    account, reference, amount = args["account_id"], args["reference"], args["amount_cents"]
    cur = await conn.execute("UPDATE payouts.account SET balance_cents = balance_cents - %s WHERE id = %s "
                             "RETURNING balance_cents", (amount, account))
    if await cur.fetchone() is None:
        raise NotFound("no account has this id; check the account id.")
    cur = await conn.execute("INSERT INTO payouts.payout (account_id, reference, amount_cents) VALUES (%s, %s, %s) "
                             "RETURNING id", (account, reference, amount))
    payout_id = (await cur.fetchone())[0]
    key = f"payout:{account}:{reference}"  # the natural key is the outbox dedupe key and the provider's key
    return await send_payment(conn, ctx, REFUND_TOPIC, key,
                              {"customer_id": account, "amount_cents": amount, "payout_id": payout_id},
                              {"payout_id": payout_id, "amount_cents": amount})


TOOLS = Toolset([tool(SendPayout, send_payout, writes=True, external=True)])


# -- the episode's own rows, and the scenario the scripted model plays
async def create_accounts(conn, scenario, schema: str) -> list[int]:
    cur = await conn.execute("INSERT INTO payouts.account (tenant_id, balance_cents) "
                             "SELECT %s, unnest(%s::bigint[]) RETURNING id", (scenario.tenant_id, list(scenario.customers)))
    return sorted(r[0] for r in await cur.fetchall())


SCENARIOS = {"payday": Scenario(
    "payday", "two payouts in one batch", "Pay out my two invoices to my bank account.",
    customers=(10_000,),
    steps=((PlannedCall("SendPayout", {"account_id": C(0), "reference": "INV-1", "amount_cents": 2500}),
            PlannedCall("SendPayout", {"account_id": C(0), "reference": "INV-2", "amount_cents": 1500})),),
    intended={"balances": (6_000,), "payouts": (2,)},
)}


# -- the invariant: read from the database and the provider's records, never from the code's bookkeeping
async def paid_as_meant(ctx) -> list[str]:
    cur = await ctx.conn.execute("""
        SELECT a.id, a.balance_cents,
               (SELECT count(*) FROM payouts.payout p WHERE p.account_id = a.id),
               (SELECT count(*) FROM provider.payments m WHERE m.reference LIKE 'payout:' || a.id || ':%%')
        FROM payouts.account a WHERE a.id = ANY(%s) ORDER BY a.id""", (ctx.ids,))
    want = ctx.scenario.intended
    out = []
    for (aid, balance, payouts, paid), want_balance, want_payouts in zip(
            await cur.fetchall(), want["balances"], want["payouts"]):
        if balance != want_balance:
            out.append(f"account {aid}: balance {balance} cents, intended {want_balance}")
        if payouts != want_payouts:
            out.append(f"account {aid}: {payouts} payouts recorded, intended {want_payouts}")
        if paid != want_payouts:
            out.append(f"account {aid}: {paid} payments at the provider, intended {want_payouts}")
    return out


DOMAIN = Domain(
    "payouts", toolset=TOOLS, scenarios=SCENARIOS, create_rows=create_accounts, migrations=MIGRATIONS,
    invariants=(Invariant("paid_as_meant", paid_as_meant, "balances, payouts and provider payments as meant"),),
    description="payouts from an account balance, sent through the outbox",
)
