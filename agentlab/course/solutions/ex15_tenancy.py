"""Exercises of notebook 15 (least privilege and tenant isolation)."""

from __future__ import annotations

from agentlab import try_as_agent

TENANTS = ("acme", "globex", "initech", "umbrella")
SEE_CUSTOMER = "SELECT id FROM customers WHERE id = %s"
TAKE_CREDIT = "UPDATE customers SET credit_cents = credit_cents - 100 WHERE id = %s"
MEMO_LIKE_THE_TOOLS = """
INSERT INTO credit_memos (tenant_id, customer_id, reference, amount_cents)
SELECT tenant_id, id, 'EX15-MEMO', 100 FROM customers WHERE id = %s
"""
MEMO_WITH_ITS_TENANT = """
INSERT INTO credit_memos (tenant_id, customer_id, reference, amount_cents)
SELECT c.tenant_id, c.id, 'EX15-MEMO', 100 FROM (VALUES (%s::text, %s::bigint)) AS c (tenant_id, id)
"""


async def who_sees(h, customer_id: int) -> dict[str, bool]:
    """Exercise 15.1: which tenant's agent role can read customer ``customer_id``."""
    async with h.pool.connection() as conn:
        return {t: (await try_as_agent(conn, SEE_CUSTOMER, (customer_id,), tenant_id=t)).rows == 1 for t in TENANTS}


def _outcome(probe) -> int | str:
    return probe.sqlstate if probe.refused else probe.rows


async def write_as(h, tenant_id: str, customer_id: int, customer_tenant: str) -> dict:
    """Exercise 15.2: as ``tenant_id``'s agent role, write to customer ``customer_id`` (of tenant
    ``customer_tenant``) three ways; every probe is rolled back (:func:`agentlab.lab.tenancy.try_as_agent`).
    Each value is the rows affected, or the SQLSTATE when PostgreSQL refused the statement."""
    async with h.pool.connection() as conn:
        update = await try_as_agent(conn, TAKE_CREDIT, (customer_id,), tenant_id=tenant_id)
        like_tools = await try_as_agent(conn, MEMO_LIKE_THE_TOOLS, (customer_id,), tenant_id=tenant_id)
        explicit = await try_as_agent(conn, MEMO_WITH_ITS_TENANT, (customer_tenant, customer_id), tenant_id=tenant_id)
    return {"update_credit": _outcome(update), "memo_like_the_tools": _outcome(like_tools),
            "memo_naming_its_tenant": _outcome(explicit)}
