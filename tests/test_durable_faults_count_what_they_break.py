"""The failure lab's faults beyond one transaction: under ``full`` nothing breaks; under the weaker setting
each case describes, the invariant checker counts the violation, read from the database, the provider
and the notifier. Behind a real PgBouncer (transaction mode) the killed-lock-holder fault holds as well.
"""

from __future__ import annotations

import pytest
from pooler import pgbouncer

from agentlab.core.domain import Violation
from agentlab.demos.payout_saga import notice_model, store_credit_payout
from agentlab.lab.durable_faults import (
    DURABLE_FAULTS,
    DURABLE_KINDS,
    DurableRun,
    durable_fault_table,
    get_durable_fault,
    run_durable_fault,
    without_pivot,
)
from agentlab.runtime.harness import Harness
from conftest import fetch

SAGA = store_credit_payout(notice_model())
NONE = dict.fromkeys(DURABLE_KINDS, 0)


async def test_a_killed_lock_holder_breaks_nothing_under_full_and_pays_twice_unfenced(harness):
    full = await run_durable_fault(harness, "lock_holder_killed", "full", saga=SAGA)
    assert full.notes["lock_holders"] == 1 and full.notes["terminated"] == [True]
    assert full.notes["a_outcome"].startswith("fenced") and full.notes["b_status"] == "compensated"
    assert full.counts() == NONE
    assert full.effects == {"status": "compensated", "steps": ["compensated", "compensated", "sent_but_unwound",
                                                               "failed"],
                            "credit_deducted_cents": 0, "refunds_at_provider": 0, "refunded_cents": 0,
                            "notices_sent": 1, "corrections_sent": 1}

    weak = await run_durable_fault(harness, "lock_holder_killed", "unfenced", saga=SAGA)
    assert weak.setting == "unfenced" and weak.notes["terminated"] == [True]
    assert weak.notes["a_outcome"] == "finished: completed"
    assert weak.counts() == {**NONE, "paid_twice": 1, "mixed_direction": 1, "false_correction": 1}
    assert weak.effects["steps"] == ["compensated", "compensated", "sent_but_unwound", "completed"]
    assert (weak.effects["credit_deducted_cents"], weak.effects["refunded_cents"]) == (0, 2000)
    sent = await harness.notifier.messages(f"customer-{weak.violations[0].thread_id.rsplit(':', 1)[1]}@example.com")
    assert [m["corrects"] is not None for m in sent] == [False, True]  # "on its way", then "it failed": false


async def test_an_abort_after_the_pivot_is_refused_under_full_and_pays_twice_without_a_pivot(harness):
    full = await run_durable_fault(harness, "abort_after_pivot", "full", saga=SAGA)
    assert full.notes == {"crashed_after_step": 4, "abort": "refused", "resume": "completed"}
    assert full.counts() == NONE
    assert (full.effects["credit_deducted_cents"], full.effects["refunds_at_provider"],
            full.effects["corrections_sent"]) == (2000, 1, 0)

    weak = await run_durable_fault(harness, "abort_after_pivot", "weaker", saga=SAGA)
    assert weak.setting == "no_pivot" and weak.notes["abort"] == "compensated"
    assert weak.counts() == {**NONE, "paid_twice": 1, "false_correction": 1}
    assert (weak.effects["credit_deducted_cents"], weak.effects["refunded_cents"]) == (0, 2000)
    assert not any(s.pivot for s in without_pivot(SAGA).steps) and any(s.pivot for s in SAGA.steps)


async def test_retention_racing_a_live_thread_leaves_it_under_full_and_loses_the_approval_unguarded(harness):
    full = await run_durable_fault(harness, "retention_races_thread", "full")
    assert full.notes["classified"] == "delete" and full.notes["retention"] == {"deleted": 0, "left_alone": 1}
    assert full.counts() == NONE
    assert full.effects["refunds_at_provider"] == 2 and full.effects["pending_approvals"] == 0

    weak = await run_durable_fault(harness, "retention_races_thread", "unguarded")
    assert weak.notes["retention"] == {"deleted": 1, "left_alone": 0}
    assert weak.notes["after_retention"]["checkpoints"] == 0 and weak.notes["after_retention"]["pending_approvals"] == 1
    assert weak.counts() == {**NONE, "approval_lost": 1, "payment_count": 1}
    assert weak.effects["refunds_at_provider"] == 0
    thread = weak.violations[0].thread_id
    # the reviewer's "approve" found no checkpoint: it started the thread over, which asks again
    assert weak.notes["approve"] == "ran" and weak.effects["pending_approvals"] == 2
    assert await fetch(harness, "SELECT status FROM approval_requests WHERE thread_id = %s", (thread,)) == [
        ("pending",), ("pending",)]


async def test_the_killed_lock_holder_fault_behind_pgbouncer_has_no_lock_to_kill_and_still_holds(database_url):
    with pgbouncer(database_url, pool_size=3) as url:
        h = await Harness.open(url, behind_pooler=True)
        try:
            full = await run_durable_fault(h, "lock_holder_killed", "full", saga=SAGA)
            assert full.notes["lock_holders"] == 0 and full.notes["a_outcome"].startswith("fenced")
            assert full.counts() == NONE
            weak = await run_durable_fault(h, "lock_holder_killed", "unfenced", saga=SAGA)
            assert weak.counts() == {**NONE, "paid_twice": 1, "mixed_direction": 1, "false_correction": 1}
        finally:
            await h.close()


async def test_the_table_runs_every_fault_both_ways(harness):
    table = await durable_fault_table(harness, saga=SAGA, faults=("abort_after_pivot",))
    assert list(table.index) == [("abort_after_pivot", "full"), ("abort_after_pivot", "no_pivot")]
    assert table.loc[("abort_after_pivot", "full")].sum() == 0
    assert table.loc[("abort_after_pivot", "no_pivot"), "paid_twice"] == 1


async def test_unknown_faults_settings_and_a_missing_saga_are_refused_by_name(harness):
    with pytest.raises(ValueError, match="choose one of: lock_holder_killed, abort_after_pivot"):
        get_durable_fault("nope")
    with pytest.raises(ValueError, match="choose 'full' or 'unfenced'"):
        await run_durable_fault(harness, "lock_holder_killed", "naive", saga=SAGA)
    with pytest.raises(ValueError, match="pass saga="):
        await run_durable_fault(harness, "abort_after_pivot")
    assert set(DURABLE_FAULTS) == {"lock_holder_killed", "abort_after_pivot", "retention_races_thread"}
    assert DurableRun("x", "full", {}, [Violation("paid_twice", "t", "d")]).counts()["paid_twice"] == 1
