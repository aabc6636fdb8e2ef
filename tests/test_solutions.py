"""The notebooks' exercises: each reference solution in ``agentlab/course/solutions/``, run through ``check``
as a learner's function is (a fresh database per case), returns the values its notebook promises, which are
written once, in ``agentlab/course/exercises/nbNN.py``; the tests below them assert what a value comparison
cannot."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agentlab.core.errors import find_leaks
from agentlab.course.exercises import check, exercises, get_exercise, reference, solution
from agentlab.course.solutions import (
    ex02_constraints,
    ex03_validation,
    ex10_safeguards,
    ex15_tenancy,
)

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = exercises()
LONG_CHECKS = {"9.1", "10.1"}  # their checks run experiments (8 to 11 s each): left out of the fast tier


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
            assert not any(re.search(r"^\s*(from|import)\s+(agentlab\.course\.)?solutions\b", c, re.MULTILINE)
                           for c in cells), path.name


@pytest.mark.parametrize("exercise", [pytest.param(e, id=e.id, marks=[pytest.mark.slow] if e.id in LONG_CHECKS else [])
                                      for e in EXERCISES])
async def test_each_reference_solution_passes_its_own_check(exercise, capsys):
    """The reference solution, run as ``check`` runs a learner's function (a fresh database per case),
    returns every value the notebook's statement promises; the expected values live in
    ``agentlab/course/exercises/nbNN.py`` alone."""
    # no per-case limit: what is checked is the values (10.1's experiment passed 60 s on a loaded machine)
    assert await check(exercise.id, reference(exercise), timeout_s=None)
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
                       "  FAILED: second_call missing, expected 'applied' (str); hint: the dict returned has no key "
                       "'second_call' (spelling counts); " + get_exercise("2.1").hint("second_call")]
    assert out[5].startswith("  FAILED: refund_rows = 2 (int), expected 1 (int); hint: ")
    assert not await check("2.1", a_frame)
    assert capsys.readouterr().out.splitlines()[1].startswith("  FAILED: refund_rows = <a DataFrame of shape (1, 1)>, ")
    assert not await check("2.1", crashes)
    assert capsys.readouterr().out.startswith("FAILED: duplicate_refund(h, 'naive') raised KeyError: 'refunds'; hint: ")


async def test_an_exercise_with_its_own_verify_checks_a_plain_function(capsys):
    assert not await check("3.2", lambda cases: ["accepted"] * len(cases))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["passed"] + ["FAILED"] * 4 + ["passed"]
    assert lines[1].startswith("FAILED: the same customer twice = 'accepted' (str), expected a refusal")


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
    from agentlab.course.solutions.ex16_byo_tool import no_payout_without_its_intent
    from examples.payouts import DOMAIN

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
                          "'full': False} (dict), expected")
    assert "passed: violations under full = []" in out  # nothing to find under full, crash or not


async def test_ex16_1_check_takes_the_notebooks_domain_and_a_silent_invariant_fails(capsys):
    from examples.payouts import DOMAIN

    async def silent(ctx) -> list[str]:
        return []

    assert not await check("16.1", silent, domain=DOMAIN)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "passed: lines for a clean episode under full = 0"
    assert out[1].startswith("FAILED: lines for backend_killed under ledger = 0 (int), expected at least 1; hint: ")
    with pytest.raises(TypeError, match="takes no arguments besides the function"):
        await check("2.1", silent, domain=DOMAIN)

    async def broken(ctx) -> list[str]:
        raise KeyError("payouts")

    assert not await check("16.1", broken, domain=DOMAIN)
    out = capsys.readouterr().out
    assert out.startswith("FAILED: no_payout_without_its_intent(ctx) = ") and "raised KeyError: 'payouts'" in out


@pytest.mark.slow
async def test_a_case_that_hangs_is_stopped_after_timeout_s_with_its_transaction_rolled_back(capsys, monkeypatch):
    """A learner's function that takes a row lock in a transaction and then waits forever (a sleep, then a
    query that never ends): each case prints one FAILED line after ``timeout_s`` and the check ends. Read
    just before each case's database is dropped (the drop would end any session itself): no session of
    that database is left inside a transaction or running a query, and the learner's backends hold no lock."""
    import asyncio
    import time

    from agentlab.runtime import db

    backends: list[tuple[int, str]] = []  # (pid, database) of each case's learner connection
    left: dict[str, list[tuple]] = {}  # database -> its sessions in a transaction or a query, at the drop
    drop = db.drop_database

    def drop_after_looking(url_or_name: str) -> None:
        name = db.dbname_of(url_or_name)
        with db.admin_connection() as conn:
            left[name] = conn.execute(
                "SELECT a.pid, a.state, (SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid AND l.locktype <> 'virtualxid') "
                "FROM pg_stat_activity a WHERE a.datname = %s AND (a.state IN ('active', 'idle in transaction', "
                "'idle in transaction (aborted)') OR a.pid = ANY(%s))", (name, [p for p, _ in backends])).fetchall()
        drop(url_or_name)

    monkeypatch.setattr(db, "drop_database", drop_after_looking)

    async def hangs(h, preset_name) -> dict:
        async with h.pool.connection() as conn, conn.transaction():
            await conn.execute("UPDATE customers SET credit_cents = credit_cents WHERE id = 1")  # a row lock, held
            backends.append((conn.info.backend_pid, db.dbname_of(h.url)))
            if preset_name == "naive":
                await asyncio.sleep(3600)
            await conn.execute("SELECT pg_sleep(3600)")  # a query the server runs until cancelled
        return {}

    t0 = time.perf_counter()
    # 3 s: long enough for each case to reach its lock on a loaded machine (at 0.5 s it sometimes did not)
    assert await asyncio.wait_for(check("2.1", hangs, timeout_s=3), 300) is False
    assert time.perf_counter() - t0 < 300  # two cases of 3 s plus their databases, not an hour
    out = capsys.readouterr().out.splitlines()
    hint = ("it waits for something that never comes (a lock another transaction holds, an await that never returns, "
            "a loop with no end); its transaction was rolled back and its connection given back. "
            "`timeout_s=None` lifts the limit")
    assert out == [f"FAILED: duplicate_refund(h, '{p}') took longer than 3 s and was stopped; hint: {hint}"
                   for p in ("naive", "constraints")]
    assert [name for _, name in backends] == list(left) and len(set(left)) == 2  # both cases reached their lock
    for pid, name in backends:
        assert [r for r in left[name] if r[1] != "idle" or r[2]] == [], (pid, left[name])  # none held or running
    with db.admin_connection() as conn:  # and the databases are gone
        assert conn.execute("SELECT count(*) FROM pg_database WHERE datname = ANY(%s)", (list(left),)).fetchone()[0] == 0
    with pytest.raises(ValueError, match="timeout_s is a number of seconds"):
        await check("2.1", hangs, timeout_s=0)
