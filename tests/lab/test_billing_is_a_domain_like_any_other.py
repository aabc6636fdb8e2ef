"""Billing gets nothing by its name: its invariants and the faults that fit it come through the domain API,
so the same domain under another name is checked and offered faults exactly as billing is."""

from __future__ import annotations

import dataclasses

from agentlab.domains.billing import DOMAIN as BILLING
from agentlab.lab.faults import FAULTS, GENERIC_FAULTS, fault_scenarios, fault_table, faults_for, get_fault
from agentlab.lab.invariants import KINDS, check_episode, count_by_kind
from agentlab.lab.runner import Lab

RENAMED = dataclasses.replace(BILLING, name="ledgerbook")


def test_billing_lists_the_catalog_and_a_renamed_copy_gets_the_same_faults_and_scenarios():
    assert faults_for(BILLING) == tuple(FAULTS) == faults_for(RENAMED)
    assert fault_table(RENAMED) == fault_table(BILLING)
    for name in faults_for(RENAMED):
        fault = get_fault(name, RENAMED)
        assert fault_scenarios(fault, RENAMED) == fault.scenarios


def test_a_domain_placing_a_generic_fault_keeps_its_order_and_the_others_come_first():
    placed = dataclasses.replace(BILLING, name="placed", faults=("wrong_order", "crash_mid_node"))
    assert faults_for(placed) == (*(g for g in GENERIC_FAULTS if g != "crash_mid_node"), "wrong_order", "crash_mid_node")


def test_billings_invariants_are_its_domain_invariants_one_per_state_kind():
    kinds = [inv.kind for inv in BILLING.invariants]
    assert set(kinds) <= set(KINDS) and len(kinds) == len(set(kinds)) == 9
    assert {"unanswered_call", "leak", "ledger_mismatch", "half_applied_batch"}.isdisjoint(kinds)


async def test_a_renamed_billing_reports_the_same_violations_from_the_same_broken_database(harness):
    """An episode that breaks billing's rules (other_tenant_id under ledger: no isolation below full), checked
    once as billing and once as the renamed copy: the same violations, in the same order."""
    async with Lab(harness) as lab:
        run = await lab.run("other_tenant_id", "ledger", scenario="refund")
    as_billing = await check_episode(harness.pool, run.episode, run.scenario, run.safeguards, BILLING)
    as_renamed = await check_episode(harness.pool, run.episode, run.scenario, run.safeguards, RENAMED)
    assert as_billing == as_renamed == run.violations
    assert count_by_kind(as_billing)["cross_tenant_effect"] == 1


async def test_a_domain_without_billings_invariants_gets_the_generic_checks_only(harness):
    """A clean refund under full, then the provider is made to hold its refund twice behind the kit's back.
    Billing counts refunds per customer; a copy of billing with no invariants of its own gets the generic
    per-intent check instead, and none of billing's kinds."""
    async with Lab(harness) as lab:
        run = await lab.run("none", "full", scenario="refund")
    assert run.violations == []
    ep = run.episode
    async with harness.pool.connection() as conn:
        key, = await (await conn.execute("SELECT dedupe_key FROM outbox WHERE thread_id = %s AND status = 'dispatched'",
                                         (ep.thread_id,))).fetchone()
        await conn.execute("INSERT INTO provider.payments (id, kind, customer, amount_cents, reference, created_at) "
                           "SELECT 're_again', kind, customer, amount_cents, reference, now() FROM provider.payments "
                           "WHERE reference = %s", (key,))
    bare = dataclasses.replace(BILLING, name="bare", invariants=())
    as_bare = await check_episode(harness.pool, ep, run.scenario, run.safeguards, bare)
    as_billing = await check_episode(harness.pool, ep, run.scenario, run.safeguards, BILLING)
    assert [(v.kind, v.detail) for v in as_bare] == [("payment_count", f"intent {key}: 2 payments at the provider, intended 1")]
    assert [(v.kind, v.detail) for v in as_billing] == [
        ("payment_count", f"customer {ep.customer_ids[0]}: 2 provider_refunds, intended 1")]
