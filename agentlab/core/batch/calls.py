"""A batch's tool calls, resolved and validated before any SQL is sent.

:func:`prepare` turns ``AIMessage.tool_calls`` (and ``invalid_tool_calls``) into :class:`Call` values and
refuses, by name, what no transaction can fix: a missing, repeated, unstorable or over-long call id,
arguments that were not valid JSON, an unknown tool, and (with validation on) arguments the tool's strict
model refuses. One ToolMessage per id: the first occurrence of a repeated id answers for all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentlab.core.batch.results import CallResult, Outcome, failed
from agentlab.core.errors import Category, ErrorHints, translate
from agentlab.core.messages import (
    CALL_ID_TOO_LONG,
    DUPLICATE_CALL_ID,
    FAILED_TEMPLATE,
    INVALID_CALL_ID,
    INVALID_JSON_ARGUMENTS,
    MISSING_CALL_ID,
)
from agentlab.core.safeguards import Safeguards
from agentlab.core.storable import storable
from agentlab.core.toolspec import Toolset, ToolSpec

MAX_CALL_ID_CHARS = 256  # provider ids are 20-40 characters; a longer one cannot be a real id (case C19)


@dataclass
class Call:
    """One tool call of a batch: its position, id, tool and arguments (validated when ``spec`` is set).
    ``occurrence`` counts earlier AIMessages of the thread holding the same id (the ledger key's last part)."""

    index: int
    call_id: str
    name: str
    raw_args: Any
    occurrence: int = 0
    spec: ToolSpec | None = None
    args: Mapping[str, Any] | None = None


class RefusedCallId(Exception):
    """Raised (and caught in :func:`prepare`) for a call whose id or JSON the batch cannot accept."""


def _check_id(call_id: str, ids: list[str], invalid_json: bool) -> None:
    if not call_id:  # None or "": refused by name (the graph gives such calls a stable id first)
        raise RefusedCallId(MISSING_CALL_ID)
    if ids.count(call_id) > 1:
        raise RefusedCallId(DUPLICATE_CALL_ID)
    if not storable(call_id):  # the ledger key holds the id: a NUL or lone surrogate cannot be stored
        raise RefusedCallId(INVALID_CALL_ID)
    if len(call_id) > MAX_CALL_ID_CHARS:  # the ledger's key index cannot hold it (SQLSTATE 54000)
        raise RefusedCallId(CALL_ID_TOO_LONG)
    if invalid_json:  # AIMessage.invalid_tool_calls: the arguments were not valid JSON
        raise RefusedCallId(INVALID_JSON_ARGUMENTS)


def prepare(tool_calls: Sequence[Mapping[str, Any]], invalid_tool_calls: Sequence[Mapping[str, Any]], *,
            toolset: Toolset, safeguards: Safeguards, occurrence: Mapping[str, int] | None = None,
            error_hints: ErrorHints | None = None) -> tuple[list[Call], dict[int, CallResult]]:
    """Resolve every call's tool and arguments; no SQL.

    Returns ``(calls, refused)``: one :class:`Call` per distinct id in call order, and the FAILED answer of
    each refused call by its index. With ``safeguards.validation`` off the raw arguments pass as they are
    (a mapping, else ``{}``): the ladder's weaker rungs."""
    calls: list[Call] = []
    refused: dict[int, CallResult] = {}
    every = [*tool_calls, *invalid_tool_calls]
    ids = [str(c.get("id") or "") for c in every]
    seen: set[str] = set()
    for i, c in enumerate(every):
        call_id = ids[i]
        if call_id in seen:
            continue
        seen.add(call_id)
        call = Call(len(calls), call_id, str(c.get("name")), c.get("args"), (occurrence or {}).get(call_id, 0))
        calls.append(call)
        try:
            _check_id(call_id, ids, invalid_json=i >= len(tool_calls))
            call.spec = toolset.get_tool(c.get("name"))
            if safeguards.validation:
                call.args = call.spec.validate(call.raw_args)
            else:
                call.args = call.raw_args if isinstance(call.raw_args, Mapping) else {}
        except RefusedCallId as exc:
            refused[call.index] = CallResult(
                call.index, call_id, call.name, Outcome.FAILED,
                FAILED_TEMPLATE.format(category=Category.INVALID_ARGUMENTS.value, reason=exc.args[0]),
                Category.INVALID_ARGUMENTS.value,
            )
        except Exception as exc:
            allowed = call.spec.arg_names if call.spec else ()
            refused[call.index] = failed(call.index, call_id, call.name, translate(
                exc, allowed_args=allowed, sanitize=safeguards.sanitize, hints=error_hints))
    return calls, refused
