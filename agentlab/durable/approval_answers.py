"""Reading a reviewer's answer to an approval request (:mod:`agentlab.durable.approval` asks for it).

A resume value (``Command(resume=...)``) is read against the calls the request listed: one
:class:`Decision` per call (``"approve"``, ``"edit"`` or ``"reject"``), bound to what the reviewer saw by
the hash of each call's tool and arguments (``args_sha256``, :func:`agentlab.core.messages.args_hash`;
case C22). Anything but an approve or a valid edit is a rejection, the safe default. An edit's new
arguments are validated like any call (the tool's strict argument model, storable text); one that fails
decides nothing and comes back to the reviewer as ``errors`` (``{tool_call_id: reason}``). Also here: the
decisions a reviewer writes (:func:`edit_call`, :func:`reject_call`) and the AIMessage with edited
arguments (:func:`edited_message`).

Source: LangChain docs "Human-in-the-loop" (approve, edit, reject).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage
from pydantic import ValidationError

from agentlab.core.messages import args_hash
from agentlab.core.storable import UNSTORABLE_REASON, storable_text, unstorable_path

APPROVE = "approve"
EDIT = "edit"
REJECT = "reject"
MAX_REASON_CHARS = 500  # a reviewer's reason, as the model reads it


@dataclass(frozen=True)
class Decision:
    """What a reviewer decided for one call.

    ``decision`` is ``"approve"``, ``"edit"`` or ``"reject"``; ``args_sha256`` the :func:`args_hash` of the
    call that runs (approve: as shown; edit: with the edited arguments) or of the call shown (reject);
    ``args`` the edited arguments (edit only); ``message`` the reviewer's reason (reject, optional)."""

    decision: str
    args_sha256: str
    args: dict | None = None
    message: str | None = None

    def record(self) -> dict:
        """The JSON stored in ``approval_requests.decision_details`` for this call."""
        out: dict[str, Any] = {"decision": self.decision, "args_sha256": self.args_sha256}
        if self.args is not None:
            out["args"] = self.args
        if self.message is not None:
            out["message"] = self.message
        return out


@dataclass(frozen=True)
class Answer:
    """A resume value read against the calls it answers: ``decisions`` by tool call id, ``errors`` (edits
    that failed validation: ``{tool_call_id: reason}``; when any, nothing is decided) and ``reviewer``."""

    decisions: dict[str, Decision]
    errors: dict[str, str]
    reviewer: str | None = None


def _reason(value: Any) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    return storable_text(value.strip())[:MAX_REASON_CHARS]


def edit_errors(toolset, call: Mapping[str, Any], args: Any) -> str | None:
    """Why ``args`` cannot replace ``call``'s arguments (for the reviewer), or None when they can: they
    must be an object that the tool's strict argument model accepts and that the database can store."""
    if not isinstance(args, Mapping):
        return "the edited arguments must be an object of argument names and values"
    if toolset is None:
        return "edits need the tools node's toolset to validate them; approve or reject this call instead"
    if (where := unstorable_path({"args": dict(args)})) is not None:
        return f"{where.removeprefix('args.')}: {UNSTORABLE_REASON}"
    try:
        toolset.get_tool(call.get("name")).validate(args)
    except ValidationError as exc:
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors())
    except Exception as exc:  # an unknown tool (UnknownTool) or a model that raised
        return str(exc) or type(exc).__name__
    return None


def read_answer(answer: Any, calls: list[dict], *, request: Mapping[str, Any] | None = None,
                toolset=None) -> Answer:
    """Read a resume value as a :class:`Decision` per call of ``calls``.

    ``answer`` is one word for every call, or a mapping by tool call id whose values are a word,
    ``{"decision": "approve", "args_sha256": hash}``, ``{"decision": "edit", "args": {...},
    "args_sha256": hash}`` (:func:`edit_call`) or ``{"decision": "reject", "message": reason}``
    (:func:`reject_call`); either may be wrapped as ``{"decisions": ..., "request_key": key,
    "reviewer": name}`` (both keys optional). Only an approve or a valid edit lets a call run; anything
    else, a call the mapping does not name, an approve or edit whose hash is not the call's current
    :func:`args_hash`, or a ``request_key`` that is not ``request``'s, is a rejection. An edit is checked with
    :func:`edit_errors` against ``toolset`` (the tools node's); a failing one is reported in ``errors``.
    """
    reviewer = None
    if isinstance(answer, Mapping) and "decisions" in answer:
        reviewer = _reason(answer.get("reviewer"))
        if "request_key" in answer and request is not None and answer["request_key"] != request.get("request_key"):
            return Answer({c["id"]: Decision(REJECT, args_hash(c)) for c in calls}, {}, reviewer)
        answer = answer["decisions"]
    errors: dict[str, str] = {}

    def one(value: Any, call: dict) -> Decision:
        shown = args_hash(call)
        if not isinstance(value, Mapping):
            return Decision(APPROVE if value == APPROVE else REJECT, shown)
        word = value.get("decision")
        if word == REJECT or word not in (APPROVE, EDIT):
            return Decision(REJECT, shown, message=_reason(value.get("message")))
        if value.get("args_sha256") != shown:  # bound to another version of the call (case C22)
            return Decision(REJECT, shown)
        if word == APPROVE:
            return Decision(APPROVE, shown)
        if (error := edit_errors(toolset, call, value.get("args"))) is not None:
            errors[call["id"]] = error
            return Decision(REJECT, shown)
        args = json.loads(json.dumps(dict(value["args"]), default=str))
        return Decision(EDIT, args_hash({"name": call.get("name"), "args": args}), args=args)

    values = (lambda c: answer.get(c["id"])) if isinstance(answer, Mapping) else (lambda c: answer)
    return Answer({c["id"]: one(values(c), c) for c in calls}, errors, reviewer)


def decisions_from(answer: Any, calls: list[dict], *, request: Mapping[str, Any] | None = None,
                   toolset=None) -> dict[str, str]:
    """Normalise a resume value to ``{tool_call_id: "approve" | "edit" | "reject"}`` for ``calls`` (see
    :func:`read_answer`; an edit that fails validation counts as ``"reject"`` here)."""
    return {i: d.decision for i, d in read_answer(answer, calls, request=request, toolset=toolset).decisions.items()}


def edit_call(listed: Mapping[str, Any], args: Mapping[str, Any]) -> dict:
    """The decision that edits one call: ``listed`` is the call as the request listed it (its
    ``args_sha256`` binds the edit to what the reviewer saw), ``args`` the new arguments, in full."""
    return {"decision": EDIT, "args": dict(args), "args_sha256": listed["args_sha256"]}


def reject_call(message: str) -> dict:
    """The decision that rejects one call with ``message``, the reviewer's reason (the model reads it in
    the call's ToolMessage, cut to :data:`MAX_REASON_CHARS` characters)."""
    return {"decision": REJECT, "message": message}


def edited_message(message: AIMessage, decisions: Mapping[str, Decision]) -> AIMessage | None:
    """A copy of ``message`` (same id) whose edited calls carry their edited arguments; None when no call
    of it was edited."""
    edits = {i: d.args for i, d in decisions.items() if d.decision == EDIT}
    if not edits:
        return None
    calls = [{**c, "args": edits[c["id"]]} if c.get("id") in edits else c for c in message.tool_calls]
    return message.model_copy(update={"tool_calls": calls})
