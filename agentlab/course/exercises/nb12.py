"""Exercises of notebook 12 (human approval): where the threshold is, one word for every call."""

from __future__ import annotations

from agentlab.course.exercises import Case, Exercise

EXERCISES = (
    Exercise(
        id="12.1", title="Where is the threshold?", function="approval_for_threshold",
        solution="agentlab.course.solutions.ex12_approval:approval_for_threshold",
        cases=(
            Case(args=(10_000,), expected={"requests": 1, "calls_in_request": [30000, 15000], "refunds": 2}),
            Case(args=(20_000,), expected={"requests": 1, "calls_in_request": [30000], "refunds": 2}),
            Case(args=(50_000,), expected={"requests": 0, "calls_in_request": [], "refunds": 2}),
        ),
        hints={
            "requests": "len(interrupts_of(state)) of the state the first ainvoke returned: one per approval request",
            "calls_in_request": "interrupts_of(state)[0]['calls']: each call's 'amount_cents'",
            "refunds": "resume with resume_command('approve') when there is a request, then count the "
                       "customer's refunds rows",
            "*": "play APPROVAL under preset('full') with h.graph(..., approval=ApprovalPolicy(threshold_cents=t)); "
                 "resume with graph.ainvoke(resume_command('approve'), config), a Command(resume=...), never the "
                 "plain word: the graph takes a plain value as new input",
        },
    ),
    Exercise(
        id="12.2", title="One word for every call", function="answer_all",
        solution="agentlab.course.solutions.ex12_approval:answer_all",
        cases=(
            Case(args=("approve",), expected={"tool_messages": 2, "rejected": 0, "tools_node_runs": 1, "refunds": 2,
                                              "outbox_rows": 2}),
            Case(args=("reject",), expected={"tool_messages": 2, "rejected": 2, "tools_node_runs": 0, "refunds": 0,
                                             "outbox_rows": 0}),
            Case(args=("yes",), expected={"tool_messages": 2, "rejected": 2, "tools_node_runs": 0, "refunds": 0,
                                          "outbox_rows": 0}),
        ),
        hints={
            "rejected": "ToolMessages for which classify(m) == ('failed', 'rejected')",
            "tools_node_runs": "await h.events.flush(), then the thread's events of kind 'node' whose node is 'tools'",
            "outbox_rows": "SELECT count(*) FROM outbox WHERE thread_id = %s",
            "*": "interrupt at the approval step, then graph.ainvoke(resume_command(answer), config) with the one "
                 "word for the whole request",
        },
    ),
)
