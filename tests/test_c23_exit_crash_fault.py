"""Case C23 in the failure lab: ``crash_under_exit`` runs an episode under ``durability="exit"`` and kills
its process right after the first batch's COMMIT. No checkpoint exists, so the new process has nothing to
resume and the prompt is sent again; the model's new tool call ids are not in the ledger. Natural keys
hold the credit memo and the refund; the credit deduction, which has none, applies twice under ``full``,
and the checker counts it. The same crash under ``durability="sync"`` resumes and keeps every invariant."""

from __future__ import annotations

from agentlab.lab.experiments import run_experiment
from agentlab.lab.faults import FAULTS, OPT_IN_FAULTS, get_fault
from agentlab.lab.invariants import count_by_kind
from agentlab.lab.runner import Lab
from conftest import scalar


def test_the_fault_is_in_the_catalog_only_when_named():
    fault = get_fault("crash_under_exit")
    assert fault is OPT_IN_FAULTS["crash_under_exit"] and "crash_under_exit" not in FAULTS
    assert fault.family == "crash_before_checkpoint" and fault.forced_durability == "exit"


async def test_c23_the_resubmitted_prompt_deducts_the_credit_again_under_full(harness):
    async with Lab(harness) as lab:
        run = await lab.run("crash_under_exit", "full", scenario="refund")
    cid = run.episode.customer_ids[0]
    assert (run.durability, run.crashed, run.episode.error) == ("exit", True, None)
    assert run.notes["resume"] == "no checkpoint; the prompt was sent again"
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = %s", (cid,)) == 5000 - 2500 - 2500
    assert await scalar(harness, "SELECT count(*) FROM credit_memos WHERE customer_id = %s", (cid,)) == 1  # UNIQUE
    assert await scalar(harness, "SELECT count(*) FROM provider.payments WHERE customer = %s", (f"cus_{cid}",)) == 1
    kinds = count_by_kind(run.violations)
    assert kinds["balance_mismatch"] == 1
    assert kinds["ledger_mismatch"] == 3  # the first run's three ledger rows answer no call of the thread
    assert kinds["unanswered_call"] == 0 and kinds["leak"] == 0


async def test_c23_the_same_crash_under_sync_durability_resumes_and_holds(harness):
    async with Lab(harness) as lab:
        run = await lab.run("crash_under_exit", "full", scenario="refund", durability="sync")
    cid = run.episode.customer_ids[0]
    assert run.crashed and "resume" not in run.notes and run.violations == []
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = %s", (cid,)) == 2500


async def test_c23_the_experiment_counts_it_under_every_preset(database_url):
    result = await run_experiment(1, ["naive", "full"], ["none", "crash_under_exit"], seed=0, url=database_url,
                                  progress=False)
    assert result.rows["error"].isna().all()
    assert result.summary.loc["none"].tolist() == [0, 0]
    assert (result.summary.loc["crash_under_exit"] > 0).all()
