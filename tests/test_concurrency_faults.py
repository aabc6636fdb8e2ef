"""The concurrency fault family: two conversations at once on one customer, each anomaly forced by a
rendezvous between real transactions, caught by invariants read from the database, held by ``full``.
"""

from __future__ import annotations

import asyncio

import pytest

from agentlab.core.safeguards import preset
from agentlab.domains.billing.concurrency import check_concurrency
from agentlab.lab.concurrency import CONCURRENCY_FAULTS, KINDS, Rendezvous
from agentlab.lab.faults import CONCURRENCY_FAMILY, FAULTS, get_fault
from agentlab.lab.runner import Lab
from conftest import fetch, scalar

NO_LOCKS = preset("full").replace(row_locks=False, name="full-no-row-locks")
RR = NO_LOCKS.replace(isolation_level="repeatable read", name="repeatable-read")
SER = NO_LOCKS.replace(isolation_level="serializable", name="serializable")
NO_RUN_LOCK = preset("full").replace(run_lock=False, name="full-no-run-lock")

# fault -> (a weaker setting, the kind it must show there)
BREAKS = {
    "same_thread_runs": (NO_RUN_LOCK, "forked_thread"),
    "double_submit": (preset("naive"), "paid_twice"),
    "lost_update": (NO_LOCKS, "lost_update"),
    "check_then_act": (NO_LOCKS, "cap_exceeded"),
    "write_skew": (RR, "cap_exceeded"),
}


def test_the_family_is_selectable_by_name_and_not_in_the_default_table():
    assert CONCURRENCY_FAMILY == tuple(CONCURRENCY_FAULTS) == tuple(BREAKS)
    assert not set(CONCURRENCY_FAMILY) & set(FAULTS)  # the default chaos rows are unchanged
    assert all(get_fault(name).conversations == 2 for name in CONCURRENCY_FAMILY)
    assert set(KINDS) == {"paid_twice", "lost_update", "cap_exceeded", "forked_thread"}


@pytest.mark.parametrize("name", CONCURRENCY_FAMILY)
async def test_each_anomaly_shows_under_a_weaker_setting_and_not_under_full(harness, name):
    weaker, kind = BREAKS[name]
    async with Lab(harness) as lab:
        broken = await lab.run(name, weaker, seed=3)
        held = await lab.run(name, "full", seed=3)
    assert kind in {v.kind for v in broken.violations}, broken.violations
    assert held.violations == [] and held.episode.error is None, (held.violations, held.episode.error)
    assert "A at its act" in " ".join(broken.notes["rendezvous"])  # the interleaving was forced, not hoped for


async def test_lost_update_in_numbers_read_from_the_database(harness):
    async with Lab(harness) as lab:
        runs = {sg.name: await lab.run("lost_update", sg, seed=0) for sg in (NO_LOCKS, preset("full"), RR, SER)}
    for name, run in runs.items():
        cid = run.episode.customer_ids[0]
        credit = await scalar(harness, "SELECT credit_cents FROM customers WHERE id = %s", (cid,))
        redeemed = await fetch(harness, "SELECT amount_cents FROM limits.credit_redemptions WHERE customer_id = %s "
                                        "ORDER BY amount_cents", (cid,))
        assert [a for a, in redeemed] == [1500, 2000], name  # both redemptions applied
        if name == NO_LOCKS.name:
            assert credit in (3000, 3500)  # the last writer's own result: one deduction lost
        else:
            assert credit == 1500, name  # 5,000 - 2,000 - 1,500


async def test_write_skew_passes_repeatable_read_and_stops_at_serializable_and_at_the_row_lock(harness):
    async with Lab(harness) as lab:
        totals = {}
        for sg in (NO_LOCKS, RR, SER, preset("full")):
            run = await lab.run("write_skew", sg, seed=0)
            cid = run.episode.customer_ids[0]
            totals[sg.name] = await scalar(harness, "SELECT sum(amount_cents) FROM refunds WHERE customer_id = %s",
                                           (cid,))
    assert totals == {NO_LOCKS.name: 6000, RR.name: 6000, SER.name: 3000, "full": 3000}


@pytest.mark.parametrize("level", [RR, SER], ids=["repeatable_read", "serializable"])
async def test_the_late_writer_is_refused_with_40001_and_the_graph_retries_it(harness, level):
    async with Lab(harness) as lab:
        run = await lab.run("check_then_act", level, seed=0)
    await harness.events.flush()
    threads = run.notes["threads"]
    retried = await fetch(harness, "SELECT sqlstate FROM events WHERE thread_id = ANY(%s) AND outcome = "
                                   "'infrastructure_error'", (threads,))
    assert [s for s, in retried] == ["40001"]  # one conversation's batch, once; its retry read the new balance
    assert run.violations == []
    cid = run.episode.customer_ids[0]
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = %s", (cid,)) == 2000
    assert await scalar(harness, "SELECT count(*) FROM limits.credit_redemptions WHERE customer_id = %s", (cid,)) == 1


async def test_same_seed_same_table(harness):
    async with Lab(harness) as lab:
        def table(runs):
            return [(r.fault, r.preset, sorted(v.kind for v in r.violations)) for r in runs]

        first = [await lab.run(f, sg, seed=5) for f in CONCURRENCY_FAMILY for sg in (preset("naive"), NO_LOCKS)]
        second = [await lab.run(f, sg, seed=5) for f in CONCURRENCY_FAMILY for sg in (preset("naive"), NO_LOCKS)]
    assert table(first) == table(second)


async def test_a_rendezvous_never_waits_past_its_bound(harness):
    gate = Rendezvous(harness.pool, ("A", "B"), lambda q: True, timeout_s=0.2)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await gate.arrive("A")  # B never comes
    assert 0.19 <= loop.time() - t0 < 1.5
    assert gate.log[-1] == "A goes on (timeout)"
    gate.leave("A")
    t0 = loop.time()
    await gate.arrive("B")  # A has ended: no wait at all
    assert loop.time() - t0 < 0.15 and gate.log[-1].startswith("B goes on") and "timeout" not in gate.log[-1]


async def test_the_invariants_read_a_forked_chain_and_a_lost_update_from_the_database(harness):
    async with harness.pool.connection() as conn:
        cid = (await (await conn.execute(
            "INSERT INTO customers (tenant_id, name, credit_cents) VALUES ('acme', 'x', 1000) RETURNING id")).fetchone())[0]
        await conn.execute("INSERT INTO limits.credit_redemptions (tenant_id, customer_id, amount_cents, balance_after_cents) "
                           "VALUES ('acme', %s, 300, 700)", (cid,))
        for ckpt in ("a", "b"):  # two roots on one thread
            await conn.execute("INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, checkpoint, metadata) "
                               "VALUES ('forked', '', %s, '{}', '{}')", (ckpt,))
    found = await check_concurrency(harness.pool, "public", [cid], {cid: 1000}, ["forked"])
    assert sorted(v.kind for v in found) == ["forked_thread", "lost_update"]


def test_serialization_failures_and_deadlocks_are_retried_by_the_graphs_policy_with_a_cap():
    import psycopg

    from agentlab.core.errors import is_infrastructure
    from agentlab.core.graph import RETRY_ATTEMPTS, retry_policy

    assert is_infrastructure(psycopg.errors.SerializationFailure("could not serialize access"))  # 40001
    assert is_infrastructure(psycopg.errors.DeadlockDetected("deadlock detected"))  # 40P01
    assert retry_policy().max_attempts == RETRY_ATTEMPTS == 3


def test_an_isolation_level_needs_a_transaction_and_is_one_of_three():
    from agentlab.core.safeguards import ISOLATION_LEVELS

    assert ISOLATION_LEVELS == ("read committed", "repeatable read", "serializable")
    with pytest.raises(ValueError, match="isolation_level must be one of"):
        preset("full").replace(isolation_level="snapshot")
    with pytest.raises(ValueError, match="needs a transaction"):
        preset("naive").replace(isolation_level="serializable")
    assert preset("full").isolation_level == "read committed" and preset("full").row_locks and preset("full").run_lock
    assert not any(preset(p).row_locks or preset(p).run_lock for p in ("naive", "constraints", "ledger"))


def test_the_rendezvous_notes_read_the_same_whichever_party_reached_the_barrier_first():
    """Notebook 18 was seen to print "B at its act" before "A at its act": both met at the barrier
    before either went on, and the event loop ran B's arrival first. The account lists such arrivals in the
    parties' order; what happened after them keeps its place."""
    from agentlab.lab.concurrency import Rendezvous

    gate = Rendezvous(None, ("A", "B"), lambda query: False)
    gate.log = ["B at its act", "A at its act", "A goes on (all arrived)", "B goes on (the other's act committed first)"]
    assert gate.account() == ["A at its act", "B at its act", "A goes on (all arrived)",
                              "B goes on (the other's act committed first)"]
    gate.log = ["A at its act", "A goes on (timeout)", "B at its act", "B goes on (all arrived)"]
    assert gate.account() == gate.log  # an arrival after someone went on stays where it happened


async def test_the_same_request_twice_on_one_thread_refuses_b_on_every_run(harness):
    """Notebook 18's table showed A refused once instead of B: the two runs asked for the thread's lease at
    the same moment and a loaded machine let B's request reach the server first. A asks first, B once A
    holds the lease: B is refused, one redemption is stored, on every run."""
    async with Lab(harness) as lab:
        for seed in range(3):
            run = await lab.run("same_thread_runs", preset("full"), seed=seed)
            assert run.notes["refused"] == ["B"], run.notes
            cid = run.episode.customer_ids[0]
            assert await scalar(harness, "SELECT count(*) FROM limits.credit_redemptions WHERE customer_id = %s",
                                (cid,)) == 1
