"""Each fault injects what it claims, by its real mechanism, and only into its own episode.

Assertions read the database, the provider's records, the server's own views (pg_stat_activity,
pg_locks) and the messages the model really sent."""

from __future__ import annotations

import asyncio
import dataclasses

import psycopg
import pytest
from langchain_core.messages import AIMessage

from agentlab.core.errors import ProviderTimeout
from agentlab.core.safeguards import preset
from agentlab.domains.billing.tools import charge_dedupe_key
from agentlab.lab.faults import FAMILIES, FAULTS, CrashAfterCommit, CrashAfterProviderCall, CrashMidNode, check_catalog
from agentlab.lab.invariants import count_by_kind
from agentlab.lab.runner import Lab
from conftest import fetch, scalar


@pytest.fixture
async def lab(harness):
    async with Lab(harness) as lab:
        yield lab


def first_batch(run) -> list[dict]:
    return next(m for m in run.episode.messages if isinstance(m, AIMessage) and m.tool_calls).tool_calls


def sent_args(run, tool: str) -> list:
    return [tc["args"] for m in run.episode.messages if isinstance(m, AIMessage) for tc in m.tool_calls
            if tc["name"] == tool]


async def sqlstates(harness, thread_id: str) -> set[str]:
    await harness.events.flush()
    rows = await fetch(harness, "SELECT DISTINCT sqlstate FROM events WHERE thread_id = %s AND sqlstate IS NOT NULL",
                       (thread_id,))
    return {r[0] for r in rows}


def test_the_catalog_covers_the_twelve_kinds_of_fault():
    check_catalog()
    assert len(FAMILIES) == 12
    assert {f.family for f in FAULTS.values()} >= set(FAMILIES)


# ---------------------------------------------------------------- hallucinated arguments

async def test_wrong_type_the_model_sends_a_decimal_amount_then_the_fix(lab):
    run = await lab.run("wrong_type", "full", scenario="refund")
    amounts = [a["amount_cents"] for a in sent_args(run, "ApplyCredit")]
    assert amounts[0] == 25.0 and isinstance(amounts[0], float)
    assert amounts[-1] == 2500 and run.violations == []


async def test_wrong_type_without_validation_deducts_the_wrong_amount(lab, harness):
    run = await lab.run("wrong_type", "naive", scenario="refund")
    cid = run.episode.customer_ids[0]
    assert await scalar(harness, "SELECT credit_cents FROM lax.customers WHERE id = %s", (cid,)) == 5000 - 25
    assert count_by_kind(run.violations)["balance_mismatch"] == 1


async def test_negative_amount_raises_the_balance_without_validation(lab, harness):
    run = await lab.run("negative_amount", "constraints", scenario="invoice")
    assert sent_args(run, "ApplyCredit")[0]["amount_cents"] == -4000
    cid = run.episode.customer_ids[0]
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = %s", (cid,)) == 8000


async def test_stray_quote_is_sent_as_text(lab):
    run = await lab.run("stray_quote", "full", scenario="refund")
    ids = [tc["args"]["customer_id"] for tc in first_batch(run)]
    assert any(isinstance(i, str) and i.endswith("'") for i in ids)
    assert run.violations == []


async def test_other_tenant_id_names_a_customer_of_another_tenant_created_by_the_episode(lab, harness):
    run = await lab.run("other_tenant_id", "ledger", scenario="refund")
    own, other = run.episode.customer_ids
    assert await scalar(harness, "SELECT tenant_id FROM customers WHERE id = %s", (other,)) == "globex"
    assert sent_args(run, "ApplyCredit")[0]["customer_id"] == other
    # without tenant isolation the call goes through: the other tenant's balance moves
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = %s", (other,)) == 2500
    assert count_by_kind(run.violations)["cross_tenant_effect"] == 1


# ---------------------------------------------------------------- constraints

async def test_check_violation_reaches_the_check_constraint(lab, harness):
    run = await lab.run("check_violation", "full", scenario="refund")
    assert sent_args(run, "ApplyCredit")[0]["amount_cents"] == 6000  # opening 5000 + 1000
    assert "23514" in await sqlstates(harness, run.episode.thread_id)
    naive = await lab.run("check_violation", "naive", scenario="refund")
    cid = naive.episode.customer_ids[0]
    assert await scalar(harness, "SELECT credit_cents FROM lax.customers WHERE id = %s", (cid,)) == -1000


async def test_unique_violation_repeats_a_natural_key(lab, harness):
    run = await lab.run("unique_violation", "full", scenario="invoice")
    assert len(sent_args(run, "CreateInvoice")) == 2
    assert "23505" in await sqlstates(harness, run.episode.thread_id)
    naive = await lab.run("unique_violation", "naive", scenario="invoice")
    cid = naive.episode.customer_ids[0]
    assert await scalar(harness, "SELECT count(*) FROM lax.invoices WHERE customer_id = %s", (cid,)) == 2


async def test_fk_violation_names_an_invoice_that_does_not_exist(lab, harness):
    run = await lab.run("fk_violation", "ledger", scenario="refund")  # constraints on, no tenant isolation
    invented = sent_args(run, "CreateCreditMemo")[0]["invoice_id"]
    assert await scalar(harness, "SELECT count(*) FROM invoices WHERE id = %s", (invented,)) == 0
    assert "23503" in await sqlstates(harness, run.episode.thread_id)
    assert (await lab.run("fk_violation", "full", scenario="refund")).violations == []
    naive = await lab.run("fk_violation", "naive", scenario="refund")
    cid = naive.episode.customer_ids[0]
    assert await fetch(harness, "SELECT invoice_id FROM lax.credit_memos WHERE customer_id = %s", (cid,)) == [
        (sent_args(naive, "CreateCreditMemo")[0]["invoice_id"],)]


# ---------------------------------------------------------------- locks and timeouts

async def test_lock_timeout_a_second_session_holds_the_row(lab, harness):
    run = await lab.run("lock_timeout", "full", scenario="refund")
    assert run.notes["waiter_seen"] and run.notes["locked_customer"] == run.episode.customer_ids[0]
    assert "55P03" in await sqlstates(harness, run.episode.thread_id)  # the node's lock_timeout fired
    assert run.violations == []


async def test_lock_holder_really_holds_a_row_lock(harness):
    lab = Lab(harness)
    fault = FAULTS["lock_timeout"]
    async with lab:
        run = await _bare_run(lab, harness, fault)
        await fault.arm(run)
        try:
            async with await psycopg.AsyncConnection.connect(harness.url, autocommit=True) as other:
                with pytest.raises(psycopg.errors.LockNotAvailable):
                    await other.execute("SELECT 1 FROM customers WHERE id = %s FOR UPDATE NOWAIT",
                                        (run.customer_ids[0],))
                # only the episode's own customer is locked
                await other.execute("SELECT 1 FROM customers WHERE id = 1 FOR UPDATE NOWAIT")
        finally:
            run.background[0].cancel()
            await fault.disarm(run)


async def test_statement_timeout_a_trigger_keeps_the_update_busy(lab, harness):
    run = await lab.run("statement_timeout", "full", scenario="refund")
    assert run.notes["slow_statement_seen"]
    assert "57014" in await sqlstates(harness, run.episode.thread_id)  # the statement timeout fired
    assert run.violations == []
    assert await scalar(harness, "SELECT count(*) FROM chaos_slow_customers") == 0  # lifted afterwards


async def test_statement_timeout_runs_at_the_labs_scale_under_every_preset(lab):
    fault = FAULTS["statement_timeout"]
    run = await lab.run(fault, "full", scenario="invoice")
    assert (run.preset, run.safeguards.statement_timeout_ms) == ("full", fault.statement_timeout_ms)
    assert run.safeguards.replace(statement_timeout_ms=2000, name="full") == preset("full")  # nothing else changed
    naive = await lab.run(fault, "naive", scenario="invoice")
    assert naive.safeguards == preset("naive")  # no timeouts: nothing to scale
    assert run.notes["slow_s"] == naive.notes["slow_s"] == fault.statement_timeout_ms / 1000 + fault.margin_s


async def test_slow_statement_touches_only_the_episodes_customer(harness):
    lab = Lab(harness)
    fault = FAULTS["statement_timeout"]
    async with lab:
        run = await _bare_run(lab, harness, fault)
        await fault.arm(run)
        try:
            async with await psycopg.AsyncConnection.connect(harness.url, autocommit=True) as other:
                await other.execute("SET statement_timeout = '300ms'")
                await other.execute("UPDATE customers SET credit_cents = credit_cents WHERE id = 1")  # not slowed
                with pytest.raises(psycopg.errors.QueryCanceled):
                    await other.execute("UPDATE customers SET credit_cents = credit_cents WHERE id = %s",
                                        (run.customer_ids[0],))
        finally:
            await fault.disarm(run)


async def test_the_lock_holder_waits_for_the_episode_however_slow_and_lets_go_when_it_ends(harness):
    """A loaded machine may bring the episode to the locked row late: the holder keeps the lock until the
    episode reaches it or ends (the fault's disarm tells it), not until a clock of its own runs out; told, it
    commits at once, without having seen a waiter."""
    from agentlab.lab.nemesis.base import EPISODE_OVER, WAIT_CAP_S

    lab = Lab(harness)
    fault = FAULTS["lock_timeout"]
    async with lab:
        run = await _bare_run(lab, harness, fault)
        await fault.arm(run)
        holder = run.background[0]
        assert WAIT_CAP_S >= 60 and not holder.done() and EPISODE_OVER in run.notes
        await fault.disarm(run)  # the episode is over without ever touching the row
        assert holder.done() and "waiter_seen" not in run.notes and EPISODE_OVER not in run.notes
        async with await psycopg.AsyncConnection.connect(harness.url, autocommit=True) as other:
            await other.execute("SELECT 1 FROM customers WHERE id = %s FOR UPDATE NOWAIT", (run.customer_ids[0],))


async def _bare_run(lab, harness, fault):
    """An EpisodeRun with its customers, for arming a fault without running the graph."""
    import random

    from agentlab.core.outbox import OutboxWorker
    from agentlab.core.safeguards import preset
    from agentlab.domains.billing.scenarios import create_customers, get_scenario
    from agentlab.lab.runner import EpisodeRun

    await lab.start()
    await lab.install(fault)
    sg, sc = preset("full"), get_scenario("refund")
    async with harness.pool.connection() as conn:
        ids = await create_customers(conn, sc.customers, sg.schema)
    node = lab.process.node(sg)
    return EpisodeRun(harness, lab.process, fault, sg, sc, 0, "t-bare", ids, node,
                      OutboxWorker(lab.process.pool, harness.provider, thread_id="t-bare"), random.Random(0))


# ---------------------------------------------------------------- killed backend and crashes

async def test_backend_killed_terminates_the_nodes_own_backend(lab, harness):
    run = await lab.run("backend_killed", "full", scenario="refund")
    pid = run.notes["killed_pid"]
    assert run.notes["terminated"]
    assert await scalar(harness, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)) == 0
    await harness.events.flush()
    assert await scalar(harness, "SELECT count(*) FROM events WHERE thread_id = %s AND outcome = 'infrastructure_error'",
                        (run.episode.thread_id,)) >= 1
    assert run.violations == []


@dataclasses.dataclass(frozen=True)
class _Probe:
    """Wraps a crash fault: at the restart, reads what the dead process left behind."""

    async def before_restart(self, run):
        await super().before_restart(run)
        cid = run.customer_ids[0]
        snapshot = await run.process.graph(run.safeguards).aget_state({"configurable": {"thread_id": run.thread_id}})
        last = snapshot.values["messages"][-1]
        run.notes["at_restart"] = {
            "next": snapshot.next,
            "last_is_unanswered_batch": isinstance(last, AIMessage) and bool(last.tool_calls),
            "invoices": await scalar(run.harness, f"SELECT count(*) FROM {run.schema}.invoices WHERE customer_id = %s",
                                     (cid,)),
            "payments": await scalar(run.harness, "SELECT count(*) FROM provider.payments WHERE customer = %s",
                                     (f"cus_{cid}",)),
            "outbox": [r[0] for r in await fetch(run.harness, "SELECT status FROM outbox WHERE thread_id = %s",
                                                 (run.thread_id,))],
        }


@dataclasses.dataclass(frozen=True)
class ProbedCrashAfterCommit(_Probe, CrashAfterCommit):
    pass


@dataclasses.dataclass(frozen=True)
class ProbedCrashMidNode(_Probe, CrashMidNode):
    pass


@dataclasses.dataclass(frozen=True)
class ProbedCrashAfterProviderCall(_Probe, CrashAfterProviderCall):
    pass


def probed(cls, name):
    f = FAULTS[name]
    return cls(**{fl.name: getattr(f, fl.name) for fl in dataclasses.fields(f)})


async def test_crash_before_checkpoint_commits_the_batch_and_loses_the_step(lab):
    run = await lab.run(probed(ProbedCrashAfterCommit, "crash_before_checkpoint"), "full", scenario="invoice")
    seen = run.notes["at_restart"]
    assert run.crashed
    assert seen["invoices"] == 1  # the business commit happened
    assert seen["next"] == ("tools",) and seen["last_is_unanswered_batch"]  # the checkpoint never saw it
    assert run.violations == []  # the ledger replayed it in the new process


async def test_crash_before_checkpoint_without_a_ledger_applies_twice(lab, harness):
    run = await lab.run("crash_before_checkpoint", "naive", scenario="invoice")
    cid = run.episode.customer_ids[0]
    assert await scalar(harness, "SELECT count(*) FROM lax.invoices WHERE customer_id = %s", (cid,)) == 2


async def test_crash_mid_node_rolls_back_and_resumes(lab):
    run = await lab.run(probed(ProbedCrashMidNode, "crash_mid_node"), "full", scenario="invoice")
    seen = run.notes["at_restart"]
    assert run.crashed and seen["invoices"] == 0 and seen["next"] == ("tools",)
    assert run.violations == []


async def test_crash_mid_node_in_autocommit_keeps_the_first_call(lab):
    run = await lab.run(probed(ProbedCrashMidNode, "crash_mid_node"), "naive", scenario="invoice")
    assert run.notes["at_restart"]["invoices"] == 1
    assert count_by_kind(run.violations)["duplicate_invoice"] == 1


async def test_the_resume_runs_in_another_process_with_other_pools(lab):
    await lab.run("crash_mid_node", "full", scenario="refund")
    assert lab.restarted is not None and lab.restarted is not lab.process
    assert lab.restarted.pool is not lab.process.pool
    assert lab.restarted.checkpointer_pool is not lab.process.checkpointer_pool


# ---------------------------------------------------------------- the provider

async def test_provider_timeout_after_success_is_scoped_to_the_customer(harness):
    provider = harness.provider
    provider.fail_next("timeout_after_success", customer_id=901)
    other = await provider.create_charge(902, 100, idempotency_key="k-902")  # another customer: untouched
    assert not other["replayed"]
    with pytest.raises(ProviderTimeout):
        await provider.create_charge(901, 100, idempotency_key="k-901")
    assert len(await provider.payments(901)) == 1  # the work was done before the timeout
    assert provider.clear_faults(customer_id=901) == 0


async def test_provider_timeout_charges_once_with_the_outbox_twice_inline(lab):
    full = await lab.run("provider_timeout", "full", scenario="invoice")
    assert full.episode.drain.retried >= 1 and full.violations == []
    inline = await lab.run("provider_timeout", "ledger", scenario="invoice")
    assert count_by_kind(inline.violations)["payment_count"] == 1
    assert len(await lab.harness.provider.payments(inline.episode.customer_ids[0])) == 2


async def test_worker_crash_leaves_the_row_pending_after_the_payment(lab):
    run = await lab.run(probed(ProbedCrashAfterProviderCall, "worker_crash"), "full", scenario="invoice")
    seen = run.notes["at_restart"]
    assert run.worker_crashed and seen["payments"] == 1 and seen["outbox"] == ["pending"]
    assert run.violations == []
    assert [r[0] for r in await fetch(lab.harness, "SELECT status FROM outbox WHERE thread_id = %s",
                                      (run.episode.thread_id,))] == ["dispatched"]


async def test_worker_crash_inline_is_the_tools_node_dying_after_the_provider_call(lab):
    run = await lab.run(probed(ProbedCrashAfterProviderCall, "worker_crash"), "ledger", scenario="invoice")
    assert run.crashed and run.notes["at_restart"]["payments"] == 1 and run.notes["at_restart"]["invoices"] == 0
    assert len(await lab.harness.provider.payments(run.episode.customer_ids[0])) == 2


async def test_provider_forgot_key_moves_the_clock_past_retention(lab):
    provider = lab.harness.provider
    run = await lab.run("provider_forgot_key", "full", scenario="invoice")
    assert run.notes["clock_advanced_s"] > provider.retention_s and run.violations == []
    cid = run.episode.customer_ids[0]
    # the provider has really forgotten the key: the same key now makes a new payment (only the
    # worker's look-up by reference kept the episode at one)
    again = await provider.create_charge(cid, 8000, idempotency_key=charge_dedupe_key(cid, "2026-03-01"),
                                         reference="probe")
    assert not again["replayed"]


# ---------------------------------------------------------------- scenario fault

async def test_wrong_order_sends_the_charge_before_the_invoice(lab):
    run = await lab.run("wrong_order", "transaction")
    assert [tc["name"] for tc in first_batch(run)] == ["QueueCharge", "CreateInvoice"]
    assert count_by_kind(run.violations)["half_applied_batch"] == 1
    assert (await lab.run("wrong_order", "savepoints")).violations == []


async def test_concurrent_episodes_do_not_feel_each_others_faults(lab):
    """A provider fault and a killed backend in one episode, clean episodes beside them."""
    runs = await asyncio.gather(
        lab.run("provider_timeout", "full", scenario="invoice"),
        lab.run("backend_killed", "full", scenario="invoice"),
        *(lab.run("none", "full", scenario="invoice", seed=s) for s in range(4)),
    )
    assert all(r.violations == [] for r in runs)
    for clean in runs[2:]:
        assert clean.episode.drain.retried == 0 and clean.episode.error is None
