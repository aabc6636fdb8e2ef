"""What the model reads: the FAILED / NOT APPLIED texts, and reading calls and answers from a history.

Every tool call gets exactly one ToolMessage. A failed call reads ``FAILED [<category>]: <reason>``
(:data:`FAILED_TEMPLATE`); a call that was rolled back with its batch, or never ran, reads
``NOT APPLIED: <reason> Send this call again unchanged.`` (:data:`NOT_APPLIED_TEMPLATE`). The texts are
constants so that tests, notebooks and the scripted model can name them.
"""

from __future__ import annotations

from langchain_core.messages import AIMessage, AnyMessage, ToolMessage

FAILED_PREFIX = "FAILED"
NOT_APPLIED_PREFIX = "NOT APPLIED"
FAILED_TEMPLATE = "FAILED [{category}]: {reason}"
NOT_APPLIED_TEMPLATE = "NOT APPLIED: {reason} Send this call again unchanged."

BATCH_ROLLED_BACK = "another call in this batch failed, so the whole batch was rolled back."
EARLIER_CALL_FAILED = "an earlier call in this batch failed and aborted the transaction, so this call did not run."
INFRA_UNAVAILABLE = "the database was temporarily unavailable; nothing in this batch was applied."
ORPHANED_CALL = "this call was interrupted before it finished and no result was recorded."
DUPLICATE_CALL_ID = "this tool call id appears more than once in the batch; send each call with its own id."
INVALID_CALL_ID = "this tool call id holds characters that cannot be stored; send each call with a plain id."
COMMIT_FAILED = "the batch could not be committed ({reason}); none of its calls was applied."
LEDGER_ARGS_MISMATCH = (
    "this tool call id was already applied with other arguments; the earlier call stands. "
    "If the change is still needed, send it as a new call."
)
REJECTED_BY_REVIEWER = "a reviewer rejected this call; it was not applied. Do not send it again."


def unanswered_tool_calls(messages: list[AnyMessage]) -> list[str]:
    """Tool call ids of AIMessages that have no ToolMessage in ``messages``."""
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    return [tc["id"] for m in messages if isinstance(m, AIMessage) for tc in m.tool_calls if tc["id"] not in answered]


def steps(messages: list) -> list[dict]:
    """Each batch the model sent, with each call's outcome and the text the model got back."""
    replies = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    out = []
    for m in messages:
        if not isinstance(m, AIMessage) or not m.tool_calls:
            continue
        calls = []
        for tc in m.tool_calls:
            reply = replies.get(tc["id"])
            artifact = getattr(reply, "artifact", None) or {}
            calls.append({"tool": tc["name"], "args": tc["args"],
                          "outcome": artifact.get("outcome", "unanswered" if reply is None else "unknown"),
                          "reply": str(reply.content) if reply is not None else None})
        out.append({"calls": calls})
    return out
