"""The invariant checker must be able to fail: every kind is caught on a deliberately broken episode,
and a clean episode has none. Broken states are built directly (records and messages), and once
through the database."""

from __future__ import annotations

import dataclasses

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from agentlab.core.messages import BATCH_ROLLED_BACK, NOT_APPLIED_TEMPLATE
from agentlab.core.safeguards import preset
from agentlab.domains.billing.scenarios import get_scenario
from agentlab.lab.invariants import KINDS, CustomerRecords, check_episode, check_state, count_by_kind
from agentlab.lab.tenancy import CrossTenantEffect, with_foreign_customer
from agentlab.runtime.harness import Episode
from conftest import fetch

REFUND = get_scenario("refund").clean()  # memo RMA-1042, deduct 2500 of 5000, refund RMA-1042
CID = 101


def ai(*calls, text=""):
    return AIMessage(content=text, tool_calls=[{"name": n, "args": a, "id": i, "type": "tool_call"} for i, n, a in calls])


def ok(call_id, name, content='{"ok":true}'):
    return ToolMessage(content, tool_call_id=call_id, name=name, status="success")


def not_applied(call_id, name):
    return ToolMessage(NOT_APPLIED_TEMPLATE.format(reason=BATCH_ROLLED_BACK), tool_call_id=call_id, name=name,
                       status="error")


def clean_history():
    memo = {"customer_id": CID, "reference": "RMA-1042", "amount_cents": 2500, "reason": "returned order"}
    return [
        HumanMessage("refund"),
        ai(("m1", "CreateCreditMemo", memo), ("a1", "ApplyCredit", {"customer_id": CID, "amount_cents": 2500}),
           ("r1", "QueueRefund", {"customer_id": CID, "reference": "RMA-1042", "amount_cents": 2500})),
        ok("m1", "CreateCreditMemo"), ok("a1", "ApplyCredit"), ok("r1", "QueueRefund"),
        AIMessage(content="All steps are done."),
    ]


def clean_records(**changes):
    r = CustomerRecords(CID, "acme", 2500, (), ("RMA-1042",), 0, ("RMA-1042",), 0, 1)
    return {CID: dataclasses.replace(r, **changes)}


def episode(messages=None, ids=(CID,)):
    ep = Episode("refund", "full", "t-inv", 0, list(ids), "public", "acme")
    ep.messages = clean_history() if messages is None else messages
    return ep


def kinds(ep=None, records=None, ledger=None, safeguards="full", scenario=REFUND):
    sg = preset(safeguards)
    ledger = {"m1", "a1", "r1"} if ledger is None and sg.ledger else ledger
    return count_by_kind(check_state(ep or episode(), scenario, sg, records or clean_records(), ledger))


def test_a_clean_episode_has_no_violation():
    assert sum(kinds().values()) == 0
    assert sum(kinds(safeguards="naive").values()) == 0


def test_duplicate_invoice_and_its_count():
    invoice = dataclasses.replace(REFUND.intended, invoices=(1,))
    scenario = dataclasses.replace(REFUND, intended=invoice)
    got = kinds(records=clean_records(invoices=("2026-03-01", "2026-03-01")), scenario=scenario)
    assert got["duplicate_invoice"] == 1 and got["record_count"] == 1


def test_negative_balance_is_also_a_mismatch():
    got = kinds(records=clean_records(credit_cents=-500))
    assert got["negative_balance"] == 1 and got["balance_mismatch"] == 1


def test_balance_that_rose_is_a_mismatch():
    assert kinds(records=clean_records(credit_cents=7500))["balance_mismatch"] == 1


def test_two_credit_memos_are_a_record_count_violation():
    assert kinds(records=clean_records(credit_memos=("RMA-1042", "RMA-1042")))["record_count"] == 1


@pytest.mark.parametrize("refunds", [0, 2])
def test_a_refund_paid_zero_or_twice_is_a_payment_count_violation(refunds):
    assert kinds(records=clean_records(provider_refunds=refunds))["payment_count"] == 1


def test_a_memo_naming_a_missing_invoice_is_a_dangling_reference():
    assert kinds(records=clean_records(dangling_memos=1))["dangling_reference"] == 1


def test_a_record_reported_created_but_not_stored():
    got = kinds(records=clean_records(credit_memos=()))
    assert got["applied_but_missing"] == 1


def test_a_record_stored_but_never_reported():
    msgs = clean_history()
    msgs[2] = not_applied("m1", "CreateCreditMemo")
    got = kinds(ep=episode(msgs), ledger={"a1", "r1"})
    assert got["unreported_effect"] == 1


def test_unanswered_and_doubly_answered_calls_and_stray_answers():
    msgs = clean_history()
    del msgs[4]  # r1 has no answer
    msgs.insert(3, ok("m1", "CreateCreditMemo"))  # m1 answered twice
    msgs.append(ok("zz", "ApplyCredit"))  # an answer to a call nobody made
    assert kinds(ep=episode(msgs), ledger={"m1", "a1", "r1"})["unanswered_call"] == 3


def test_a_raw_database_error_in_a_tool_message_is_a_leak():
    msgs = clean_history()
    msgs[3] = ToolMessage('CheckViolation: new row for relation "customers" violates check constraint '
                          '"customers_credit_nonnegative"', tool_call_id="a1", name="ApplyCredit", status="error")
    assert kinds(ep=episode(msgs), safeguards="naive")["leak"] == 1


def test_ledger_rows_must_match_applied_calls():
    got = kinds(ledger={"m1", "a1", "x9"})  # r1 applied without a row; x9 has a row, never reported applied
    assert got["ledger_mismatch"] == 2
    assert kinds(safeguards="savepoints")["ledger_mismatch"] == 0  # no ledger, nothing to compare


def test_a_half_applied_batch_counts_under_the_atomic_policy_only():
    msgs = clean_history()
    msgs[4] = ToolMessage("FAILED [not_found]: no customer has this id; check the customer id.", tool_call_id="r1",
                          name="QueueRefund", status="error")
    assert kinds(ep=episode(msgs), records=clean_records(refunds=(), provider_refunds=0),
                 ledger={"m1", "a1"})["half_applied_batch"] == 1
    assert kinds(ep=episode(msgs), records=clean_records(refunds=(), provider_refunds=0),
                 safeguards="validated")["half_applied_batch"] == 0  # the partial policy keeps what succeeded


def test_an_effect_on_another_tenants_customer():
    scenario = with_foreign_customer(REFUND, 0, 1)  # ApplyCredit names a customer of another tenant
    other = 202
    records = {**clean_records(), other: CustomerRecords(other, "globex", 2500, (), (), 0, (), 0, 0)}
    effect = CrossTenantEffect(other, "globex", "credit_change", 1, "credit 5000 -> 2500 cents")
    sg = preset("full")
    got = count_by_kind(check_state(episode(ids=(CID, other)), scenario, sg, records, {"m1", "a1", "r1"}, [effect]))
    assert got["cross_tenant_effect"] == 1
    assert got["balance_mismatch"] == 1  # the other customer was to be left untouched


async def test_the_checker_reads_cross_tenant_effects_from_the_database(harness):
    from agentlab.lab.runner import Lab

    async with Lab(harness) as lab:
        run = await lab.run("other_tenant_id", "ledger", scenario="refund")  # no tenant isolation below full
    kinds = [v for v in run.violations if v.kind == "cross_tenant_effect"]
    assert len(kinds) == 1 and "credit_change" in kinds[0].detail


def test_every_kind_has_a_test_above():
    tested = {"duplicate_invoice", "negative_balance", "balance_mismatch", "record_count", "payment_count",
              "dangling_reference", "applied_but_missing", "unreported_effect", "unanswered_call", "leak",
              "ledger_mismatch", "half_applied_batch", "cross_tenant_effect"}
    assert tested == set(KINDS)


async def test_the_checker_reads_a_broken_database(harness):
    """A clean full-preset episode, then the database is broken behind its back: the checker sees it."""
    from agentlab.lab.runner import Lab

    async with Lab(harness) as lab:
        run = await lab.run("none", "full", scenario="refund")
        assert run.violations == []
        ep, cid = run.episode, run.episode.customer_ids[0]
        async with harness.pool.connection() as conn:
            await conn.execute("ALTER TABLE customers DROP CONSTRAINT customers_credit_nonnegative")
            await conn.execute("UPDATE customers SET credit_cents = -1 WHERE id = %s", (cid,))
            await conn.execute("INSERT INTO credit_memos (tenant_id, customer_id, reference, amount_cents) "
                               "VALUES ('acme', %s, 'RMA-9', 100)", (cid,))
            await conn.execute("DELETE FROM tool_executions WHERE thread_id = %s AND tool_name = 'ApplyCredit'",
                               (ep.thread_id,))
            await conn.execute("INSERT INTO provider.payments (id, kind, customer, amount_cents, created_at) "
                               "VALUES ('re_x', 'refund', %s, 2500, now())", (f"cus_{cid}",))
        got = count_by_kind(await check_episode(harness.pool, ep, run.scenario, run.safeguards))
    assert got["negative_balance"] == 1 and got["balance_mismatch"] == 1
    assert got["record_count"] == 1 and got["unreported_effect"] == 1
    assert got["ledger_mismatch"] == 1 and got["payment_count"] == 1
    assert len(await fetch(harness, "SELECT 1 FROM customers WHERE id = %s", (cid,))) == 1
