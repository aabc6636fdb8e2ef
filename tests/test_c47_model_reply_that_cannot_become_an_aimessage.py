"""Case C47: a model reply that cannot become an AIMessage.

An OpenAI-compatible server on 127.0.0.1 (``openai_compatible_server.py``) answers through the real
``langchain_openai.ChatOpenAI`` with replies the client cannot turn into an AIMessage: tool call
arguments that are the JSON array ``"[9, 100]"``, ``"choices": []``, and the rest of the kind (other
argument kinds, a function name or id that is not a string, a missing ``function``, ``"message": null``,
content that is not text, a body that is not JSON, an error body with HTTP 200, a user's message).
Before C47 the client's ``ValidationError`` / ``IndexError`` escaped the agent node and every resume
repeated it.

Asserted, graph under ``full``: no exception escapes; the model is asked once more with a note that says
what was wrong and what to send instead; when that reply cannot be read either, the turn ends with one
``MODEL ERROR`` AIMessage naming the reply's shape (and the episode's error says it); nothing of the
reply is applied (the ledger and the customer's credit); no tool call waits for an answer, every request
keeps OpenAI's history rules, a resume does nothing, and the next user message runs as usual. A retry
that reads goes on as if nothing happened. Calls the client does read (no function name, ``"null"``
arguments; a streamed array, which the streaming parser keeps as an invalid call) are answered FAILED
by the tools node."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from openai_compatible_server import RecordedServer, openai_history_errors

from agentlab.core.graph import run_config
from agentlab.core.messages import FAILED_PREFIX, unanswered_tool_calls
from agentlab.core.model_replies import (
    CLIENT_PARTS,
    MODEL_ERROR_TEMPLATE,
    REPLY_ATTEMPTS,
    RETRY_NOTE,
    SEND_AGAIN,
    SEND_ARGUMENTS_OBJECT,
    unreadable,
)
from agentlab.core.provider_rules import history_violations
from agentlab.core.safeguards import preset
from agentlab.runtime.models import load_model
from conftest import fetch, scalar

CREDIT = "SELECT credit_cents FROM customers WHERE id = 1"  # the seed's customer 1 opens with 5000
LEDGER = "SELECT tool_call_id, tool_name FROM tool_executions WHERE thread_id = %s ORDER BY created_at"
UNSET = object()


# ----------------------------------------------------------------- reply bodies

def call(name, arguments, call_id="call_bad") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant(*calls, content=None) -> dict:
    return {"role": "assistant", "content": content, **({"tool_calls": list(calls)} if calls else {})}


def completion(message=UNSET, *, choices=UNSET, finish="tool_calls") -> dict:
    """A ``chat.completion`` body; ``choices`` replaces the one choice holding ``message``."""
    if choices is UNSET:
        choices = [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}]
    return {"id": "chatcmpl-c47", "object": "chat.completion", "created": 1764590000, "model": "m",
            "choices": choices, "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


def raw(text: str, content_type: str = "application/json") -> dict:
    return {"raw": text, "content_type": content_type}


def recording(model: str, *responses) -> dict:
    return {"model": model, "responses": list(responses)}


ARRAY = completion(assistant(call("ApplyCredit", "[9, 100]")))
EMPTY_CHOICES = completion(choices=[])
APPLY = completion(assistant(call("ApplyCredit", '{"customer_id": 1, "amount_cents": 2500}', "call_ok")))
DONE = completion(assistant(content="Done: 25.00 of credit applied."), finish="stop")
FIRST, NEXT = "Apply 25.00 of store credit to customer 1.", "Please try again."


# ----------------------------------------------------------------- running a thread

async def first_run(harness, server: RecordedServer, model_name: str, thread: str, *, stream: bool = False):
    model = load_model(f"openai:{model_name}", base_url=server.base_url, max_retries=0, streaming=stream)
    graph = harness.graph(preset("full"), model)
    config = run_config(thread, tenant_id="acme")
    state = await graph.ainvoke({"messages": [HumanMessage(FIRST)]}, config)  # raises nothing
    return graph, config, state


def model_error(shape: str) -> str:
    return MODEL_ERROR_TEMPLATE.format(attempts=REPLY_ATTEMPTS, shape=shape)


async def assert_nothing_applied_and_not_wedged(harness, server, graph, config, state, thread) -> None:
    """The run ended on its MODEL ERROR: nothing of the reply was applied, no call waits, a resume does nothing."""
    messages = state["messages"]
    assert [type(m) for m in messages] == [HumanMessage, AIMessage]  # the unreadable reply is not stored
    assert messages[-1].content.startswith("MODEL ERROR: ") and not messages[-1].tool_calls
    assert state["model_error"] == messages[-1].content
    assert await scalar(harness, CREDIT) == 5000
    assert await fetch(harness, LEDGER, (thread,)) == []
    assert unanswered_tool_calls(messages) == [] and history_violations(messages) == []
    snapshot = await graph.aget_state(config)
    assert snapshot.next == ()  # the run is over: nothing is left for a resume to repeat
    asked = len(server.requests)
    resumed = await graph.ainvoke(None, config)
    assert len(server.requests) == asked and resumed["messages"] == messages


async def assert_the_thread_goes_on(harness, server, graph, config, thread) -> list:
    state = await graph.ainvoke({"messages": [HumanMessage(NEXT)]}, config)
    messages = state["messages"]
    assert state["model_error"] is None
    assert messages[-1].content == "Done: 25.00 of credit applied."
    assert [m.artifact["outcome"] for m in messages if isinstance(m, ToolMessage)] == ["applied"]
    assert await scalar(harness, CREDIT) == 2500
    assert await fetch(harness, LEDGER, (thread,)) == [("call_ok", "ApplyCredit")]
    assert unanswered_tool_calls(messages) == [] and history_violations(messages) == []
    assert server.rejected == [] and all(openai_history_errors(r["messages"]) == [] for r in server.requests)
    return messages


def last_user_text(request: dict) -> str:
    return request["messages"][-1]["content"] if request["messages"][-1]["role"] == "user" else ""


# ----------------------------------------------------------------- the named inputs

async def test_c47_arguments_that_are_a_json_array_end_the_turn_with_one_model_error_and_the_thread_goes_on(harness):
    shape = "tool call 1's arguments are an array ([9, 100]), not a JSON object"
    with RecordedServer(recording("c47-array", ARRAY, APPLY, DONE)) as server:
        graph, config, state = await first_run(harness, server, "c47-array", "t-c47-array")
        assert state["messages"][-1].content == model_error(shape)
        # asked twice: the retry was told what was wrong and what to send instead, and was not stored
        assert len(server.requests) == REPLY_ATTEMPTS == 2
        assert last_user_text(server.requests[0]) == FIRST
        assert last_user_text(server.requests[1]) == RETRY_NOTE.format(shape=shape, instead=SEND_ARGUMENTS_OBJECT)
        await assert_nothing_applied_and_not_wedged(harness, server, graph, config, state, "t-c47-array")
        messages = await assert_the_thread_goes_on(harness, server, graph, config, "t-c47-array")
    assert [type(m).__name__ for m in messages] == ["HumanMessage", "AIMessage", "HumanMessage", "AIMessage",
                                                    "ToolMessage", "AIMessage"]
    sent = server.requests[2]["messages"]  # the next turn: the MODEL ERROR went as the assistant's, nothing more
    assert [m["role"] for m in sent] == ["user", "assistant", "user"] and sent[1]["content"] == model_error(shape)
    await harness.events.flush()
    assert await fetch(harness, "SELECT attempt, detail FROM events WHERE outcome = 'reply_unreadable' ORDER BY id") == [
        (1, f"ValidationError: {shape}"), (2, f"ValidationError: {shape}")]


async def test_c47_a_reply_with_empty_choices_ends_the_turn_with_one_model_error_and_the_thread_goes_on(harness):
    shape = 'the reply holds no message (its "choices" list is empty)'
    with RecordedServer(recording("c47-empty", EMPTY_CHOICES, APPLY, DONE)) as server:
        graph, config, state = await first_run(harness, server, "c47-empty", "t-c47-empty")
        assert state["messages"][-1].content == model_error(shape)
        assert last_user_text(server.requests[1]) == RETRY_NOTE.format(shape=shape, instead=SEND_AGAIN)
        await assert_nothing_applied_and_not_wedged(harness, server, graph, config, state, "t-c47-empty")
        await assert_the_thread_goes_on(harness, server, graph, config, "t-c47-empty")


async def test_c47_an_episode_reports_the_model_error_as_its_error(harness):
    with RecordedServer(recording("c47-episode", ARRAY)) as server:
        model = load_model("openai:c47-episode", base_url=server.base_url, max_retries=0)
        ep = await harness.run_episode("refund", "full", model=model)
    assert ep.error == model_error("tool call 1's arguments are an array ([9, 100]), not a JSON object")
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 0


async def test_c47_the_failure_lab_reports_the_model_error_and_only_the_work_not_done(harness):
    from agentlab.lab.runner import Lab

    with RecordedServer(recording("c47-lab", EMPTY_CHOICES)) as server:
        model = load_model("openai:c47-lab", base_url=server.base_url, max_retries=0)
        async with Lab(harness) as lab:
            run = await lab.run("none", "full", scenario="refund", seed=2, model=lambda script, seed: model)
    assert run.episode.error == model_error('the reply holds no message (its "choices" list is empty)')
    # the model never acted: the lab finds the scenario's work not done, nothing half done or unanswered
    assert sorted(v.detail.split(": ", 1)[1] for v in run.violations) == [
        "0 credit_memos, intended 1", "0 provider_refunds, intended 1", "0 refunds, intended 1",
        "balance 5000 cents, intended 2500"]
    assert server.rejected == [] and await scalar(harness, "SELECT count(*) FROM tool_executions") == 0


# ----------------------------------------------------------------- the rest of the kind

# a reply the client cannot read -> the shape its MODEL ERROR names
SHAPES = {
    "arguments_a_string": (completion(assistant(call("ApplyCredit", '"apply 25.00"'))),
                           "tool call 1's arguments are a string (\"apply 25.00\"), not a JSON object"),
    "arguments_a_number": (completion(assistant(call("ApplyCredit", "2500"))),
                           "tool call 1's arguments are a number (2500), not a JSON object"),
    "arguments_true": (completion(assistant(call("ApplyCredit", "true"))),
                       "tool call 1's arguments are a boolean (true), not a JSON object"),
    "second_call_an_array_beside_a_valid_one": (
        completion(assistant(call("LookupCustomer", '{"customer_id": 1}', "call_look"),
                             call("ApplyCredit", "[1, 2500]"))),
        "tool call 2's arguments are an array ([1, 2500]), not a JSON object"),
    "arguments_an_object_not_a_text": (completion(assistant(call("ApplyCredit", {"customer_id": 1}))),
                                       'tool call 1\'s arguments are an object ({"customer_id": 1}), not a string holding JSON'),
    "function_name_a_number": (completion(assistant(call(5, '{"customer_id": 1}'))),
                               "tool call 1's function name is a number (5), not a string"),
    "call_id_a_number": (completion(assistant(call("ApplyCredit", '{"customer_id": 1}', 7))),
                         "tool call 1's id is a number (7), not a string"),
    "call_without_function": (completion(assistant({"id": "call_bad", "type": "function"})),
                              'a tool call\'s "function" is null, not an object'),
    "tool_calls_an_object": (completion({"role": "assistant", "content": None, "tool_calls": {"id": "call_bad"}}),
                             'the message\'s "tool_calls" is not a list of calls'),
    "content_a_number": (completion(assistant(content=42), finish="stop"),
                         "the message content is a number (42), not text"),
    "content_an_object": (completion(assistant(content={"text": "hi"}), finish="stop"),
                          'the message content is an object ({"text": "hi"}), not text'),
    "message_null": (completion(None), 'a choice\'s "message" is null, not an object'),
    "message_missing": (completion(choices=[{"index": 0, "finish_reason": "stop"}]),
                        'a choice\'s "message" is null, not an object'),
    "message_a_string": (completion("Done."), 'a choice\'s "message" is a string, not an object'),
    "choice_a_string": (completion(choices=["Done."]), 'an entry of "choices" is a string, not an object'),
    "choices_null": (completion(choices=None), 'the reply has no "choices" (null or missing)'),
    "choices_missing": ({"id": "chatcmpl-c47", "object": "chat.completion", "model": "m"},
                        'the reply has no "choices" (null or missing)'),
    "role_user": (completion({"role": "user", "content": "Done."}, finish="stop"),
                  "the reply's message has the role 'user', not 'assistant'"),
    "role_missing": (completion({"content": "Done."}, finish="stop"), "the message's role is null, not 'assistant'"),
    "error_with_http_200": ({"error": {"message": "model overloaded", "type": "server_error"}},
                            'the reply is an error, not a message: "model overloaded"'),
    "body_not_json": (raw("<html><body>502 Bad Gateway</body></html>"),
                      'the reply is not JSON (application/json: "<html><body>502 Bad Gateway</body></html>")'),
    "body_html": (raw("<html><body>502 Bad Gateway</body></html>", "text/html"),
                  "the reply is not JSON ('<html><body>502 Bad Gateway</body></html>')"),
    "body_a_json_array": (raw("[1, 2]"), "the reply is an array, not a JSON object ([1, 2])"),
}


@pytest.mark.parametrize("kind", list(SHAPES))
async def test_c47_every_unreadable_shape_ends_the_turn_with_one_model_error_naming_it(harness, kind):
    reply, shape = SHAPES[kind]
    model_name, thread = f"c47-{kind}", f"t-c47-{kind}"
    with RecordedServer(recording(model_name, reply, APPLY, DONE)) as server:
        graph, config, state = await first_run(harness, server, model_name, thread)
        assert state["messages"][-1].content == model_error(shape)
        assert len(server.requests) == REPLY_ATTEMPTS
        await assert_nothing_applied_and_not_wedged(harness, server, graph, config, state, thread)
        await assert_the_thread_goes_on(harness, server, graph, config, thread)


async def test_c47_a_retry_that_reads_goes_on_as_if_nothing_happened(harness):
    with RecordedServer(recording("c47-retry", {"attempts": [ARRAY, APPLY]}, DONE)) as server:
        _, _, state = await first_run(harness, server, "c47-retry", "t-c47-retry")
    messages = state["messages"]
    assert state.get("model_error") is None and messages[-1].content == "Done: 25.00 of credit applied."
    assert [c["id"] for c in messages[1].tool_calls] == ["call_ok"]  # the unreadable reply left no trace
    assert await scalar(harness, CREDIT) == 2500
    assert await fetch(harness, LEDGER, ("t-c47-retry",)) == [("call_ok", "ApplyCredit")]
    assert "[9, 100]" in last_user_text(server.requests[1]) and len(server.requests) == 3
    assert all(last_user_text(r) != last_user_text(server.requests[1]) for r in server.requests[2:])  # not stored
    assert unanswered_tool_calls(messages) == [] and history_violations(messages) == []


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")  # the openai client's, on the chunk
@pytest.mark.parametrize(("kind", "reply", "shape"), [
    pytest.param("name", completion(assistant(call(5, '{"customer_id": 1}'))),
                 "tool call 1's function name is a number (5), not a string", id="function_name_a_number"),
    pytest.param("content", completion(assistant(content=42), finish="stop"),
                 "the message content is a number (42), not text", id="content_a_number"),
])
async def test_c47_a_streamed_reply_the_client_cannot_read_ends_the_turn_the_same_way(harness, kind, reply, shape):
    model_name, thread = f"c47-streamed-{kind}", f"t-c47-streamed-{kind}"
    with RecordedServer(recording(model_name, reply, APPLY, DONE)) as server:
        graph, config, state = await first_run(harness, server, model_name, thread, stream=True)
        assert server.streamed == REPLY_ATTEMPTS
        assert state["messages"][-1].content == model_error(shape)
        await assert_nothing_applied_and_not_wedged(harness, server, graph, config, state, thread)
        await assert_the_thread_goes_on(harness, server, graph, config, thread)


# ----------------------------------------------------------------- calls the client reads, the tools refuse

@pytest.mark.parametrize(("kind", "reply", "stream"), [
    pytest.param("array_streamed", ARRAY, True, id="array_streamed"),  # the streaming parser keeps it as invalid
    pytest.param("no_function_name", completion(assistant({
        "id": "call_bad", "type": "function", "function": {"arguments": '{"customer_id": 1, "amount_cents": 900}'}})),
        False, id="no_function_name"),
    pytest.param("arguments_null", completion(assistant(call("ApplyCredit", "null"))), False, id="arguments_null"),
])
async def test_c47_a_malformed_call_the_client_reads_is_answered_failed_and_the_model_goes_on(harness, kind, reply,
                                                                                                stream):
    model_name, thread = f"c47-read-{kind}", f"t-c47-read-{kind}"
    with RecordedServer(recording(model_name, reply, APPLY, DONE)) as server:
        _, _, state = await first_run(harness, server, model_name, thread, stream=stream)
    messages = state["messages"]
    answers = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    bad = answers["call_bad"]
    assert bad.status == "error" and bad.content.startswith(f"{FAILED_PREFIX} [invalid_arguments]")
    assert bad.artifact["outcome"] == "failed"
    assert len(server.requests) == 3 and state.get("model_error") is None  # read at once: no retry, no error
    assert await fetch(harness, LEDGER, (thread,)) == [("call_ok", "ApplyCredit")]  # the bad call never ran
    assert await scalar(harness, CREDIT) == 2500
    assert unanswered_tool_calls(messages) == [] and history_violations(messages) == []
    assert server.rejected == [] and all(openai_history_errors(r["messages"]) == [] for r in server.requests)


# ----------------------------------------------------------------- what is not an unreadable reply

def test_c47_transport_and_kit_errors_are_no_unreadable_reply_and_propagate():
    import httpx
    import openai

    from agentlab.core.provider_rules import ProviderHistoryError

    request = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    assert unreadable(openai.APIConnectionError(request=request)) is None
    assert unreadable(openai.InternalServerError("boom", response=httpx.Response(500, request=request), body=None)) is None
    assert unreadable(ProviderHistoryError("x")) is None
    assert unreadable(LookupError("no model is registered for thread 't'")) is None  # not a reply-reading class
    assert unreadable(KeyboardInterrupt()) is None


def test_c47_the_client_functions_named_exist_in_the_installed_client():
    """:data:`CLIENT_PARTS` names functions of langchain-openai / langchain-core; a rename after an upgrade
    would turn their shapes into the generic text (the parametrized test above fails first)."""
    from langchain_core.messages import ai
    from langchain_core.output_parsers import openai_tools as tools
    from langchain_openai.chat_models import base

    found = {name for module in (base, tools) for name in dir(module)} | set(dir(ai.AIMessage))
    found |= {name for name in dir(base.BaseChatOpenAI)}
    assert set(CLIENT_PARTS) <= found, set(CLIENT_PARTS) - found
