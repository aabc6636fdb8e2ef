"""The history rules real providers enforce on tool calls, checked before every model call.

OpenAI's Chat Completions API answers HTTP 400 when an assistant message's ``tool_calls`` are not
each answered by a ``tool`` message right after it ("An assistant message with 'tool_calls' must be
followed by tool messages responding to each 'tool_call_id'"), or when a ``tool`` message answers no
call of the assistant message before it ("messages with role 'tool' must be a response to a preceeding
message with 'tool_calls'"); Anthropic's Messages API wants each ``tool_use`` id unique and answered by
a ``tool_result`` in the very next message. In LangChain terms (:data:`RULES`):

- ``missing_id``: every call (valid or invalid) has a non-empty string id;
- ``duplicate_id``: no two calls of one AIMessage share an id;
- ``unanswered``: every call has a ToolMessage in the run of ToolMessages right after its AIMessage;
- ``answered_twice``: no call has two;
- ``not_adjacent``: nothing but ToolMessages sits between an AIMessage and its answers;
- ``answers_no_call``: every ToolMessage answers a call of the AIMessage before it.

The kit's design answers a break by repair, never by dropping what the thread holds:
:func:`agentlab.core.graph.repair_orphans` answers unanswered calls in the state; :func:`provider_view`
builds the list the model is sent (the state is left as it is): each AIMessage followed by exactly one
answer per call, in call order; a second call under an id already used in its message sent under a
derived id with the same answer (the tools node answers one id once, so a repeated id shares its
refusal); a ToolMessage that answers no call left out of what is sent. :func:`check_history` then
raises :class:`ProviderHistoryError` naming the call id if anything is still broken, so that a
history a provider would refuse never leaves the kit.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentlab.core.errors import AgentlabError
from agentlab.core.messages import all_tool_calls

if TYPE_CHECKING:
    from langchain_core.messages import AnyMessage

RULES = ("missing_id", "duplicate_id", "unanswered", "answered_twice", "not_adjacent", "answers_no_call")
REPEATED_ID_PREFIX = "call_rep_"


class ProviderHistoryError(AgentlabError):
    """Raised when the history about to be sent to the model breaks a rule providers enforce (:data:`RULES`);
    the message names the rule, the tool call id and the message's position."""


@dataclass(frozen=True)
class HistoryViolation:
    """One break of a provider rule: ``rule`` (one of :data:`RULES`), the tool call id (``None`` when the
    call has none), the position of the message in the history, and one line saying what is wrong."""

    rule: str
    call_id: str | None
    position: int
    detail: str


def history_violations(messages: list[AnyMessage]) -> list[HistoryViolation]:
    """Every break of :data:`RULES` in ``messages``, in order; empty when a provider would accept them."""
    from langchain_core.messages import AIMessage, ToolMessage

    out: list[HistoryViolation] = []
    late: set[int] = set()  # positions of answers already reported as not_adjacent
    i = 0
    while i < len(messages):
        m = messages[i]
        if isinstance(m, ToolMessage):
            if i not in late:
                out.append(HistoryViolation("answers_no_call", m.tool_call_id, i,
                                            "a ToolMessage that follows no AIMessage with tool calls"))
            i += 1
            continue
        calls = all_tool_calls(m) if isinstance(m, AIMessage) else []
        at, i = i, i + 1
        if not calls:
            continue
        ids = [c.get("id") for c in calls]
        seen: set[str] = set()
        for c in calls:
            cid = c.get("id")
            if not isinstance(cid, str) or not cid:
                out.append(HistoryViolation("missing_id", None, at, f"the {c.get('name')} call has no id"))
            elif cid in seen:
                out.append(HistoryViolation("duplicate_id", cid, at, "two calls of one AIMessage share this id"))
            else:
                seen.add(cid)
        answered: dict[str, int] = {}
        while i < len(messages) and isinstance(messages[i], ToolMessage):
            tid = messages[i].tool_call_id
            if tid not in ids:
                out.append(HistoryViolation("answers_no_call", tid, i, "a ToolMessage answers no call of the "
                                            "AIMessage before it"))
            elif tid in answered:
                out.append(HistoryViolation("answered_twice", tid, i, "a second ToolMessage for one call"))
            answered[tid] = answered.get(tid, 0) + 1
            i += 1
        for cid in dict.fromkeys(c for c in ids if isinstance(c, str) and c):
            if cid in answered:
                continue
            later = next((j for j in range(i, len(messages)) if isinstance(messages[j], ToolMessage)
                          and messages[j].tool_call_id == cid and _answers_after(messages, at, j)), None)
            if later is not None:
                late.add(later)
                out.append(HistoryViolation("not_adjacent", cid, later, "the answer comes after another kind of "
                                            "message, not right after its AIMessage"))
            else:
                out.append(HistoryViolation("unanswered", cid, at, "no ToolMessage answers this call"))
    return out


def _answers_after(messages, at: int, j: int) -> bool:
    """Whether ``messages[j]`` (a ToolMessage) belongs to the AIMessage at ``at``: no AIMessage between."""
    from langchain_core.messages import AIMessage

    return not any(isinstance(m, AIMessage) for m in messages[at + 1:j])


def check_history(messages: list[AnyMessage]) -> None:
    """Raise :class:`ProviderHistoryError` on the first break of :data:`RULES` in ``messages``."""
    found = history_violations(messages)
    if found:
        v = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ProviderHistoryError(f"the history for the model breaks the provider rule {v.rule!r} at message "
                                   f"{v.position}, tool call id {v.call_id!r}: {v.detail}{more}")


def repeated_call_id(call_id: str, message_id: str | None, index: int) -> str:
    """The id a repeated call (the ``index``-th call of its message, under an id used before in it) is sent
    under: stable for the same message, so every model call sees the same history."""
    digest = hashlib.sha256(f"{message_id}:{call_id}:{index}".encode("utf-8", "surrogatepass")).hexdigest()
    return f"{REPEATED_ID_PREFIX}{digest[:24]}"


def provider_view(messages: list[AnyMessage]) -> list[AnyMessage]:
    """``messages`` as the model is sent them: every AIMessage with tool calls followed at once by exactly
    one ToolMessage per call, in call order (see the module's docstring); other messages in their order.
    Returns ``messages`` itself when nothing needs to change. Calls without an id or without any answer
    are left as they are (:func:`agentlab.core.graph.repair_orphans` handles those first)."""
    from langchain_core.messages import AIMessage, ToolMessage

    if not history_violations(messages):
        return messages
    out: list = []
    pending: list = []  # non-tool messages that sat between an AIMessage and its answers
    i = 0
    while i < len(messages):
        m = messages[i]
        if isinstance(m, ToolMessage):
            i += 1  # answers no call of an AIMessage before it: not sent
            continue
        calls = all_tool_calls(m) if isinstance(m, AIMessage) else []
        i += 1
        if not calls:
            out.append(m)
            continue
        answers: dict[str, ToolMessage] = {}
        j = i
        while j < len(messages) and not isinstance(messages[j], AIMessage):
            if isinstance(messages[j], ToolMessage):
                answers.setdefault(messages[j].tool_call_id, messages[j])
            else:
                pending.append(messages[j])
            j += 1
        i = j
        seen: set[str] = set()
        renamed: dict[int, str] = {}
        for k, c in enumerate(calls):
            cid = c.get("id")
            if isinstance(cid, str) and cid in seen:
                renamed[k] = repeated_call_id(cid, m.id, k)
            elif isinstance(cid, str):
                seen.add(cid)
        if renamed:
            n = len(m.tool_calls)
            valid = [{**c, "id": renamed.get(k, c.get("id"))} for k, c in enumerate(m.tool_calls)]
            invalid = [{**c, "id": renamed.get(n + k, c.get("id"))} for k, c in enumerate(m.invalid_tool_calls)]
            m = m.model_copy(update={"tool_calls": valid, "invalid_tool_calls": invalid})
        out.append(m)
        for k, c in enumerate(calls):
            answer = answers.get(c.get("id"))
            if answer is None:
                continue
            out.append(answer if k not in renamed else answer.model_copy(update={"tool_call_id": renamed[k], "id": None}))
        out.extend(pending)
        pending = []
    return out
