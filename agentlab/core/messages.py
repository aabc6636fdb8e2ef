"""What the model reads: the FAILED / NOT APPLIED texts, and reading calls and answers from a history.

Every tool call gets exactly one ToolMessage. A failed call reads ``FAILED [<category>]: <reason>``
(:data:`FAILED_TEMPLATE`); a call that was rolled back with its batch, or never ran, reads
``NOT APPLIED: <reason> Send this call again unchanged.`` (:data:`NOT_APPLIED_TEMPLATE`). The texts are
constants so that tests, notebooks and the scripted model can name them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: the error translator (and the command line) need only the texts
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
ALREADY_QUEUED_OTHERWISE = (
    "{queued} is already queued under the same natural key (the same invoice or reference) and stands unchanged; "
    "this call asks for another amount or customer and was not applied. Do not send it again as is; the same "
    "arguments as the queued one are answered already_queued."
)
MISSING_CALL_ID = "this tool call has no id; send each call with its own plain, short id."
CALL_ID_TOO_LONG = "this tool call id is too long to be stored; send each call with a plain, short id."
INVALID_JSON_ARGUMENTS = "the arguments are not valid JSON; resend the call with a JSON object as its arguments."
REJECTED_BY_REVIEWER = "a reviewer rejected this call; it was not applied. Do not send it again."
REVIEWER_SAID = "{rejected} The reviewer said: {message}"  # a rejection that gives a reason
CHANGED_AFTER_APPROVAL = ("this call was changed after a reviewer decided it, so it was not applied; send it again "
                          "if it is still needed, and it will be reviewed again.")


SYNTHETIC_ID_PREFIX = "call_syn_"


def synthetic_call_id(message_id: str, index: int, kind: str = "tool_call") -> str:
    """A stand-in id for the ``index``-th call (of ``kind``: ``tool_call`` or ``invalid_tool_call``) of
    the AIMessage ``message_id`` that came without one (case C15): the same on every node retry,
    resume and replay, because the checkpointed AIMessage keeps its id."""
    digest = hashlib.sha256(f"{message_id}:{kind}:{index}".encode("utf-8", "surrogatepass")).hexdigest()
    return f"{SYNTHETIC_ID_PREFIX}{digest[:24]}"


def args_hash(call: Mapping) -> str:
    """SHA-256 (hex) of a tool call's name and arguments as key-sorted JSON: what a reviewer approves."""
    text = json.dumps({"name": call.get("name"), "args": call.get("args")}, sort_keys=True, default=str,
                      separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()


def with_call_ids(message: AIMessage) -> AIMessage | None:
    """A copy of ``message`` whose tool calls (valid and invalid) all have a string id; None when they
    already do or ``message`` has no id of its own to derive stable ids from.

    A call whose id is None or empty gets :func:`synthetic_call_id`; the copy keeps ``message.id``, so
    ``add_messages`` replaces the stored AIMessage instead of adding a second one.
    """
    calls, invalid = list(message.tool_calls), list(getattr(message, "invalid_tool_calls", []) or [])
    if not message.id or all(c.get("id") for c in calls + invalid):
        return None
    fixed = [c if c.get("id") else {**c, "id": synthetic_call_id(message.id, i)} for i, c in enumerate(calls)]
    fixed_invalid = [c if c.get("id") else {**c, "id": synthetic_call_id(message.id, i, "invalid_tool_call")}
                     for i, c in enumerate(invalid)]
    return message.model_copy(update={"tool_calls": fixed, "invalid_tool_calls": fixed_invalid})


def all_tool_calls(message: AIMessage) -> list[dict]:
    """The calls of ``message`` in order: ``tool_calls`` first, then ``invalid_tool_calls`` (arguments
    that were not valid JSON; LangChain keeps them apart, so their place among the others is lost)."""
    return [*message.tool_calls, *(getattr(message, "invalid_tool_calls", None) or [])]


def batches(messages: list[AnyMessage]) -> Iterator[tuple[int, AIMessage, dict[str, ToolMessage]]]:
    """Each AIMessage of ``messages`` with its position and the ToolMessages that answer it, by id.

    A ToolMessage answers the calls of the nearest AIMessage before it: ids are unique within a batch
    but some models reuse them across turns (a constant id, ``functions.NAME:0`` on every round, case
    C17), so an answer of an earlier turn never counts for a later one."""
    from langchain_core.messages import AIMessage, ToolMessage

    current: tuple[int, AIMessage, dict[str, ToolMessage]] | None = None
    for i, m in enumerate(messages):
        if isinstance(m, AIMessage):
            if current is not None:
                yield current
            current = (i, m, {})
        elif isinstance(m, ToolMessage) and current is not None:
            current[2].setdefault(m.tool_call_id, m)
    if current is not None:
        yield current


def unanswered_tool_calls(messages: list[AnyMessage]) -> list[str]:
    """Tool call ids (valid and invalid calls) of AIMessages that have no ToolMessage after them (before
    the next AIMessage). A call with no id at all is listed as ``""``."""
    return [tc.get("id") or "" for _, m, replies in batches(messages) for tc in all_tool_calls(m)
            if (tc.get("id") or "") not in replies]


def occurrences(messages: list[AnyMessage], at: int) -> dict[str, int]:
    """For each call id of the AIMessage ``messages[at]``: how many earlier AIMessages hold the same id.

    The ledger keys a call by it (:func:`agentlab.core.batch.idempotency_key`): a node retry, a
    resume or a replay of that AIMessage sees the same history before it and so the same number; a
    later turn that reuses the id sees one more."""
    from langchain_core.messages import AIMessage

    counts: dict[str, int] = {}
    for m in messages[:at]:
        if isinstance(m, AIMessage):
            for cid in {tc.get("id") for tc in all_tool_calls(m) if tc.get("id")}:
                counts[cid] = counts.get(cid, 0) + 1
    return {cid: counts.get(cid, 0) for cid in (tc.get("id") for tc in all_tool_calls(messages[at])) if cid}


def steps(messages: list) -> list[dict]:
    """Each batch the model sent, with each call's outcome and the text the model got back."""
    out = []
    for _, m, replies in batches(messages):
        if not all_tool_calls(m):
            continue
        calls = []
        for tc in all_tool_calls(m):
            reply = replies.get(tc.get("id") or "")
            artifact = getattr(reply, "artifact", None) or {}
            calls.append({"tool": tc["name"], "args": tc["args"],
                          "outcome": artifact.get("outcome", "unanswered" if reply is None else "unknown"),
                          "reply": str(reply.content) if reply is not None else None})
        out.append({"calls": calls})
    return out
