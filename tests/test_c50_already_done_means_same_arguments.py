"""C50: "already done" is an answer about the same arguments only.

``QueueCharge(amount_cents=3000)`` then, in a later turn, ``QueueCharge(amount_cents=6000)`` for the same
invoice was told applied ``{"amount_cents": 6000, "status": "already_queued"}`` while 3,000 stayed
queued: the outbox's natural key (its dedupe key) matched, and the answer echoed the new arguments. Now
a natural-key hit with the same payment returns ``already_queued``; another one is refused
``FAILED [conflict]``, naming what is queued, and changes nothing.

The last tests walk every writing tool of every domain (the built-in ones and those under
``examples/``), found from the domains' toolsets and played from their own scenarios: a tool that
answers "already ..." must do so only for the arguments it already holds, and the database must not
change on such an answer or on a refusal.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import pkgutil
from pathlib import Path

import psycopg
import pytest

from agentlab.core.domain import Domain
from agentlab.core.safeguards import preset
from agentlab.core.tools_node import Outcome
from agentlab.lab.tenancy import try_as_agent
from agentlab.runtime.domains import BUILTIN, resolve_domain
from agentlab.runtime.harness import Harness
from conftest import fetch, scalar

ROOT = Path(__file__).resolve().parent.parent
TENANT = "acme"
PERIOD = "2026-03-01"
OUTBOX = "SELECT topic, payload->>'amount_cents', status FROM outbox ORDER BY id"


def call(name: str, args: dict, call_id: str) -> list[dict]:
    return [{"name": name, "args": args, "id": call_id, "type": "tool_call"}]


async def invoice(h: Harness, amount_cents: int = 12_000) -> None:
    async with h.pool.connection() as conn:
        await conn.execute("INSERT INTO invoices (tenant_id, customer_id, billing_period, amount_cents) "
                           "VALUES (%s, 1, %s, %s)", (TENANT, PERIOD, amount_cents))


def charge(amount_cents: int) -> dict:
    return {"customer_id": 1, "billing_period": PERIOD, "amount_cents": amount_cents}


async def test_c50_a_charge_for_another_amount_is_refused_naming_the_queued_one(harness):
    await invoice(harness)
    node = harness.node(preset("full"))
    first = await node.run_batch(call("QueueCharge", charge(3000), "c50-1"), thread_id="t-c50", tenant_id=TENANT)
    assert first.results[0].result["status"] == "queued"

    other = await node.run_batch(call("QueueCharge", charge(6000), "c50-2"), thread_id="t-c50", tenant_id=TENANT)
    (refused,) = other.results
    assert refused.outcome is Outcome.FAILED and refused.content.startswith("FAILED [conflict]: ")
    assert "a charge of 3000 cents for customer 1 is already queued" in refused.content
    assert "6000" not in refused.content and "dedupe" not in refused.content
    assert await fetch(harness, OUTBOX) == [("payment.charge", "3000", "pending")]  # 3,000 stays, one row


async def test_c50_the_same_charge_again_is_answered_already_queued_with_what_is_queued(harness):
    await invoice(harness)
    node = harness.node(preset("full"))
    await node.run_batch(call("QueueCharge", charge(3000), "c50-1"), thread_id="t-c50", tenant_id=TENANT)
    again = await node.run_batch(call("QueueCharge", charge(3000), "c50-2"), thread_id="t-c50", tenant_id=TENANT)
    (same,) = again.results
    assert same.outcome is Outcome.APPLIED
    assert (same.result["amount_cents"], same.result["status"]) == (3000, "already_queued")
    assert await fetch(harness, OUTBOX) == [("payment.charge", "3000", "pending")]


async def test_c50_a_smaller_amount_in_the_same_batch_is_refused_and_only_its_own_call_fails(harness):
    """Lower is no better than higher; in one batch under ``partial`` the other call still applies."""
    await invoice(harness)
    node = harness.node(preset("full").replace(policy="partial"))
    batch = await node.run_batch(call("QueueCharge", charge(3000), "c50-a") + call("QueueCharge", charge(1500), "c50-b"),
                                 thread_id="t-c50", tenant_id=TENANT)
    assert [r.outcome for r in batch.results] == [Outcome.APPLIED, Outcome.FAILED]
    assert "a charge of 3000 cents" in batch.results[1].content
    assert await fetch(harness, OUTBOX) == [("payment.charge", "3000", "pending")]


async def test_c50_without_the_unique_reference_the_outbox_key_still_refuses_another_refund(harness):
    """The lax schema has no UNIQUE (customer, reference) on refunds, so only the outbox's natural key
    sees the repeat: the other amount is refused and its refund row rolls back with its savepoint."""
    sg = preset("full").replace(constraints=False, isolation=False, name="full on the lax schema")
    node = harness.node(sg)
    refund = {"customer_id": 1, "reference": "RMA-50", "amount_cents": 2500}
    await node.run_batch(call("QueueRefund", refund, "c50-r1"), thread_id="t-c50", tenant_id=TENANT)
    other = await node.run_batch(call("QueueRefund", {**refund, "amount_cents": 4000}, "c50-r2"), thread_id="t-c50",
                                 tenant_id=TENANT)
    assert other.results[0].content.startswith("FAILED [conflict]: a refund of 2500 cents for customer 1 is already")
    same = await node.run_batch(call("QueueRefund", refund, "c50-r3"), thread_id="t-c50", tenant_id=TENANT)
    assert same.results[0].result["status"] == "already_queued"
    assert await fetch(harness, OUTBOX) == [("payment.refund", "2500", "pending")]
    assert await fetch(harness, "SELECT amount_cents FROM lax.refunds WHERE reference = 'RMA-50' ORDER BY id") == [
        (2500,), (2500,)]  # the lax schema keeps the same refund twice (its own fault); never the 4000 one
    assert await scalar(harness, "SELECT count(*) FROM outbox WHERE payload->>'amount_cents' = '4000'") == 0


async def test_c50_the_agent_role_reads_a_queued_payment_of_its_own_tenant_only(harness):
    """Telling the same payment from another needs what is queued; the agent role still may not read the
    outbox's payloads (every tenant's), only the row under one key whose thread is its own tenant's."""
    await invoice(harness)
    await harness.node(preset("full")).run_batch(call("QueueCharge", charge(3000), "c50-1"), thread_id="t-c50",
                                                 tenant_id=TENANT)
    read = "SELECT topic, customer_id::int, amount_cents::int FROM queued_payment(%s)"
    async with await psycopg.AsyncConnection.connect(harness.url, autocommit=True) as conn:
        own = await try_as_agent(conn, read, (f"charge:1:{PERIOD}",), tenant_id=TENANT)
        other = await try_as_agent(conn, read, (f"charge:1:{PERIOD}",), tenant_id="globex")
        payloads = await try_as_agent(conn, "SELECT payload FROM outbox", tenant_id=TENANT)
    assert (own.sqlstate, own.rows, other.sqlstate, other.rows) == (None, 1, None, 0)
    assert payloads.sqlstate == "42501"


# --------------------------------------------------------------------------- every tool of every domain


def domains() -> list[Domain]:
    """The built-in domains and every ``DOMAIN`` of a module under ``examples/``."""
    found = [resolve_domain(name) for name in BUILTIN]
    for info in pkgutil.iter_modules([str(ROOT / "examples")]):
        module = importlib.import_module(f"examples.{info.name}")
        if isinstance(getattr(module, "DOMAIN", None), Domain):
            found.append(module.DOMAIN)
    return found


def first_planned_call(domain: Domain, tool: str):
    """``(scenario, step, index)`` of the first call of ``tool`` in the domain's scenarios, or None."""
    for scenario in domain.scenarios.values():
        calls = scenario.clean().calls(tool)
        if calls:
            step, index, _ = calls[0]
            return scenario, step, index
    return None


def writing_tools() -> list:
    return [pytest.param(domain, tool, id=f"{domain.name}:{tool}")
            for domain in domains() for tool in domain.toolset if domain.toolset.get_tool(tool).writes]


def other_arguments(args: dict) -> dict:
    """``args`` with what is not a key changed: every amount-like integer (not an ``*_id``) halved, or, when
    there is none, every text that is not an id suffixed; ids and lists stay, so the natural key stays."""
    numbers = {k for k, v in args.items() if type(v) is int and not k.endswith("_id")}
    if numbers:
        return {k: (max(1, v // 2) if v > 1 else v + 1) if k in numbers else v for k, v in args.items()}
    return {k: f"{v}-2" if type(v) is str and not k.endswith("_id") and v else v for k, v in args.items()}


TABLES = """
SELECT format('%%I.%%I', schemaname, tablename) FROM pg_tables
WHERE schemaname NOT IN ('pg_catalog', 'information_schema', 'runs')
  AND tablename NOT IN ('events', 'tool_executions', 'thread_tenants', 'schema_migrations')
  AND tablename NOT LIKE 'checkpoint%%' ORDER BY 1
"""


async def state(h: Harness) -> dict[str, str]:
    """Every business table's rows, as a digest per table: what the database holds, not what a tool said
    (the ledger, the events and the checkpoints record every call, so they are left out)."""
    out = {}
    for (table,) in await fetch(h, TABLES):
        rows = await fetch(h, f"SELECT t::text FROM {table} t ORDER BY 1")
        out[table] = hashlib.sha256(json.dumps([r[0] for r in rows]).encode()).hexdigest()
    return out


def says_already(result) -> bool:
    return result.outcome in (Outcome.APPLIED, Outcome.REPLAYED) and "already" in result.content


@pytest.mark.parametrize("domain, tool", writing_tools())
async def test_c50_every_tool_answers_already_only_for_the_arguments_it_holds(domain, tool):
    planned = first_planned_call(domain, tool)
    assert planned is not None, f"{domain.name}: no scenario calls {tool}; add one so that this walk reaches it"
    scenario, step, index = planned
    async with await Harness.open(purpose="test", domain=domain) as h:
        sg = preset("full")
        script = scenario.clean().script(await h.create_customers(scenario, sg))
        node, thread, tenant = h.node(sg), f"c50-{tool}", scenario.tenant_id
        before = [*script[:step], script[step][:index]]
        for n, calls in enumerate(c for c in before if c):  # what the scenario does before this call
            await node.run_batch([{"name": c.tool, "args": c.args, "id": f"pre-{n}-{k}", "type": "tool_call"}
                                  for k, c in enumerate(calls)], thread_id=thread, tenant_id=tenant)
        args = script[step][index].args

        async def send(arguments: dict, call_id: str):
            batch = await node.run_batch(call(tool, arguments, call_id), thread_id=thread, tenant_id=tenant)
            return batch.results[0]

        first = await send(args, "c50-first")
        assert first.outcome is Outcome.APPLIED, first.content
        held = await state(h)

        same = await send(args, "c50-same")  # another call id: the ledger does not know it, the natural key may
        if says_already(same) or same.outcome is Outcome.FAILED:
            assert await state(h) == held, same.content  # a repeat answered from what is there changes nothing
        if says_already(same):
            echoed = {k: v for k, v in (same.result or {}).items() if k in args}
            assert echoed == {k: args[k] for k in echoed}, same.content  # it names the arguments it holds
        held = await state(h)  # a tool that is no natural key's (ApplyCredit) applied again: a new state

        other = await send(other_arguments(args), "c50-other")
        assert not says_already(other), f"{tool} answered {other.content} to other arguments than it holds"
        if other.outcome is Outcome.FAILED:
            assert await state(h) == held, other.content
        if says_already(same):  # the key is held: other arguments are a conflict, naming what is held
            assert other.content.startswith("FAILED [conflict]: ") and "already" in other.content, other.content
