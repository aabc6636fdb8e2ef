"""Exercises of notebook 05 (the transactional node)."""

from agentlab.course.exercises import Case, Exercise

EXERCISES = (
    Exercise(
        id="5.1", title="The trap in a whole episode", function="invoice_story",
        solution="agentlab.course.solutions.ex05_transactions:invoice_story",
        cases=(
            Case(args=("transaction",), expected={"invoices": 0, "final_credit_cents": 0, "provider_charges": 0,
                                                  "commit_rolled_back_events": 1}),
            Case(args=("savepoints",), expected={"invoices": 1, "final_credit_cents": 0, "provider_charges": 1,
                                                 "commit_rolled_back_events": 0}),
        ),
        hints={
            "invoices": "(await h.end_state(episode))['customers'][0]['invoices']",
            "final_credit_cents": "the same dict's 'final_credit_cents'",
            "provider_charges": "the same dict's 'provider_charges'",
            "commit_rolled_back_events": "await h.events.flush(), then count the events of episode.thread_id "
                                         "whose outcome is 'commit_rolled_back'",
        },
    ),
    Exercise(
        id="5.2", title="Partial and a dependent call", function="dependent_batch",
        solution="agentlab.course.solutions.ex05_transactions:dependent_batch",
        cases=(
            Case(args=("atomic",), expected={"outcomes": ["failed", "not_applied", "not_applied"], "invoices": 0,
                                             "credit_memos": 0}),
            Case(args=("partial",), expected={"outcomes": ["failed", "failed", "applied"], "invoices": 0,
                                              "credit_memos": 1}),
        ),
        hints={
            "outcomes": "[r.outcome.value for r in batch.results], in the order of the calls",
            "invoices": "count the customer's invoices with billing_period '2026-04-01'",
            "credit_memos": "(await customer_rows(h, [customer])).iloc[0]['credit_memos']",
            "*": "one batch of three calls under preset('full').replace(policy=policy) (a preset cannot be changed "
                 "in place: .replace returns a new one), for a new customer with 0 cents",
        },
    ),
)
