"""Case C34: the ledger key across tenants.

Tenant acme, thread ``support-7``, call id ``x:1`` runs ``LookupCustomer``; tenant globex, thread
``support-7:x``, call id ``1`` sends the same call. The old key ``thread_id:tool_call_id`` made both
``support-7:x:1``: globex got acme's stored result, or ``FAILED [conflict]`` with other arguments. The
key is now a JSON array of its parts with the tenant first, and row-level security holds the agent
role to its tenant's ledger rows."""

from __future__ import annotations

import json

from agentlab.core.safeguards import preset
from agentlab.core.tools_node import idempotency_key
from agentlab.lab.tenancy import try_as_agent
from conftest import fetch, scalar

ACME = ("acme", "support-7", "x:1")
GLOBEX = ("globex", "support-7:x", "1")


async def confidential_customer(harness) -> int:
    async with harness.pool.connection() as conn:
        cur = await conn.execute("INSERT INTO customers (tenant_id, name, credit_cents) "
                                 "VALUES ('acme', 'Acme Confidential Ltd', 777700) RETURNING id")
        return (await cur.fetchone())[0]


def lookup(customer_id: int, call_id: str) -> list[dict]:
    return [{"name": "LookupCustomer", "args": {"customer_id": customer_id}, "id": call_id, "type": "tool_call"}]


async def run(node, who: tuple[str, str, str], customer_id: int):
    tenant, thread, call_id = who
    batch = await node.run_batch(lookup(customer_id, call_id), thread_id=thread, tenant_id=tenant)
    return batch.results[0]


def test_c34_keys_of_different_parts_never_collide():
    assert idempotency_key("support-7", "x:1", tenant_id="acme") != idempotency_key("support-7:x", "1", tenant_id="acme")
    assert idempotency_key("support-7", "x:1", tenant_id="acme") != idempotency_key("support-7", "x:1", tenant_id="globex")
    assert json.loads(idempotency_key('t"]', '[1', tenant_id=None)) == [None, 't"]', "[1", 0]


async def test_c34_globex_never_reads_acme_ledger_rows_under_full(harness):
    node = harness.node(preset("full"))
    secret = await confidential_customer(harness)
    first = await run(node, ACME, secret)
    assert first.outcome.value == "applied" and "Acme Confidential Ltd" in first.content

    same = await run(node, GLOBEX, secret)  # the same call: not acme's stored result
    assert same.outcome.value == "failed" and same.category == "not_found"
    assert "Acme" not in same.content and "777700" not in same.content
    other = await run(node, (*GLOBEX[:2], "2"), 3)  # other arguments: no conflict, its own result
    assert other.outcome.value == "applied" and "Globex Corporation" in other.content

    rows = await fetch(harness, "SELECT tenant_id, thread_id, tool_call_id FROM tool_executions ORDER BY tenant_id")
    assert rows == [ACME, ("globex", "support-7:x", "2")]
    async with harness.pool.connection() as conn:  # as the agent role, a tenant sees its own ledger rows only
        seen = await try_as_agent(conn, "SELECT tool_call_id FROM tool_executions", tenant_id="globex")
        assert (seen.sqlstate, seen.rows) == (None, 1)
        hidden = await try_as_agent(conn, "SELECT 1 FROM tool_executions WHERE idempotency_key = %s",
                                    (idempotency_key("support-7", "x:1", tenant_id="acme"),), tenant_id="globex")
        assert (hidden.sqlstate, hidden.rows) == (None, 0)
        forged = await try_as_agent(conn, "INSERT INTO tool_executions (idempotency_key, tenant_id, thread_id, "
                                          "tool_call_id, tool_name, args, result) VALUES ('k', 'acme', 't', 'c', "
                                          "'LookupCustomer', '{}', '{}')", tenant_id="globex")
        assert forged.sqlstate == "42501"  # no row for another tenant either


async def test_c34_without_isolation_the_key_still_keeps_threads_apart(harness):
    node = harness.node(preset("ledger"))
    secret = await confidential_customer(harness)
    await run(node, ACME, secret)
    same = await run(node, GLOBEX, secret)
    assert same.outcome.value == "applied"  # ran itself (no isolation here), not acme's stored row replayed
    again = await run(node, GLOBEX, secret)
    assert again.outcome.value == "replayed"  # globex's own call again
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 2
