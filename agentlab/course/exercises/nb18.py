"""Exercises of notebook 18 (two conversations, one row): which settings hold, the lost deduction."""

from __future__ import annotations

from agentlab.course.exercises import Case, Exercise, Verdict
from agentlab.course.exercises.values import same

HOLD = ["serializable", "read committed + row locks", "serializable + row locks"]


async def _verify_settings(fn) -> list[Verdict]:
    """18.1: the learner's function on the isolation matrix of a fresh database."""
    from agentlab.lab.anomalies import isolation_matrix
    from agentlab.runtime.harness import Harness

    async with await Harness.open(purpose="exercise") as h:
        matrix = await isolation_matrix(h, seed=0)
    got = list(fn(matrix))
    return [Verdict("settings that hold", got, same(got, HOLD), HOLD)]


def _no_row_locks():
    from agentlab.core.safeguards import preset

    return preset("full").replace(row_locks=False, name="read committed")


def _full():
    from agentlab.core.safeguards import preset

    return preset("full")


EXERCISES = (
    Exercise(
        id="18.1", title="Which settings hold?", function="settings_that_hold",
        solution="agentlab.course.solutions.ex18_two_conversations:settings_that_hold",
        verify=_verify_settings,
        hints={"settings that hold": "a setting holds when every one of its rows has value == intended and 0 "
                                     "violations; keep the matrix's order (groupby('setting', sort=False))"},
    ),
    Exercise(
        id="18.2", title="The lost deduction, in the database", function="redeem_twice",
        solution="agentlab.course.solutions.ex18_two_conversations:redeem_twice",
        cases=(
            Case(args=(_no_row_locks(),), label="redeem_twice(h, preset('full').replace(row_locks=False))",
                 expected={"credit_cents": 3500, "redemptions": 2, "redeemed_cents": 3500}),
            Case(args=(_full(),), label="redeem_twice(h, preset('full'))",
                 expected={"credit_cents": 1500, "redemptions": 2, "redeemed_cents": 3500}),
        ),
        hints={
            "credit_cents": "the customer's credit_cents in setting.schema's customers table, after the run",
            "redemptions": "the rows of limits.credit_redemptions for the customer",
            "redeemed_cents": "their sum of amount_cents",
            "*": "async with Lab(h) as lab: run = await lab.run('lost_update', setting, seed=seed); the customer is "
                 "run.episode.customer_ids[0]",
        },
    ),
)
