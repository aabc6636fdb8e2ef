"""The notebooks' exercises: each reference solution in ``solutions/``, run through ``check`` as a learner's
function is (a fresh database per case), returns the values its notebook promises, which are written once,
in ``agentlab/lab/exercises/nbNN.py``; the tests below them assert what a value comparison cannot."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agentlab.core.errors import find_leaks
from agentlab.lab.exercises import check, exercises, get_exercise, reference, solution
from solutions import (
    ex02_constraints,
    ex03_validation,
    ex09_failure_lab,
    ex10_safeguards,
    ex11_sagas,
    ex12_approval,
    ex13_history,
    ex14_observability,
    ex15_tenancy,
    ex18_two_conversations,
)

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = exercises()


def test_a_notebook_with_registered_exercises_states_stubs_and_checks_each_of_them():
    """Each ``## Exercise N.M`` of a notebook whose exercises are registered is registered, and the
    notebook defines the function the exercise names and checks it with ``await check("N.M", ...)``."""
    registered = {}
    for e in EXERCISES:
        registered.setdefault(int(e.id.split(".")[0]), []).append(e)
    assert registered, "no exercise registered"
    for number, listed in registered.items():
        (path,) = (ROOT / "notebooks").glob(f"{number:02d}_*.ipynb")
        cells = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]]
        headings = [h for c in cells for h in re.findall(r"^## Exercise (\d+\.\d+)", c, re.MULTILINE)]
        assert headings == [e.id for e in listed], path.name
        for e in listed:
            assert any(re.search(rf"^(async )?def {e.function}\(", c, re.MULTILINE) for c in cells), (e.id, e.function)
            assert f'await check("{e.id}", {e.function})' in cells, e.id
            assert not any(re.search(r"^from solutions", c, re.MULTILINE) for c in cells), path.name


@pytest.mark.parametrize("exercise", EXERCISES, ids=[e.id for e in EXERCISES])
async def test_each_reference_solution_passes_its_own_check(exercise, capsys):
    """The reference solution, run as ``check`` runs a learner's function (a fresh database per case),
    returns every value the notebook's statement promises; the expected values live in
    ``agentlab/lab/exercises/nbNN.py`` alone."""
    assert await check(exercise.id, reference(exercise))
    out = capsys.readouterr().out
    assert not re.search(r"^\s*FAILED: ", out, re.MULTILINE) and "not written yet" not in out
    assert out.count("passed: ") >= max(1, len(exercise.cases))


async def test_a_stub_a_wrong_answer_and_a_crash_are_told_apart(capsys):
    async def stub(h, preset_name) -> dict:
        raise NotImplementedError

    async def wrong(h, preset_name) -> dict:
        return {"refund_rows": 2, "provider_refunds": 2}

    async def a_frame(h, preset_name) -> dict:
        return {"refund_rows": await h.df("SELECT 2 AS n")}

    async def crashes(h, preset_name) -> dict:
        raise KeyError("refunds")

    assert not await check("2.1", stub)
    assert capsys.readouterr().out == "not written yet: fill in `duplicate_refund` above\n"
    assert not await check("2.1", wrong)
    out = capsys.readouterr().out.splitlines()
    assert out[:4] == ["duplicate_refund(h, 'naive'):", "  passed: refund_rows = 2", "  passed: provider_refunds = 2",
                       "  FAILED: second_call missing, expected 'applied'; hint: " + get_exercise("2.1").hint("second_call")]
    assert out[5].startswith("  FAILED: refund_rows = 2, expected 1; hint: ")
    assert not await check("2.1", a_frame)
    assert capsys.readouterr().out.splitlines()[1].startswith("  FAILED: refund_rows = <a DataFrame of shape (1, 1)>, ")
    assert not await check("2.1", crashes)
    assert capsys.readouterr().out.startswith("FAILED: duplicate_refund(h, 'naive') raised KeyError: 'refunds'; hint: ")


async def test_an_exercise_with_its_own_verify_checks_a_plain_function(capsys):
    assert not await check("3.2", lambda cases: ["accepted"] * len(cases))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["passed"] + ["FAILED"] * 4 + ["passed"]
    assert lines[1].startswith("FAILED: the same customer twice = 'accepted', expected a refusal")


async def test_solution_shows_the_reference_source_with_what_it_needs_then_checks_it(capsys):
    assert await solution("2.2")
    out = capsys.readouterr().out
    assert "async def check_on_a_table_with_bad_rows(h) -> dict:" in out
    assert "async def _try(conn, statement: str) -> str:" in out and 'VALIDATE_CHECK = "ALTER TABLE' in out
    assert "import psycopg" in out and "__future__" not in out
    assert out.count("passed: ") == 8


def test_an_unknown_exercise_names_the_ones_that_exist():
    with pytest.raises(ValueError, match=r"notebook 2 has 2\.1, 2\.2"):
        get_exercise("2.9")
    with pytest.raises(ValueError, match="such as '2.1'"):
        get_exercise("two")


async def test_ex02_2_runs_again_on_one_database(harness):
    first = await ex02_constraints.check_on_a_table_with_bad_rows(harness)
    assert await ex02_constraints.check_on_a_table_with_bad_rows(harness) == first


def test_ex03_2_transfer_credit_has_a_strict_model_and_a_cross_field_rule():
    outcomes = ex03_validation.transfer_outcomes([
        {"from_customer_id": 1, "to_customer_id": 2, "amount_cents": 500},
        {"from_customer_id": 1, "to_customer_id": 1, "amount_cents": 500},
        {"from_customer_id": 1, "to_customer_id": 2, "amount_cents": "500"},
        {"from_customer_id": 1, "to_customer_id": 2, "amount_cents": 5.5},
        {"from_customer_id": 1, "to_customer_id": 2, "amount_cents": 500, "memo": "x"},
    ])
    assert outcomes[0] == "accepted"
    assert all(o.startswith("FAILED [invalid_arguments]: ") for o in outcomes[1:])
    assert "to_customer_id must differ" in outcomes[1]
    assert "'amount_cents'" in outcomes[2] and "not text" in outcomes[2]
    assert "'amount_cents'" in outcomes[3] and "not a decimal number" in outcomes[3]
    assert "'memo' is not an argument" in outcomes[4]
    assert [find_leaks(o) for o in outcomes] == [[]] * 5


@pytest.mark.parametrize("fault,safe_from", [
    ("crash_before_checkpoint", "ledger"), ("backend_killed", "transaction"), ("provider_timeout", "full"),
    ("wrong_order", "savepoints"), ("wrong_type", "validated"),
])
async def test_ex09_1_each_fault_is_held_from_its_own_rung_on(harness, fault, safe_from):
    found = await ex09_failure_lab.first_safe_preset(harness, fault)
    assert found["safe_from"] == safe_from
    ladder = list(found["violations"])
    below = ladder[ladder.index(safe_from) - 1]
    assert found["violations"][below] > 0 and found["violations"]["full"] == 0


async def test_ex09_1_the_crash_before_checkpoint_counts_of_the_notebook(harness):
    assert (await ex09_failure_lab.first_safe_preset(harness, "crash_before_checkpoint"))["violations"] == {
        "naive": 9, "constraints": 29, "validated": 29, "transaction": 9, "savepoints": 9, "ledger": 0, "full": 0,
    }


async def test_ex09_2_only_the_batch_scenario_charges_twice_after_a_crash_under_savepoints(harness):
    assert await ex09_failure_lab.violations_per_scenario(harness, "crash_before_checkpoint", "savepoints") == {
        "refund": ["leak", "unreported_effect"], "invoice": ["leak", "unreported_effect"],
        "topup": ["leak", "unreported_effect"], "batch": ["leak", "payment_count", "unreported_effect"],
    }
    assert await ex09_failure_lab.violations_per_scenario(harness, "crash_before_checkpoint", "ledger") == {
        "refund": [], "invoice": [], "topup": [], "batch": [],
    }


@pytest.mark.parametrize("switch,faults", [
    ("outbox", ["fk_violation", "provider_timeout", "worker_crash", "provider_forgot_key"]),
    ("isolation", ["other_tenant_id"]),
    ("ledger", ["crash_before_checkpoint"]),
])
async def test_ex10_1_each_part_of_full_holds_its_own_faults(harness, switch, faults):
    table = await ex10_safeguards.knockout(harness, switch)
    assert list(table.index) == faults
    assert (table["full"] == 0).all() and (table[f"full without {switch}"] > 0).all()


async def test_ex10_1_a_switch_that_cannot_be_off_alone_is_refused(harness):
    with pytest.raises(ValueError, match="need a transaction"):
        await ex10_safeguards.knockout(harness, "transaction")


async def test_ex10_2_the_ledger_without_savepoints_holds_the_crash_and_misreports_the_check(harness):
    table = await ex10_safeguards.ledger_without_savepoints(harness)
    crash, check = table.loc["crash_before_checkpoint"], table.loc["check_violation"]
    assert crash["all violations"].to_dict() == {"transaction": 17, "transaction+ledger": 0, "ledger": 0}
    assert check["ledger_mismatch"].to_dict() == {"transaction": 0, "transaction+ledger": 3, "ledger": 0}
    assert check["half_applied_batch"].to_dict() == {"transaction": 4, "transaction+ledger": 4, "ledger": 0}
    assert check["all violations"].to_dict() == {"transaction": 14, "transaction+ledger": 17, "ledger": 3}


async def test_ex11_1_a_crash_after_the_model_call_does_not_repeat_it(harness):
    assert await ex11_sagas.crash_after_notice(harness) == {
        "status_after_crash": "running", "status_after_resume": "completed", "model_calls": 1, "notices_sent": 1,
        "credit_deducted_cents": 2000,
    }


async def test_ex11_2_a_run_parked_going_forward_is_compensated_when_a_person_aborts_it(harness):
    assert await ex11_sagas.abort_parked_run(harness) == {
        "parked_reason": "step 4 (queue_refund) still failing after 2 attempts: psycopg.errors.LockNotAvailable",
        "after_abort": "compensated", "compensations": [3, 2, 1], "credit_deducted_cents": 0, "notices_sent": 1,
        "corrections_sent": 1,
    }


@pytest.mark.parametrize("threshold_cents,expected", [
    (10_000, {"requests": 1, "calls_in_request": [30000, 15000], "refunds": 2}),
    (20_000, {"requests": 1, "calls_in_request": [30000], "refunds": 2}),
    (50_000, {"requests": 0, "calls_in_request": [], "refunds": 2}),
])
async def test_ex12_1_the_threshold_decides_which_calls_the_request_lists(harness, threshold_cents, expected):
    assert await ex12_approval.approval_for_threshold(harness, threshold_cents) == expected


@pytest.mark.parametrize("answer,expected", [
    ("approve", {"tool_messages": 2, "rejected": 0, "tools_node_runs": 1, "refunds": 2, "outbox_rows": 2}),
    ("reject", {"tool_messages": 2, "rejected": 2, "tools_node_runs": 0, "refunds": 0, "outbox_rows": 0}),
    ("yes", {"tool_messages": 2, "rejected": 2, "tools_node_runs": 0, "refunds": 0, "outbox_rows": 0}),
])
async def test_ex12_2_only_the_word_approve_approves(harness, answer, expected):
    assert await ex12_approval.answer_all(harness, answer) == expected


@pytest.mark.parametrize("idle_days,expected", [
    (3, {"action": "kept", "checkpoints": [7, 7], "replay_points_before_tools": [2, 2], "ledger_rows": 3,
         "outbox_rows": 1}),
    (10, {"action": "pruned", "checkpoints": [7, 1], "replay_points_before_tools": [2, 0], "ledger_rows": 3,
          "outbox_rows": 1}),
])
async def test_ex13_1_pruning_ends_replay_and_keeps_the_ledger(harness, idle_days, expected):
    assert await ex13_history.history_after_retention(harness, idle_days) == expected


async def test_ex13_2_a_thread_waiting_for_approval_is_never_deleted(harness):
    assert await ex13_history.waiting_thread_survives(harness) == {
        "waiting_thread": "pruned", "finished_thread": "deleted", "checkpoints_left": 1, "pending_requests": 1,
        "refunds_after_resume": 2,
    }


async def test_ex14_1_input_tokens_grow_with_the_history(harness):
    ep = await harness.run_episode("refund", "full", thread_id="t-ex14-tokens")
    frame = await ex14_observability.tokens_by_super_step(harness, ep.thread_id)
    assert frame.to_dict("list") == {"step": [1, 3, 5], "input_tokens": [35, 239, 405], "output_tokens": [119, 119, 5],
                                     "cumulative_input_tokens": [35, 274, 679]}


async def test_ex14_2_retries_lists_the_retried_tools_node_and_nothing_in_a_clean_run(harness):
    from agentlab.lab.observability import episode_with_a_retry

    clean = await harness.run_episode("refund", "full", thread_id="t-ex14-clean")
    retried = await episode_with_a_retry(harness, thread_id="t-ex14-retried")
    assert (await ex14_observability.retries(harness, clean.thread_id)).empty
    assert (await ex14_observability.retries(harness, retried.thread_id)).to_dict("records") == [{
        "node": "tools", "step": 4, "attempts": 2, "outcomes": "error → ok",
        "error_class": "psycopg.errors.LockNotAvailable",
    }]


@pytest.mark.parametrize("customer_id,seen_by", [(1, "acme"), (3, "globex"), (5, "initech"), (6, "umbrella")])
async def test_ex15_1_each_seed_customer_is_seen_by_its_own_tenant_only(harness, customer_id, seen_by):
    assert await ex15_tenancy.who_sees(harness, customer_id) == {
        t: t == seen_by for t in ("acme", "globex", "initech", "umbrella")}


@pytest.mark.parametrize("tenant,expected", [
    ("acme", {"update_credit": 0, "memo_like_the_tools": 0, "memo_naming_its_tenant": "42501"}),
    ("globex", {"update_credit": 1, "memo_like_the_tools": 1, "memo_naming_its_tenant": 1}),
])
async def test_ex15_2_hidden_rows_are_silent_and_a_foreign_tenant_row_is_refused(harness, tenant, expected):
    assert await ex15_tenancy.write_as(harness, tenant, 3, "globex") == expected
    assert (await harness.df("SELECT credit_cents FROM customers WHERE id = 3")).credit_cents[0] == 7500  # rolled back


async def test_ex16_1_the_learners_invariant_is_checked_on_a_clean_and_a_broken_episode(capsys):
    from agentlab import check_invariant
    from examples.payouts import DOMAIN
    from solutions.ex16_byo_tool import no_payout_without_its_intent

    async def stub(ctx) -> list[str]:
        return []

    assert await check_invariant(no_payout_without_its_intent, DOMAIN, fault="backend_killed", preset="ledger")
    assert capsys.readouterr().out.count("passed:") == 2
    assert not await check_invariant(stub, DOMAIN, fault="backend_killed", preset="ledger")
    out = capsys.readouterr().out
    assert "passed: a clean episode" in out and "FAILED: backend_killed under ledger is reported (0 line(s))" in out


async def test_ex18_1_only_read_committed_with_row_locks_and_serializable_hold_every_anomaly(harness):
    from agentlab.lab.anomalies import isolation_matrix

    matrix = await isolation_matrix(harness)
    assert ex18_two_conversations.settings_that_hold(matrix) == [
        "serializable", "read committed + row locks", "serializable + row locks"]


async def test_ex18_2_a_lost_update_keeps_both_redemptions_and_one_balance(harness):
    from agentlab import preset

    lost = await ex18_two_conversations.redeem_twice(harness, preset("full").replace(row_locks=False))
    held = await ex18_two_conversations.redeem_twice(harness, preset("full"))
    assert lost["redemptions"] == held["redemptions"] == 2 and lost["redeemed_cents"] == 3500
    assert lost["credit_cents"] == 3500 and held["credit_cents"] == 1500  # A wrote 3000 first, B its own 3500
