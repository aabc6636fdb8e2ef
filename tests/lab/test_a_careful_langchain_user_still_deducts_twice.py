"""The fair LangChain column: ``create_agent`` with ``ToolRetryMiddleware`` (inner, ``on_failure="error"``) and
``ToolErrorMiddleware`` (outer, naming the exception's type), as their docs compose them. Every call gets its
answer and no SQL reaches the model, but nothing says which calls were applied: the model resends the refund
batch and the deduction, which has no natural key, applies twice. Values from the database and the provider."""

from __future__ import annotations

import pytest
from langchain_core.messages import ToolMessage

from agentlab.lab.yardstick import Yardstick
from conftest import scalar


@pytest.mark.slow
async def test_the_hardened_create_agent_answers_every_call_and_still_deducts_twice(harness):
    run = await Yardstick(harness).run("create_agent_hardened", "refund_story")
    (cid,) = run.customer_ids
    assert run.status == "ran" and run.raised is None
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = %s", (cid,)) == 0  # 5000 - 2 x 2500
    assert await scalar(harness, "SELECT count(*) FROM credit_memos WHERE customer_id = %s", (cid,)) == 1
    kinds = run.counts()
    assert kinds["unanswered_call"] == 0 and kinds["leak"] == 0 and kinds["balance_mismatch"] == 1
    errors = [m.content for m in run.messages if isinstance(m, ToolMessage) and m.status == "error"]
    # the argument error is ToolNode's own text (validation runs before the middleware); the execution
    # errors are the handler's: the tool's name and the exception's type, never its SQL
    assert errors[0].startswith("Error invoking tool 'refund_to_card'")
    assert "`create_credit_memo` failed (UniqueViolation); fix the input and retry." in errors
    assert not any("INSERT" in e or "DETAIL" in e for e in errors)


async def test_the_hardened_create_agent_leaves_the_crash_mid_node_fault_not_applicable(harness):
    run = await Yardstick(harness).run("create_agent_hardened", "crash_mid_node")
    assert run.status == "n/a" and "node_hooks" in run.reason
