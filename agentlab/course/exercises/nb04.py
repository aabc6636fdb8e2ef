"""Exercises of notebook 04 (the error translator)."""

from agentlab.core.safeguards import preset
from agentlab.course.exercises import Case, Exercise
from agentlab.lab.batches import tool_calls


async def trace_batch(h) -> None:
    """Exercise 4.2's setup: an over-balance ``ApplyCredit`` (call ``trace-1``) and a ``LookupCustomer``
    (``trace-2``) for seed customer 5 of tenant initech, under ``full`` with the partial policy."""
    calls = tool_calls(("ApplyCredit", {"customer_id": 5, "amount_cents": 999_999}),
                       ("LookupCustomer", {"customer_id": 5}), prefix="trace")
    await h.node(preset("full").replace(policy="partial")).run_batch(calls, tenant_id="initech", thread_id="t-ex04")


NOTHING = {"tool": None, "outcome": None, "sqlstate": None, "error_class": None, "constraint": None}

EXERCISES = (
    Exercise(
        id="4.1", title="Leaks in a whole episode", function="leaking_messages",
        solution="agentlab.course.solutions.ex04_errors:leaking_messages",
        cases=(
            Case(args=("constraints",), expected={"tool_messages": 18, "leaking": 10, "kinds": ["identifier", "sql"]}),
            Case(args=("full",), expected={"tool_messages": 6, "leaking": 0, "kinds": []}),
        ),
        hints={
            "tool_messages": "len(episode.tool_messages), episode = await h.run_episode('invoice', preset_name)",
            "leaking": "the messages for which find_leaks(str(m.content)) is not empty",
            "kinds": "the kinds find_leaks returns, over all messages, without repeats, sorted",
        },
    ),
    Exercise(
        id="4.2", title="From the model's message back to the cause", function="explain_call",
        solution="agentlab.course.solutions.ex04_errors:explain_call",
        cases=(
            Case(args=("trace-1",), setup=trace_batch, expected={
                "tool": "ApplyCredit", "outcome": "failed", "sqlstate": "23514",
                "error_class": "psycopg.errors.CheckViolation", "constraint": "customers_credit_nonnegative"}),
            Case(args=("trace-2",), setup=trace_batch, expected={
                "tool": "LookupCustomer", "outcome": "applied", "sqlstate": None, "error_class": None,
                "constraint": None}),
            Case(args=("no-such-call",), setup=trace_batch, expected=NOTHING),
        ),
        hints={
            "tool": "the tool_name of the call's latest event (node = 'tools', ORDER BY id DESC LIMIT 1); "
                    "await h.events.flush() first, events are written in batches",
            "outcome": "the event's outcome column",
            "sqlstate": "the event's sqlstate column (None when the call applied)",
            "error_class": "the event's error_class column",
            "constraint": "the word after 'constraint_name=' in the event's detail, None when there is none",
            "*": "a call id with no event gives every key None",
        },
    ),
)
