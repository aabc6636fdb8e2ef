"""Histories a provider accepts: what the agent node sends the model keeps the rules OpenAI and Anthropic
enforce on tool calls (every call answered exactly once, right after its AIMessage, no answer to a call
that does not exist, ids unique in a message).

The histories are the ones real graph runs send (scripted episodes under several presets, episodes of the
failure lab that crash and resume, the C15 / C16 / C17 shapes, a state a user edited), recorded at the
model; each is converted with the provider packages' own converters (``langchain_openai``'s
``_convert_message_to_dict``; ``langchain_anthropic``'s ``_format_messages`` when installed) and checked
against the rules as written from the APIs' behaviour (``openai_compatible_server.openai_history_errors``
and :func:`anthropic_errors` below), independent of :mod:`agentlab.core.provider_rules`."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from openai_compatible_server import openai_history_errors

from agentlab.core.graph import build_graph, run_config
from agentlab.core.provider_rules import (
    ProviderHistoryError,
    check_history,
    history_violations,
    provider_view,
)
from agentlab.core.safeguards import preset
from agentlab.lab.runner import Lab
from agentlab.sim.model import ScriptedChatModel
from conftest import TurnModel, scalar

convert_openai = pytest.importorskip("langchain_openai.chat_models.base")._convert_message_to_dict


def openai_dicts(messages) -> list[dict]:
    return [convert_openai(m) for m in messages]


def anthropic_errors(messages) -> list[str] | None:
    """Anthropic's rules on the request ``_format_messages`` builds, or None without langchain-anthropic:
    tool_use ids unique in a message; the next message a user message with one tool_result per tool_use
    of the assistant message before it, those first in its content, and none for an id it does not hold."""
    try:
        from langchain_anthropic.chat_models import _format_messages
    except ImportError:
        return None
    _, formatted = _format_messages(messages, model="claude-test")
    errors = []
    for i, m in enumerate(formatted):
        blocks = m["content"] if isinstance(m["content"], list) else []
        if m["role"] == "assistant":
            uses = [b["id"] for b in blocks if b.get("type") == "tool_use"]
            if len(uses) != len(set(uses)):
                errors.append(f"messages.{i}: tool_use ids must be unique")
            if not uses:
                continue
            nxt = formatted[i + 1] if i + 1 < len(formatted) else None
            results = [b["tool_use_id"] for b in (nxt["content"] if nxt and isinstance(nxt["content"], list) else [])
                       if b.get("type") == "tool_result"]
            if nxt is None or nxt["role"] != "user" or sorted(results) != sorted(uses):
                errors.append(f"messages.{i}: tool_use ids were found without tool_result blocks immediately after")
            kinds = [b.get("type") for b in (nxt["content"] if nxt and isinstance(nxt["content"], list) else [])]
            if "tool_result" in kinds and kinds[:len(results)] != ["tool_result"] * len(results):
                errors.append(f"messages.{i + 1}: tool_result blocks must come first in the content")
        elif m["role"] == "user":
            prev = formatted[i - 1] if i else None
            owned = {b["id"] for b in (prev["content"] if prev and isinstance(prev["content"], list) else [])
                     if b.get("type") == "tool_use"}
            for b in blocks:
                if b.get("type") == "tool_result" and b["tool_use_id"] not in owned:
                    errors.append(f"messages.{i}: unexpected tool_use_id {b['tool_use_id']!r} in tool_result blocks")
    return errors


def assert_provider_accepts(history) -> None:
    assert history_violations(history) == []
    assert openai_history_errors(openai_dicts(history)) == []
    assert anthropic_errors(history) in ([], None)


class RecordingScriptedModel(ScriptedChatModel):
    """The scripted model, keeping every history it is sent."""

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        seen.append(list(messages))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


seen: list[list] = []


def call(name: str, args: dict, call_id: str | None) -> dict:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


LOOKUP = {"customer_id": 1}


# ----------------------------------------------------------------- the rules and the repair, on hand-built histories

def test_each_broken_shape_is_named_and_the_view_sent_is_accepted_without_touching_the_state():
    ai = AIMessage("", id="ai-1", tool_calls=[call("LookupCustomer", LOOKUP, "c1")])
    shapes = {
        "answers_no_call": [HumanMessage("q"), ai, ToolMessage("r", tool_call_id="c1"),
                            ToolMessage("ghost", tool_call_id="ghost")],
        "answered_twice": [HumanMessage("q"), ai, ToolMessage("r", tool_call_id="c1"),
                           ToolMessage("again", tool_call_id="c1")],
        "not_adjacent": [HumanMessage("q"), ai, HumanMessage("meanwhile"), ToolMessage("r", tool_call_id="c1")],
        "duplicate_id": [HumanMessage("q"), AIMessage("", id="ai-2", tool_calls=[
            call("LookupCustomer", LOOKUP, "c1"), call("ApplyCredit", {"customer_id": 1, "amount_cents": 5}, "c1")]),
            ToolMessage("FAILED [invalid_arguments]: repeated id", tool_call_id="c1", status="error")],
    }
    for rule, history in shapes.items():
        before = [m.model_copy() for m in history]
        found = history_violations(history)
        assert [v.rule for v in found] == [rule], rule
        assert found[0].call_id in ("c1", "ghost")
        assert openai_history_errors(openai_dicts(history)) != [] or rule == "duplicate_id"  # OpenAI refuses
        assert anthropic_errors(history) in (None,) or anthropic_errors(history) != []  # so does Anthropic
        sent = provider_view(history)
        assert_provider_accepts(sent)
        check_history(sent)
        assert history == before  # the state keeps every message; only what is sent differs
    # the view keeps the text of every message that was not an answer out of place
    view = provider_view(shapes["not_adjacent"])
    assert [type(m).__name__ for m in view] == ["HumanMessage", "AIMessage", "ToolMessage", "HumanMessage"]


def test_a_history_the_view_cannot_fix_raises_naming_the_call():
    history = [HumanMessage("q"), AIMessage("", tool_calls=[call("ApplyCredit", {"customer_id": 1}, "c9")])]
    with pytest.raises(ProviderHistoryError, match=r"'unanswered'.*'c9'"):
        check_history(provider_view(history))


# ----------------------------------------------------------------- histories of real graph runs

@pytest.mark.parametrize(("scenario", "preset_name"), [
    ("refund", "full"), ("refund", "naive"), ("invoice", "full"), ("batch", "savepoints"), ("reorder", "full"),
])
async def test_scripted_episodes_send_histories_both_providers_accept(harness, scenario, preset_name):
    seen.clear()
    sc = harness.scenario(scenario)
    ids = await harness.create_customers(sc, preset(preset_name))
    model = RecordingScriptedModel(script=sc.script(ids), seed=3)
    graph = harness.graph(preset(preset_name), model)
    await graph.ainvoke({"messages": [HumanMessage(sc.prompt)]}, run_config(f"t-{scenario}", tenant_id=sc.tenant_id))
    assert len(seen) >= 2
    for history in seen:
        assert_provider_accepts(history)


@pytest.mark.parametrize("fault", ["crash_mid_node", "crash_before_checkpoint", "backend_killed", "worker_crash"])
async def test_failure_lab_episodes_that_crash_and_resume_send_accepted_histories(harness, fault):
    seen.clear()
    async with Lab(harness) as lab:
        run = await lab.run(fault, "full", seed=1,
                            model=lambda script, seed: RecordingScriptedModel(script=script, seed=seed))
    assert run.violations == [] and run.episode.error is None
    assert seen
    for history in seen:
        assert_provider_accepts(history)


async def test_quirk_shapes_c15_c16_c17_send_accepted_histories(harness):
    sent: list[list] = []

    def record(reply):
        def turn(messages):
            sent.append(list(messages))
            return reply.model_copy(deep=True)
        return turn

    turns = [
        AIMessage("", tool_calls=[call("LookupCustomer", LOOKUP, None),  # C15: no id
                                  call("ApplyCredit", {"customer_id": 1, "amount_cents": 100}, "functions.ApplyCredit:0")],
                  invalid_tool_calls=[{"name": "ApplyCredit", "args": '{"customer_id": 1, "amount_cents": 25',  # C16
                                       "id": None, "error": "not JSON", "type": "invalid_tool_call"}]),
        AIMessage("", tool_calls=[call("ApplyCredit", {"customer_id": 1, "amount_cents": 100}, "functions.ApplyCredit:0"),
                                  call("ApplyCredit", {"customer_id": 1, "amount_cents": 100}, "functions.ApplyCredit:0")]),
        AIMessage("", tool_calls=[call("ApplyCredit", {"customer_id": 1, "amount_cents": 100}, "functions.ApplyCredit:0")]),
        AIMessage("done."),
    ]
    graph = build_graph(TurnModel([record(t) for t in turns]), harness.node(preset("full")), checkpointer=harness.saver)
    config = run_config("t-quirks", tenant_id="acme")
    await graph.ainvoke({"messages": [HumanMessage("credit 1.00, twice")]}, config)

    assert len(sent) == 4
    for history in sent:
        assert_provider_accepts(history)
    # turn 1 rolled back (atomic, one call not JSON), turn 2 refused (one id twice), turn 3 applied
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = 1") == 5000 - 100


async def test_a_state_edited_with_an_answer_to_no_call_is_kept_and_left_out_of_what_is_sent(harness):
    sent: list[list] = []

    def answer(messages):
        sent.append(list(messages))
        return AIMessage("noted.")

    graph = build_graph(TurnModel([answer] * 4), harness.node(preset("full")), checkpointer=harness.saver)
    config = run_config("t-edited", tenant_id="acme")
    await graph.ainvoke({"messages": [HumanMessage("hello")]}, config)
    await graph.aupdate_state(config, {"messages": [ToolMessage("late result", tool_call_id="call_ghost")]})
    state = await graph.ainvoke({"messages": [HumanMessage("and now?")]}, config)

    assert [v.rule for v in history_violations(state["messages"])] == ["answers_no_call"]  # kept in the state
    assert any(isinstance(m, ToolMessage) and m.tool_call_id == "call_ghost" for m in state["messages"])
    assert_provider_accepts(sent[-1])
    assert [type(m).__name__ for m in sent[-1]] == ["HumanMessage", "AIMessage", "HumanMessage"]
