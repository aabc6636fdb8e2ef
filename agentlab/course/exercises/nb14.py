"""Exercises of notebook 14 (observability): tokens per super-step, the retries the state does not show."""

from __future__ import annotations

from agentlab.course.exercises import Case, Exercise

CLEAN, RETRIED, APPROVED = "nb14-clean", "nb14-retried", "nb14-approval"


async def _clean(h) -> None:
    """The notebook's clean run: the refund story under full."""
    await h.run_episode("refund", "full", thread_id=CLEAN)


async def _retried(h) -> None:
    """The notebook's run with a hidden retry: a second session holds the customer's row during the tools
    node's first attempt."""
    from agentlab.lab.observability import episode_with_a_retry

    await episode_with_a_retry(h, "refund", thread_id=RETRIED)


async def _approved(h) -> None:
    """The notebook's approval run, approved at once: the approve node runs again on resume."""
    from langchain_core.messages import HumanMessage

    from agentlab.core.graph import run_config
    from agentlab.core.safeguards import preset
    from agentlab.durable.approval import APPROVAL, ApprovalPolicy
    from agentlab.durable.approval_review import resume_command
    from agentlab.sim.model import ScriptedChatModel

    ids = await h.create_customers(APPROVAL, preset("full"))
    graph = h.graph(preset("full"), ScriptedChatModel(script=APPROVAL.script(ids), seed=0), approval=ApprovalPolicy())
    config = run_config(APPROVED, tenant_id=APPROVAL.tenant_id)
    await graph.ainvoke({"messages": [HumanMessage(APPROVAL.prompt)]}, config)
    await graph.ainvoke(resume_command("approve"), config)
    await h.events.flush()


def _columns(frame) -> dict:
    return frame.to_dict("list")


def _rows(frame) -> list:
    return frame.to_dict("records")


EXERCISES = (
    Exercise(
        id="14.1", title="Tokens per super-step", function="tokens_by_super_step",
        solution="agentlab.course.solutions.ex14_observability:tokens_by_super_step",
        cases=(Case(args=(CLEAN,), setup=_clean, read=_columns, expected={
            "step": [1, 3, 5], "input_tokens": [35, 239, 405], "output_tokens": [119, 119, 5],
            "cumulative_input_tokens": [35, 274, 679]}),),
        hints={
            "step": "the node events of the agent node (await run_events(h, thread_id, kind='node'), node == "
                    "'agent'), in order",
            "cumulative_input_tokens": "frame['input_tokens'].cumsum()",
            "*": "return a DataFrame with the columns step, input_tokens, output_tokens, cumulative_input_tokens, "
                 "one row per model call (reset_index(drop=True))",
        },
    ),
    Exercise(
        id="14.2", title="Find the retries", function="retries",
        solution="agentlab.course.solutions.ex14_observability:retries",
        cases=(
            Case(args=(CLEAN,), setup=_clean, read=_rows, expected=[]),
            Case(args=(RETRIED,), setup=_retried, read=_rows, expected=[{
                "node": "tools", "step": 4, "attempts": 2, "outcomes": "error → ok",
                "error_class": "psycopg.errors.LockNotAvailable"}]),
            Case(args=(APPROVED,), setup=_approved, read=_rows, expected=[{
                "node": "approve", "step": 2, "attempts": 2, "outcomes": "interrupted → ok", "error_class": ""}]),
        ),
        hints={
            "*": "group the node events by (node, step); keep the groups of 2+ rows: node, step (int), attempts "
                 "(the group's size), outcomes joined with ' → ', error_class of the failed ones ('' when none); "
                 "one dict per row: frame.to_dict('records')",
        },
    ),
)
