"""Tool call arguments of a streamed answer, held to strict JSON.

When a chat model streams (``ChatOpenAI(streaming=True)``, or any model under LangGraph's
``stream_mode="messages"``), LangChain joins the pieces of each tool call's arguments and reads them
with ``parse_partial_json``, which *completes* a cut-off object: ``{"customer_id": 1, "amount_cents": 25``
becomes ``{"customer_id": 1, "amount_cents": 25}``, a valid call for 25 cents, where the same answer
unstreamed lands in ``AIMessage.invalid_tool_calls``. The raw text is gone from the final AIMessage.

:class:`StrictStreamedArguments` is a callback handler the agent node passes to the model call: it
keeps each streamed tool call's raw argument text (by its index) and :meth:`StrictStreamedArguments.correct`
moves a call whose text is not one complete JSON object into ``invalid_tool_calls``, as the unstreamed
path does. A model that does not stream sends no chunks, and nothing changes.

Sources: langchain-core ``AIMessageChunk.init_tool_calls`` (``parse_partial_json``),
``BaseCallbackHandler.on_llm_new_token`` (its ``chunk`` argument).
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.messages import AIMessage, AIMessageChunk

NOT_ONE_OBJECT = "the streamed arguments are not one complete JSON object"


def strict_object(text: str) -> bool:
    """Whether ``text`` is exactly one JSON object (an empty text counts as ``{}``, as LangChain reads it)."""
    if not text.strip():
        return True
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


class StrictStreamedArguments(AsyncCallbackHandler):
    """Records the raw argument text of each streamed tool call of one model call (see the module)."""

    def __init__(self) -> None:
        self.raw: dict[int, dict[str, Any]] = {}

    async def on_llm_new_token(self, token: str, *, chunk=None, **kwargs: Any) -> None:
        message = getattr(chunk, "message", None)
        if not isinstance(message, AIMessageChunk):
            return
        for i, part in enumerate(message.tool_call_chunks):
            index = part.get("index")
            entry = self.raw.setdefault(index if index is not None else i, {"id": None, "args": ""})
            if part.get("id"):
                entry["id"] = part["id"]
            entry["args"] += part.get("args") or ""

    def correct(self, response: Any) -> Any:
        """``response`` with each call whose streamed text is not one JSON object moved to
        ``invalid_tool_calls`` (raw text as its ``args``); ``response`` itself when none is."""
        if not isinstance(response, AIMessage) or not self.raw or not response.tool_calls:
            return response
        bad = [entry for _, entry in sorted(self.raw.items()) if not strict_object(entry["args"])]
        if not bad:
            return response
        keep, moved = [], []
        for call in response.tool_calls:
            entry = next((e for e in bad if e["id"] == call.get("id")), None) if call.get("id") else None
            if entry is None and not call.get("id"):  # no ids to match by: match by the completed text
                entry = next((e for e in bad if _completes(e["args"], call.get("args"))), None)
            if entry is None:
                keep.append(call)
                continue
            bad.remove(entry)
            moved.append({"type": "invalid_tool_call", "name": call.get("name"), "args": entry["args"],
                          "id": call.get("id"), "error": NOT_ONE_OBJECT})
        if not moved:
            return response
        return response.model_copy(update={"tool_calls": keep,
                                           "invalid_tool_calls": [*response.invalid_tool_calls, *moved]})


def _completes(text: str, args: Any) -> bool:
    """Whether ``args`` is what ``parse_partial_json`` makes of the cut-off ``text``."""
    from langchain_core.utils.json import parse_partial_json

    try:
        return parse_partial_json(text) == args
    except ValueError:  # json.JSONDecodeError
        return False
