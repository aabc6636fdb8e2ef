"""Exercises of notebook 06 (the graph: retries, escalation)."""

from agentlab.course.exercises import Case, Exercise

EXERCISES = (
    Exercise(
        id="6.1", title="A statement timeout instead of a lock timeout", function="held_lock",
        solution="agentlab.course.solutions.ex06_graph:held_lock",
        cases=(
            Case(args=(2000, 50), expected={"escalated": True, "batches": 3, "infrastructure_errors": 9,
                                            "timeouts_told_to_the_model": 0, "final_credit_cents": 2500}),
            Case(args=(50, 300), expected={"escalated": True, "batches": 3, "infrastructure_errors": 0,
                                           "timeouts_told_to_the_model": 3, "final_credit_cents": 2500}),
        ),
        hints={
            "escalated": "bool(state.get('escalated')) of the state graph.ainvoke returned",
            "batches": "the AIMessages of state['messages'] that carry tool_calls",
            "infrastructure_errors": "await h.events.flush(), then count the thread's events with node = 'tools' "
                                     "and outcome = 'infrastructure_error'",
            "timeouts_told_to_the_model": "the thread's events with node = 'tools' and category = 'timeout'",
            "final_credit_cents": "the customer's credit_cents after the run: the deduction never applied",
            "*": "preset('full').replace(statement_timeout_ms=..., lock_timeout_ms=...), and the holder's "
                 "SELECT ... FOR UPDATE taken before graph.ainvoke",
        },
    ),
    Exercise(
        id="6.2", title="A retry that wins", function="lock_released_on_retry",
        solution="agentlab.course.solutions.ex06_graph:lock_released_on_retry",
        cases=(Case(expected={"attempts": 2, "outcome": "applied", "final_credit_cents": 2400}),),
        hints={
            "attempts": "count the calls of your before_call hook: one per attempt of the node",
            "outcome": "the ToolMessage's artifact['outcome'] (the message with a tool_call_id)",
            "final_credit_cents": "2500 minus the 100 the call applied once",
            "*": "node.hooks.before_call.append(hook) with async def hook(call, index); on the second call "
                 "await holder.rollback()",
        },
    ),
)
