"""The notebooks' exercises: each solution in ``solutions/`` runs on a fresh database and the values it
reads back from the database and the provider are the ones its notebook promises."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agentlab.core.errors import find_leaks
from agentlab.core.safeguards import preset
from agentlab.lab.batches import tool_calls
from agentlab.lab.exercises import check, exercises, get_exercise, reference, solution
from solutions import (
    ex02_constraints,
    ex03_validation,
    ex04_errors,
    ex05_transactions,
    ex06_graph,
    ex07_ledger,
    ex08_outbox,
    ex10_safeguards,
    ex15_tenancy,
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
            call = f'await check("{e.id}", {e.function}'  # then ")" or what the notebook gives, ", domain=PAYOUTS)"
            assert any(c == call + ")" or c.startswith(call + ", ") and c.endswith(")") for c in cells), e.id
            assert not any(re.search(r"^from solutions", c, re.MULTILINE) for c in cells), path.name


@pytest.mark.parametrize("exercise", EXERCISES, ids=[e.id for e in EXERCISES])
async def test_each_reference_solution_passes_its_own_check(exercise, capsys):
    """The reference solution, run as ``check`` runs a learner's function (a fresh database per case),
    returns every value the notebook's statement promises; the expected values live in
    ``agentlab/lab/exercises/nbNN.py`` alone."""
    assert await check(exercise.id, reference(exercise))
    out = capsys.readouterr().out
    assert "FAILED" not in out and "not written yet" not in out
    assert out.count("passed: ") >= max(1, len(exercise.cases))


async def test_a_stub_a_wrong_answer_and_a_crash_are_told_apart(capsys):
    async def stub(h, preset_name) -> dict:
        raise NotImplementedError

    async def wrong(h, preset_name) -> dict:
        return {"refund_rows": 2, "provider_refunds": 2}

    async def crashes(h, preset_name) -> dict:
        raise KeyError("refunds")

    assert not await check("2.1", stub)
    assert capsys.readouterr().out == "not written yet: fill in `duplicate_refund` above\n"
    assert not await check("2.1", wrong)
    out = capsys.readouterr().out.splitlines()
    assert out[:4] == ["duplicate_refund(h, 'naive'):", "  passed: refund_rows = 2", "  passed: provider_refunds = 2",
                       "  FAILED: second_call missing, expected 'applied'; hint: " + get_exercise("2.1").hint("second_call")]
    assert out[5].startswith("  FAILED: refund_rows = 2, expected 1; hint: ")
    assert not await check("2.1", crashes)
    assert capsys.readouterr().out.startswith("FAILED: duplicate_refund(h, 'naive') raised KeyError: 'refunds'; hint: ")


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


@pytest.mark.parametrize("preset_name,expected", [
    ("constraints", {"outcomes": ["applied", "applied"], "march_invoices": 2}),
    ("validated", {"outcomes": ["failed", "applied"], "march_invoices": 1}),
])
async def test_ex03_1_a_mid_month_period_slips_past_the_natural_key_without_validation(harness, preset_name, expected):
    assert await ex03_validation.march_invoices(harness, preset_name) == expected


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


@pytest.mark.parametrize("preset_name,expected", [
    ("constraints", {"tool_messages": 18, "leaking": 10, "kinds": ["identifier", "sql"]}),
    ("full", {"tool_messages": 6, "leaking": 0, "kinds": []}),
])
async def test_ex04_1_raw_errors_leak_in_an_episode_and_translated_ones_do_not(harness, preset_name, expected):
    assert await ex04_errors.leaking_messages(harness, preset_name) == expected


async def test_ex04_2_a_tool_call_id_leads_back_to_its_sqlstate_and_constraint(harness):
    calls = tool_calls(("ApplyCredit", {"customer_id": 5, "amount_cents": 999_999}),
                       ("LookupCustomer", {"customer_id": 5}), prefix="trace")
    await harness.node(preset("full").replace(policy="partial")).run_batch(calls, tenant_id="initech", thread_id="t-ex04")
    assert await ex04_errors.explain_call(harness, "trace-1") == {
        "tool": "ApplyCredit", "outcome": "failed", "sqlstate": "23514",
        "error_class": "psycopg.errors.CheckViolation", "constraint": "customers_credit_nonnegative",
    }
    assert await ex04_errors.explain_call(harness, "trace-2") == {
        "tool": "LookupCustomer", "outcome": "applied", "sqlstate": None, "error_class": None, "constraint": None,
    }
    assert (await ex04_errors.explain_call(harness, "no-such-call"))["tool"] is None


@pytest.mark.parametrize("preset_name,expected", [
    ("transaction", {"invoices": 0, "final_credit_cents": 0, "provider_charges": 0, "commit_rolled_back_events": 1}),
    ("savepoints", {"invoices": 1, "final_credit_cents": 0, "provider_charges": 1, "commit_rolled_back_events": 0}),
])
async def test_ex05_1_without_savepoints_the_invoice_is_lost_and_the_credit_spent(harness, preset_name, expected):
    assert await ex05_transactions.invoice_story(harness, preset_name) == expected


@pytest.mark.parametrize("policy,expected", [
    ("atomic", {"outcomes": ["failed", "not_applied", "not_applied"], "invoices": 0, "credit_memos": 0}),
    ("partial", {"outcomes": ["failed", "failed", "applied"], "invoices": 0, "credit_memos": 1}),
])
async def test_ex05_2_partial_keeps_the_independent_call_and_fails_the_dependent_one(harness, policy, expected):
    assert await ex05_transactions.dependent_batch(harness, policy) == expected


@pytest.mark.parametrize("timeouts,expected", [
    ((2000, 50), {"escalated": True, "batches": 3, "infrastructure_errors": 9, "timeouts_told_to_the_model": 0,
                  "final_credit_cents": 2500}),
    ((50, 300), {"escalated": True, "batches": 3, "infrastructure_errors": 0, "timeouts_told_to_the_model": 3,
                 "final_credit_cents": 2500}),
])
async def test_ex06_1_a_lock_timeout_is_retried_and_a_statement_timeout_is_told(harness, timeouts, expected):
    assert await ex06_graph.held_lock(harness, *timeouts) == expected


async def test_ex06_2_a_lock_released_during_the_retry_costs_one_attempt(harness):
    assert await ex06_graph.lock_released_on_retry(harness) == {
        "attempts": 2, "outcome": "applied", "final_credit_cents": 2400,
    }


@pytest.mark.parametrize("crash_point,ledger,deducted,ledger_rows", [
    ("before_commit", True, 2500, 3),
    ("before_commit", False, 2500, 0),
    ("after_commit", True, 2500, 3),
    ("after_commit", False, 5000, 0),
])
async def test_ex07_1_only_a_crash_after_the_commit_needs_the_ledger(harness, crash_point, ledger, deducted,
                                                                     ledger_rows):
    assert await ex07_ledger.crash_and_resume(harness, ledger=ledger, crash_point=crash_point) == {
        "credit_deducted_cents": deducted, "credit_memos": 1, "provider_refunds": 1, "ledger_rows": ledger_rows,
    }


async def test_ex07_2_the_ledger_remembers_what_the_crashed_run_applied(harness):
    await ex07_ledger.crash_and_resume(harness, ledger=True, crash_point="after_commit", thread_id="t-ex07")
    report = await ex07_ledger.ledger_report(harness, "t-ex07")
    assert report.to_dict("records") == [
        {"tool": tool, "applied": 1, "replayed": 1, "ledger_rows": 1}  # applied: rebuilt from the ledger (C38)
        for tool in ("ApplyCredit", "CreateCreditMemo", "QueueRefund")
    ]


async def test_ex08_1_a_forgotten_key_still_pays_once(harness):
    assert await ex08_outbox.late_recovery(harness, days=3) == {
        "status": "dispatched", "reconciled": 1, "charges_at_provider": 1,
    }


async def test_ex08_2_two_workers_share_the_queue_without_doubles(harness):
    assert await ex08_outbox.two_workers(harness) == {
        "dispatched": 10, "charges_at_provider": 10, "distinct_references": 10,
    }


async def test_ex10_1_a_switch_that_cannot_be_off_alone_is_refused(harness):
    with pytest.raises(ValueError, match="need a transaction"):
        await ex10_safeguards.knockout(harness, "transaction")


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


async def test_ex09_3_a_nemesis_that_never_strikes_fails_its_check(capsys):
    async def never(run) -> None:
        return None

    assert not await check("9.3", never)
    out = capsys.readouterr().out
    assert out.startswith("FAILED: crashed and resumed = {'naive': False, 'transaction': False, 'ledger': False, "
                          "'full': False}, expected")
    assert "passed: violations under full = []" in out  # nothing to find under full, crash or not


async def test_ex16_1_check_takes_the_notebooks_domain_and_a_silent_invariant_fails(capsys):
    from examples.payouts import DOMAIN

    async def silent(ctx) -> list[str]:
        return []

    assert not await check("16.1", silent, domain=DOMAIN)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "passed: lines for a clean episode under full = 0"
    assert out[1].startswith("FAILED: lines for backend_killed under ledger = 0, expected 'at least 1'; hint: ")
    with pytest.raises(TypeError, match="takes no arguments besides the function"):
        await check("2.1", silent, domain=DOMAIN)
