"""tau2-bench retail through the kit: golden actions as model turns through the graph and the tools node,
on a fresh database per task, judged by tau2's own end-state hash and by the retail invariants.

The fast suite runs a sample; all 114 tasks: ``RETAIL_FULL=1 pytest tests/test_tau2_replay.py -m slow``
(or ``python -m agentlab tau2``)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from langchain_core.messages import AIMessage, ToolMessage

from agentlab.core.domain import Domain
from agentlab.core.safeguards import preset
from agentlab.domains.retail import DOMAIN, DOMAIN_FIXED
from agentlab.domains.retail.domain import LAST_VARIANT_BUG_TASKS
from agentlab.domains.retail.export import export_state
from agentlab.lab.faults import slow_shot
from agentlab.lab.tau2 import (
    ORDER_SHOT_PREFIX,
    Tau2Worker,
    get_fault,
    render,
    run_task,
    run_tau2,
)

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ["3", "30", "44"]  # modify items (credit card), cancel (gift card), modify items (gift card)


def kinds(run) -> set[str]:
    return {k for k, _ in run.violations}


def test_retail_is_a_domain_of_16_tools_and_114_one_call_turns():
    assert isinstance(DOMAIN, Domain) and DOMAIN.schema == "retail"
    assert len(DOMAIN.toolset) == 16 and len(DOMAIN.toolset.writers()) == 7
    assert len(DOMAIN.scenarios) == 114
    assert all(len(step) == 1 for sc in DOMAIN.scenarios.values() for step in sc.steps)
    sc = DOMAIN.scenarios["tau2-20"]
    assert sc.intended["call_ids"][0] == "tau2-20-20_0" and len(sc.intended["call_ids"]) == len(sc.steps)
    assert [i.kind for i in DOMAIN.invariants] == ["gift_card_balance", "order_payments", "order_status_transition",
                                                   "item_matches_variant", "paid_twice"]


async def test_each_golden_action_is_one_turn_with_its_tau2_call_id():
    run = await run_task("3", "full", keep_messages=True)
    calls = [tc for m in run.messages if isinstance(m, AIMessage) for tc in m.tool_calls]
    assert [tc["id"] for tc in calls] == list(DOMAIN.scenarios["tau2-3"].intended["call_ids"])
    assert all(len(m.tool_calls) <= 1 for m in run.messages if isinstance(m, AIMessage))
    assert run.matches and run.violations == []


async def test_sample_matches_under_full_with_a_crash_inside_a_multi_row_write():
    result = await run_tau2(["full"], ["crash_mid_node"], SAMPLE, concurrency=3, progress=False)
    assert all(r.crashed for r in result.runs), [r.notes for r in result.runs]
    assert [r.task_id for r in result.runs if not r.matches] == []
    assert [r.violations for r in result.runs] == [[], [], []]
    assert result.table()[0]["matched"] == 3


async def test_sample_breaks_under_naive_with_a_crash_inside_a_multi_row_write():
    result = await run_tau2(["naive"], ["crash_mid_node"], SAMPLE, concurrency=3, progress=False)
    by_task = {r.task_id: r for r in result.runs}
    assert [t for t in SAMPLE if by_task[t].matches] == []  # every end state differs from tau2's
    # the resumed call applied again on top of its committed first statement
    assert "order_payments" in kinds(by_task["3"])  # a second payment for the same item change
    assert "gift_card_balance" in kinds(by_task["30"])  # the card refunded twice, one refund recorded
    assert "gift_card_balance" in kinds(by_task["44"])  # the payment recorded twice, the card charged once
    assert "naive" in render(result) and "0/3" in render(result)


async def test_a_killed_backend_inside_a_multi_row_write_double_applies_only_without_a_transaction():
    result = await run_tau2(["full", "naive"], ["backend_killed"], ["3"], concurrency=2, progress=False)
    full, naive = result.runs
    assert full.notes["terminated"] and naive.notes["terminated"]
    assert full.matches and full.violations == []
    assert not naive.matches and "order_payments" in kinds(naive)


async def test_a_slow_order_write_past_the_statement_timeout_is_retried_and_the_end_state_matches():
    result = await run_tau2(["full", "naive"], ["statement_timeout"], ["30"], concurrency=2, progress=False)
    full, naive = result.runs
    for run in (full, naive):
        assert run.notes["slow_order"] == "#W2692684" and run.notes["slow_statement_seen"], run.notes
        assert run.matches and run.violations == [] and not run.escalated
    assert result.table()[0]["matched"] == result.table()[1]["matched"] == 1


async def test_the_slow_order_write_waits_once_per_order_and_its_retry_commits_while_the_fault_is_armed():
    fault = get_fault("statement_timeout")
    orders = ("#W1006327", "#W5918442")  # two pending orders armed at once: each meets its own one shot
    async with Tau2Worker() as worker:
        await fault.install(worker.harness.pool)
        async with await psycopg.AsyncConnection.connect(worker.harness.url, autocommit=True) as conn:
            for order in orders:
                await conn.execute(slow_shot(order, prefix=ORDER_SHOT_PREFIX))
                await conn.execute("INSERT INTO public.chaos_slow_orders VALUES (%s)", (order,))
            await conn.execute("SET statement_timeout = '300ms'")
            cancel = ("UPDATE retail.orders SET status = 'cancelled', cancel_reason = 'ordered by mistake' "
                      "WHERE order_id = %s AND status = 'pending'")
            for order in orders:
                with pytest.raises(psycopg.errors.QueryCanceled):  # the first write waits past the timeout
                    await conn.execute(cancel, (order,))
                assert (await (await conn.execute("SELECT cancel_reason FROM retail.orders WHERE order_id = %s",
                                                  (order,))).fetchone())[0] is None  # cancelled: rolled back
                await conn.execute(cancel, (order,))  # the retry, the fault still armed: runs at once
            cur = await conn.execute("SELECT order_id, cancel_reason FROM retail.orders WHERE order_id = ANY(%s) "
                                     "ORDER BY 1", (list(orders),))
            assert await cur.fetchall() == [(o, "ordered by mistake") for o in sorted(orders)]
            cur = await conn.execute("SELECT order_id FROM public.chaos_slow_orders ORDER BY 1")
            assert [r[0] for r in await cur.fetchall()] == sorted(orders)  # still armed
            for order in orders:  # two statements counted on each order's sequence; only the first waited
                seq = f'public."{ORDER_SHOT_PREFIX}{order}"'
                assert (await (await conn.execute(f"SELECT last_value FROM {seq}")).fetchone())[0] == 2
            # this database's markers only: pg_locks lists the whole server's, and other tests run alongside
            waiting = await conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 4244 AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())")
            assert (await waiting.fetchone())[0] == 0  # no write of either order is held now


async def test_golden_actions_tau2_refuses_are_refused_with_no_effect():
    # 64_6: exchange of a non-delivered order; 106_0: gift card balance too low for the exchange
    for task, action in (("64", "tau2-64-64_6"), ("105", "tau2-105-106_0")):
        run = await run_task(task, "full", keep_messages=True)
        answer = next(m for m in run.messages if isinstance(m, ToolMessage) and m.tool_call_id == action)
        assert answer.content.startswith("FAILED [business_rule]"), answer.content
        assert run.matches and run.violations == []


async def test_an_order_id_without_its_hash_is_fixed_by_the_model_and_the_end_state_matches():
    run = await run_task("30", "full", "hallucinated_order_id", keep_messages=True)
    failed = [m for m in run.messages if isinstance(m, ToolMessage) and "Order not found" in str(m.content)]
    assert failed and all(m.content.startswith("FAILED [not_found]") for m in failed)
    assert run.matches and run.violations == []


@pytest.mark.slow
async def test_an_order_id_without_its_hash_escalates_tasks_46_47_64_after_three_refused_batches_in_a_row():
    # 46 and 47: golden actions 1 and 2 name orders that do not exist (tau2 refuses them too); sent without the
    # '#', 46_1, its fix and 46_2 are three refused batches in a row. 64: 64_6 (tau2 refuses it), its fix and 64_7.
    # The graph escalates after max_rollbacks (3) such batches and the run ends before the tasks' writes.
    for task in ("46", "47", "64"):
        run = await run_task(task, "full", "hallucinated_order_id", keep_messages=True)
        assert not run.matches and run.escalated and run.violations == [], task
        refused = [m for m in run.messages if isinstance(m, ToolMessage)][-3:]
        assert all(str(m.content).startswith("FAILED [") for m in refused), task
        assert not any(isinstance(m, ToolMessage) and m.name in DOMAIN.toolset.writers() and
                       not str(m.content).startswith("FAILED") for m in run.messages), task
    # without the fault the same tasks never refuse three batches in a row; with a higher threshold they match
    for task in ("46", "64"):
        assert (await run_task(task, "full")).matches, task
    patient = preset("full").replace(max_rollbacks=6, name="full")
    for task in ("46", "64"):
        run = await run_task(task, patient, "hallucinated_order_id")
        assert run.matches and not run.escalated and run.violations == [], task


def _first_call(task: str, tool: str):
    return next(c for _s, _k, c in DOMAIN.scenarios[f"tau2-{task}"].calls() if c.tool == tool)


def test_the_constraint_faults_change_one_argument_of_one_tool_and_leave_other_tasks_alone():
    from agentlab.lab.tau2 import get_fault

    rng = random.Random(0)
    cancel = get_fault("check_violation").prepare(DOMAIN.scenarios["tau2-30"], rng)
    (bad,) = [c for _s, _k, c in cancel.calls() if c.tool == "cancel_pending_order"]
    assert bad.args["reason"] == "No longer needed" and bad.fix == _first_call("30", "cancel_pending_order").args
    exchange = get_fault("fk_violation").prepare(DOMAIN.scenarios["tau2-6"], rng)
    (bad,) = [c for _s, _k, c in exchange.calls() if c.tool == "exchange_delivered_order_items"]
    real = _first_call("6", "exchange_delivered_order_items").args["payment_method_id"]
    assert bad.args["payment_method_id"] == real.rsplit("_", 1)[0] + "_0000000" != real
    assert get_fault("check_violation").prepare(DOMAIN.scenarios["tau2-3"], rng) == DOMAIN.scenarios["tau2-3"]
    # both still pass the strict argument models: only the schema refuses them
    for sc in (cancel, exchange):
        for _s, _k, c in sc.calls():
            DOMAIN.toolset.get_tool(c.tool).validate(c.args)


async def test_a_cancel_reason_the_check_refuses_rolls_back_under_full_and_refunds_twice_under_naive():
    order_id = _first_call("30", "cancel_pending_order").args["order_id"]
    async with Tau2Worker() as worker:
        async with worker.harness.pool.connection() as conn:
            opening = await export_state(conn)
            # the opening payment on a gift card, and that card's balance, as db.json has them
            (card, paid), = [(p["payment_method_id"], p["amount"]) for p in opening["orders"][order_id]["payment_history"]]
            user = opening["orders"][order_id]["user_id"]
            balance0 = opening["users"][user]["payment_methods"][card]["balance"]
        runs = {p: await worker.run("30", p, "check_violation", keep_messages=True, keep_state=True)
                for p in ("full", "naive")}
    full, naive = runs["full"], runs["naive"]

    def answers(run):
        return [str(m.content) for m in run.messages if isinstance(m, ToolMessage) and m.name == "cancel_pending_order"]

    def balance(run):
        return run.state["users"][user]["payment_methods"][card]["balance"]

    # full: the CHECK refuses the capitalized reason, the batch rolls back, the model is told tau2's words
    assert answers(full)[0] == "FAILED [business_rule]: Invalid reason"
    assert full.matches and full.violations == [] and round(balance(full), 2) == round(balance0 + paid, 2)
    assert full.state["orders"][order_id]["status"] == "cancelled"
    # naive: autocommit kept the gift-card refund that ran before the refused UPDATE; the raw error names the
    # constraint; the model resends the fixed call, which refunds the card again
    assert answers(naive)[0].startswith("CheckViolation:") and "orders_cancel_reason_valid" in answers(naive)[0]
    assert not naive.matches and round(balance(naive), 2) == round(balance0 + 2 * paid, 2)
    assert kinds(naive) == {"leak", "gift_card_balance"}


async def test_an_exchange_paid_with_an_unknown_method_is_refused_by_the_foreign_key_and_leaks_only_raw():
    async with Tau2Worker() as worker:
        async with worker.harness.pool.connection() as conn:
            unknown = (await (await conn.execute(
                "SELECT count(*) FROM retail.payment_methods WHERE payment_method_id LIKE '%\\_0000000'")).fetchone())[0]
        runs = {p: await worker.run("6", p, "fk_violation", keep_messages=True) for p in ("full", "naive")}
    assert unknown == 0  # no user has the description's example ids

    def first_answer(run):
        return next(str(m.content) for m in run.messages
                    if isinstance(m, ToolMessage) and m.name == "exchange_delivered_order_items")

    assert first_answer(runs["full"]) == "FAILED [not_found]: Payment method not found"
    assert runs["full"].matches and runs["full"].violations == []
    # the refused UPDATE is the exchange's only write: naive ends in tau2's state too, but the model read the raw
    # error, with the constraint's name and the user's id
    raw = first_answer(runs["naive"])
    assert raw.startswith("ForeignKeyViolation:") and "orders_exchange_payment_method_owned" in raw
    assert runs["naive"].matches and kinds(runs["naive"]) == {"leak"}


async def test_a_worker_puts_its_database_back_to_the_opening_state_and_hashes_as_the_full_export():
    from agentlab.domains.retail.export import canonical_hash
    from agentlab.domains.retail.reset import changed

    async with Tau2Worker() as worker:
        async with worker.harness.pool.connection() as conn:
            opening = canonical_hash(await export_state(conn))
        assert worker.pieces.hash_with() == opening
        # a crash inside a multi-row write without a transaction leaves a half-applied write behind
        for task, p, fault in (("44", "naive", "crash_mid_node"), ("3", "full", "none"), ("30", "naive", "backend_killed")):
            run = await worker.run(task, p, fault, keep_state=True)
            assert canonical_hash(run.state) == run.state_hash  # keep_state: the full export's hash
            assert run.matches == (p == "full"), (task, p, fault)
            async with worker.harness.pool.connection() as conn:
                assert await changed(conn) == {}
                assert canonical_hash(await export_state(conn)) == opening
        fast = await worker.run("44", "naive", "crash_mid_node")  # the change log's hash, no full export
        assert fast.state_hash != opening
        again = await worker.run("44", "naive", "crash_mid_node", keep_state=True)
        assert fast.state_hash == again.state_hash == canonical_hash(again.state)


async def test_the_change_log_refuses_a_truncate():
    async with Tau2Worker() as worker, worker.harness.pool.connection() as conn:
        with pytest.raises(psycopg.errors.RaiseException, match="change log"):
            await conn.execute("TRUNCATE retail.payment_history")


async def test_last_variant_bug_reproduced_matches_tau2_and_the_invariant_reports_it():
    run = await run_task("21", "full")
    assert run.matches
    assert [k for k, _ in run.violations] == ["order_payments", "item_matches_variant"]


async def test_last_variant_bug_fixed_differs_from_tau2_and_holds_the_invariants():
    run = await run_task("21", "full", fixed=True)
    assert not run.matches and run.violations == []
    assert DOMAIN_FIXED.fingerprint() == DOMAIN.fingerprint()  # one template: only the tool differs


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("RETAIL_FULL"), reason="all 114 tasks take a minute or more: set RETAIL_FULL=1")
async def test_all_114_tasks_match_tau2_under_full_reproduced_and_109_fixed():
    result = await run_tau2(["full"], ["none"], progress=False)
    assert [r.task_id for r in result.runs if not r.matches] == []
    assert sorted({r.task_id for r in result.runs if "item_matches_variant" in kinds(r)}, key=int) == list(
        LAST_VARIANT_BUG_TASKS)
    assert sum(k == "item_matches_variant" for r in result.runs for k, _ in r.violations) == 9
    assert [r.task_id for r in result.runs if kinds(r) - {"item_matches_variant", "order_payments"}] == []
    fixed = await run_tau2(["full"], ["none"], fixed=True, progress=False)
    assert sorted((r.task_id for r in fixed.runs if not r.matches), key=int) == list(LAST_VARIANT_BUG_TASKS)
    assert sum(r.matches for r in fixed.runs) == 109
    assert [r.violations for r in fixed.runs if r.violations] == []


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("RETAIL_FULL"), reason="all 114 tasks take minutes: set RETAIL_FULL=1")
@pytest.mark.parametrize("fault", ["crash_mid_node", "backend_killed", "crash_before_checkpoint",
                                   "hallucinated_order_id", "check_violation", "fk_violation", "lock_timeout",
                                   "statement_timeout"])
async def test_all_114_tasks_match_under_full_under_each_fault(fault):
    result = await run_tau2(["full"], [fault], progress=False)
    # hallucinated_order_id: 46, 47 and 64 escalate (three refused batches in a row, see the test above)
    want = ["46", "47", "64"] if fault == "hallucinated_order_id" else []
    assert [r.task_id for r in result.runs if not r.matches] == want
    assert [r.task_id for r in result.runs if r.escalated] == want
    assert [r.task_id for r in result.runs if kinds(r) - {"item_matches_variant", "order_payments"}] == []
    assert {r.task_id for r in result.runs if r.violations} == set(LAST_VARIANT_BUG_TASKS)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "agentlab", "tau2", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600, check=False)


def test_the_tau2_command_prints_json_with_each_tasks_hash_and_violations():
    out = _cli("--tasks", "21", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["table"] == [{"preset": "full", "fault": "none", "matched": 1, "of": 1, "errors": 0, "escalated": 0,
                                "violations": {"item_matches_variant": 1, "order_payments": 1}}]
    (task,) = report["runs"]
    assert task["task"] == "21" and task["matches"] and len(task["hash"]) == 64
    assert [v["kind"] for v in task["violations"]] == ["order_payments", "item_matches_variant"]


@pytest.mark.slow
def test_the_tau2_command_refuses_an_unknown_fault_in_one_line():
    out = _cli("--faults", "meteor", "--tasks", "3")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == ("error: unknown tau2 fault 'meteor'; choose one of: none, crash_mid_node, "
                                  "backend_killed, crash_before_checkpoint, hallucinated_order_id, check_violation, "
                                  "fk_violation, lock_timeout, statement_timeout")
