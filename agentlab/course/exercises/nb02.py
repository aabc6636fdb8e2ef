"""Exercises of notebook 02 (schema constraints)."""

from agentlab.course.exercises import Case, Exercise

EXERCISES = (
    Exercise(
        id="2.1", title="One refund per reference", function="duplicate_refund",
        solution="agentlab.course.solutions.ex02_constraints:duplicate_refund",
        cases=(
            Case(args=("naive",), expected={"refund_rows": 2, "provider_refunds": 2, "second_call": "applied"}),
            Case(args=("constraints",), expected={"refund_rows": 1, "provider_refunds": 1, "second_call": "failed"}),
        ),
        hints={
            "refund_rows": "count the rows of <schema>.refunds for the customer and reference RMA-2001, in the "
                           "preset's schema (preset(name).schema: 'lax' for naive, 'public' otherwise)",
            "provider_refunds": "await h.worker.drain() first, then count h.provider.payments(customer) "
                                "whose kind is 'refund'",
            "second_call": "the second run_batch's results[0].outcome.value ('applied', 'failed', ...)",
            "*": "create the customer with new_customer(h, 5000, schema=preset(name).schema) and send the same "
                 "QueueRefund in two run_batch calls on one thread",
        },
    ),
    Exercise(
        id="2.2", title="Adding a CHECK to a table that already breaks it", function="check_on_a_table_with_bad_rows",
        solution="agentlab.course.solutions.ex02_constraints:check_on_a_table_with_bad_rows",
        cases=(
            Case(expected={
                "balance_after_naive_deduction": -500, "add_constraint": "23514", "add_constraint_not_valid": "ok",
                "new_over_balance_deduction": "failed", "other_balance": 1000, "old_row_balance": -500,
                "validate_before_repair": "23514", "validate_after_repair": "ok",
            }),
        ),
        hints={
            "balance_after_naive_deduction": "a lax customer with 1000 cents, then ApplyCredit of 1500 under naive",
            "add_constraint": "catch psycopg.Error and return exc.sqlstate; 23514 is check_violation",
            "add_constraint_not_valid": "ADD CONSTRAINT ... NOT VALID checks new writes only: it succeeds",
            "new_over_balance_deduction": "a second lax customer with 1000 cents, ApplyCredit of 1500 under naive: "
                                          "the outcome of that call once the NOT VALID check is in place",
            "other_balance": "the second customer's credit_cents after the refused deduction",
            "old_row_balance": "the first customer's credit_cents: NOT VALID leaves old rows alone",
            "validate_before_repair": "VALIDATE CONSTRAINT checks every row: the old one still breaks it",
            "validate_after_repair": "UPDATE lax.customers SET credit_cents = 0 WHERE credit_cents < 0, then validate",
            "*": "run each ALTER TABLE in its own statement on a connection of h.pool and keep its SQLSTATE or 'ok'",
        },
    ),
)
