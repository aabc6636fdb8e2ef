"""The model: a deterministic, seeded chat model that plays a scenario (a real one: :mod:`agentlab.runtime.models`).

:class:`ScriptedChatModel` is a LangChain ``BaseChatModel`` with ``bind_tools``. It emits real
``AIMessage.tool_calls`` from a script (:mod:`agentlab.domains.billing.scenarios`) and reads the ToolMessages it
gets back the way an LLM does:

- a result: that call is done;
- ``NOT APPLIED``: send the call again unchanged (with a new tool call id);
- ``FAILED [invalid_arguments | business_rule | not_found]``: send the corrected arguments when the
  script has a fix (a named bad argument), else give the call up; ``FAILED [conflict]``: the record
  exists, the call is done; ``FAILED [timeout | transient]``: try again; ``FAILED [rejected]``: drop it;
- a raw error (no FAILED / NOT APPLIED text, as the naive path returns) with no "not applied" signal
  anywhere in the batch: send the *whole batch* again, with the fix for the call that errored, as an
  LLM does when it cannot tell what was applied. That is the double credit memo of the naive path.

Its state is derived from the message history alone (plan positions ride in the AIMessage's
``response_metadata``), so a thread resumed in a new process continues where it stopped.
Tool call ids are seeded: ``call_`` + sha256(seed, history length, invocation number), fresh on
every invocation as a real model's are, repeatable for the same seed and run.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import ConfigDict, PrivateAttr

from agentlab.core.messages import FAILED_PREFIX, NOT_APPLIED_PREFIX
from agentlab.domains.billing.scenarios import PlannedCall

PLAN_KEY = "agentlab_plan"
MAX_SENDS_PER_CALL = 6  # a planned call sent more often than this is given up


def _calls_chars(message: BaseMessage) -> int:
    """Characters of ``message``'s tool calls as JSON (``[]``, 2, for a message without any)."""
    calls = getattr(message, "tool_calls", None)
    return len(json.dumps(calls)) if calls else 2


def classify(message: ToolMessage | None) -> tuple[str, str | None]:
    """How the model reads a ToolMessage: (``"ok" | "not_applied" | "failed" | "raw_error" | "missing"``, category)."""
    if message is None:
        return "missing", None
    text = str(message.content)
    if text.startswith(NOT_APPLIED_PREFIX):
        return "not_applied", None
    if text.startswith(FAILED_PREFIX):
        category = text[text.find("[") + 1:text.find("]")] if "[" in text.split(":")[0] else None
        return "failed", category
    if getattr(message, "status", "success") == "error":
        return "raw_error", None
    return "ok", None


class ScriptedChatModel(BaseChatModel):
    """A deterministic chat model that plays ``script`` (a list of batches of :class:`PlannedCall`).

    Args:
        script: the batches, customer ids already resolved.
        seed: seeds the tool call ids.
        final_text: the closing answer once every step is done.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    script: list[list[PlannedCall]]
    seed: int = 0
    final_text: str = "All steps are done."
    _invocations: int = PrivateAttr(default=0)
    _bound_tools: tuple[str, ...] = PrivateAttr(default=())

    @property
    def _llm_type(self) -> str:
        return "agentlab-scripted"

    def bind_tools(self, tools, *, tool_choice=None, **kwargs):
        """Bind tool schemas as a real model does (the schemas ride along; the script decides the calls)."""
        from langchain_core.utils.function_calling import convert_to_openai_tool

        schemas = [convert_to_openai_tool(t) for t in tools]
        self._bound_tools = tuple(s["function"]["name"] for s in schemas)
        return self.bind(tools=schemas, **kwargs)

    # ------------------------------------------------------------------ planning

    def plan(self, messages: list[BaseMessage]) -> tuple[list[tuple[int, int, dict]], int]:
        """The calls to send next, as ``(step, call index, args)``, and the step they belong to.

        An empty list means the script is finished.
        """
        replies = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
        step = 0
        outstanding = self._fresh(step)
        sends: dict[tuple[int, int], int] = {}
        for m in messages:
            if not isinstance(m, AIMessage) or not m.tool_calls:
                continue
            plan = m.response_metadata.get(PLAN_KEY)
            if not plan:
                continue
            batch = []
            for tc, pos in zip(m.tool_calls, plan):
                key = (pos[0], pos[1])
                sends[key] = sends.get(key, 0) + 1
                batch.append((key, tc["args"], *classify(replies.get(tc["id"]))))
            if not batch or batch[0][0][0] != step:
                continue  # a batch of an earlier step (already accounted for)
            saw_not_applied = any(kind == "not_applied" for _, _, kind, _ in batch)
            saw_raw = any(kind == "raw_error" for _, _, kind, _ in batch)
            nxt: dict[int, dict] = {k: v for k, v in outstanding.items() if k not in {b[0][1] for b in batch}}
            moved_last: list[int] = []
            for (s, k), args, kind, category in batch:
                resend, last = react(self.script[s][k], args, kind, category)
                if resend is not None:
                    nxt[k] = resend
                if last:
                    moved_last.append(k)
            if saw_raw and not saw_not_applied:
                # cannot tell what was applied: send the whole batch again, fixed where it errored
                for (_, k), args, _, _ in batch:
                    if k not in nxt:
                        nxt[k] = args
            outstanding = {k: v for k, v in sorted(nxt.items()) if sends.get((step, k), 0) < MAX_SENDS_PER_CALL}
            if moved_last:
                outstanding = {**{k: v for k, v in outstanding.items() if k not in moved_last},
                               **{k: outstanding[k] for k in moved_last if k in outstanding}}
            while not outstanding and step < len(self.script):
                step += 1
                outstanding = self._fresh(step)
        return [(step, k, v) for k, v in outstanding.items()], step

    def _fresh(self, step: int) -> dict[int, dict]:
        if step >= len(self.script):
            return {}
        return {k: call.args for k, call in enumerate(self.script[step])}

    def _call_id(self, history_len: int, index: int) -> str:
        digest = hashlib.sha256(f"{self.seed}:{history_len}:{self._invocations}:{index}".encode()).hexdigest()
        return f"call_{digest[:20]}"

    # ------------------------------------------------------------------ BaseChatModel

    def _generate(self, messages: list[BaseMessage], stop=None, run_manager=None, **kwargs: Any) -> ChatResult:
        self._invocations += 1
        sends, _ = self.plan(messages)
        prompt_chars = sum(len(str(m.content)) + _calls_chars(m) for m in messages)
        if not sends:
            message = AIMessage(content=self.final_text)
        else:
            tool_calls = [
                {"name": self.script[s][k].tool, "args": args, "id": self._call_id(len(messages), i), "type": "tool_call"}
                for i, (s, k, args) in enumerate(sends)
            ]
            message = AIMessage(content="", tool_calls=tool_calls,
                                response_metadata={PLAN_KEY: [[s, k] for s, k, _ in sends]})
        out_chars = len(str(message.content)) + len(json.dumps(message.tool_calls, default=str))
        message.usage_metadata = {"input_tokens": prompt_chars // 4, "output_tokens": max(1, out_chars // 4),
                                  "total_tokens": prompt_chars // 4 + max(1, out_chars // 4)}
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs: Any) -> ChatResult:
        return self._generate(messages, stop=stop, **kwargs)


def react(planned, args: dict, kind: str, category: str | None) -> tuple[dict | None, bool]:
    """How the model reacts to one answered call: the arguments to send it again with (None: not again)
    and whether it goes last in the next batch (a reordered call whose record did not exist yet)."""
    if kind == "ok":
        return None, False
    if kind in ("not_applied", "missing"):
        return args, False
    if kind == "raw_error":
        return (planned.fix if planned.fix is not None else args), False
    if category in ("invalid_arguments", "business_rule", "not_found"):
        if planned.reorder and category == "not_found":
            return args, True
        if planned.fix is not None and args != planned.fix:
            return planned.fix, False
        return None, False
    if category in ("timeout", "transient"):
        return args, False
    return None, False  # conflict (already exists), rejected, internal: the call is given up or done
