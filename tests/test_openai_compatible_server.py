"""The kit's graph through the real ``langchain_openai.ChatOpenAI`` client, against an OpenAI-compatible
server on 127.0.0.1 that answers from recorded vLLM, llama.cpp and Ollama responses
(``tests/data/openai_compatible``) and refuses, as OpenAI does, a history whose tool calls are not each
answered right after their message (``openai_compatible_server.py``).

The path from HTTP to ``AIMessage.tool_calls`` / ``invalid_tool_calls`` is the library's own; every run
goes unstreamed and streamed. Asserted: what the database holds, what the server was sent, the message
history, and that the thread takes another turn and a resume afterwards."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from openai_compatible_server import RecordedServer, openai_history_errors

from agentlab.core.graph import run_config
from agentlab.core.messages import (
    DUPLICATE_CALL_ID,
    INVALID_JSON_ARGUMENTS,
    SYNTHETIC_ID_PREFIX,
    unanswered_tool_calls,
)
from agentlab.core.provider_rules import REPEATED_ID_PREFIX, history_violations
from agentlab.core.safeguards import preset
from agentlab.runtime.models import load_model
from conftest import fetch, scalar

CREDIT = "SELECT credit_cents FROM customers WHERE id = 1"  # the seed's customer 1 opens with 5000
LEDGER = ("SELECT tool_call_id, occurrence, tool_name, args->>'amount_cents' FROM tool_executions "
          "WHERE thread_id = %s ORDER BY created_at, occurrence, tool_name")


async def run_turns(harness, server: RecordedServer, model_name: str, prompts: list[str], *, stream: bool,
                    thread: str):
    model = load_model(f"openai:{model_name}", base_url=server.base_url, streaming=stream)
    graph = harness.graph(preset("full"), model)
    config = run_config(thread, tenant_id="acme")
    for prompt in prompts:
        await graph.ainvoke({"messages": [HumanMessage(prompt)]}, config)
    state = await graph.ainvoke(None, config)  # a resume of the finished thread: nothing to do, no error
    return graph, config, state["messages"]


def tool_answers(messages) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage)]


def assert_every_request_kept_the_rules(server: RecordedServer, *, stream: bool, calls: int) -> None:
    assert server.rejected == []
    assert len(server.requests) == calls
    assert all(openai_history_errors(r["messages"]) == [] for r in server.requests)
    assert server.streamed == (calls if stream else 0)


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
async def test_vllm_null_ids_run_under_stable_synthetic_ids_and_the_thread_goes_on(harness, stream):
    with RecordedServer("vllm_qwen_null_ids") as server:
        _, _, messages = await run_turns(harness, server, "Qwen/Qwen2.5-7B-Instruct",
                                         ["Customer 1 returned RMA-1042 worth 25.00: credit memo, deduct, refund.",
                                          "How much credit is left?"], stream=stream, thread="t-vllm")
        drained = await harness.worker.drain()

    assert_every_request_kept_the_rules(server, stream=stream, calls=4)
    first = next(m for m in messages if isinstance(m, AIMessage))
    ids = [c["id"] for c in first.tool_calls]
    assert [c["name"] for c in first.tool_calls] == ["CreateCreditMemo", "ApplyCredit", "QueueRefund"]
    assert all(i.startswith(SYNTHETIC_ID_PREFIX) for i in ids) and len(set(ids)) == 3
    # the server got the synthetic ids back, each answered once right after the call
    sent = server.requests[1]["messages"]
    assert [c["id"] for c in sent[1]["tool_calls"]] == ids
    assert [m["tool_call_id"] for m in sent[2:5]] == ids and all(m["role"] == "tool" for m in sent[2:5])
    assert [m.tool_call_id for m in tool_answers(messages)][:3] == ids
    assert [m.artifact["outcome"] for m in tool_answers(messages)] == ["applied"] * 4
    assert unanswered_tool_calls(messages) == [] and history_violations(messages) == []
    assert await scalar(harness, CREDIT) == 2500
    assert await fetch(harness, "SELECT count(*) FROM credit_memos WHERE customer_id = 1") == [(1,)]
    assert drained.dispatched == 1
    assert await fetch(harness, "SELECT kind, amount_cents FROM provider.payments WHERE customer = 'cus_1'") == [
        ("refund", 2500)]
    rows = await fetch(harness, LEDGER, ("t-vllm",))
    assert sorted((r[0], r[2]) for r in rows) == sorted([*zip(ids, ("CreateCreditMemo", "ApplyCredit", "QueueRefund")),
                                                         (tool_answers(messages)[3].tool_call_id, "LookupCustomer")])


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
async def test_llamacpp_constant_id_is_a_new_call_every_turn_and_a_repeated_id_in_one_message_is_refused(
        harness, stream):
    prompts = ["Deduct 10.00.", "Deduct 10.00 again.", "Deduct 7.00.", "Look the customer up and deduct 3.00."]
    with RecordedServer("llamacpp_constant_id") as server:
        _, _, messages = await run_turns(harness, server, "gpt-3.5-turbo", prompts, stream=stream, thread="t-llama")

    assert_every_request_kept_the_rules(server, stream=stream, calls=9)
    assert await scalar(harness, CREDIT) == 5000 - 1000 - 1000 - 700 - 300
    assert await fetch(harness, LEDGER, ("t-llama",)) == [
        ("call_0", 0, "ApplyCredit", "1000"), ("call_0", 1, "ApplyCredit", "1000"), ("call_0", 2, "ApplyCredit", "700"),
        ("call_0", 4, "ApplyCredit", "300")]  # occurrence 3: the refused message (nothing applied)
    answers = tool_answers(messages)
    assert [m.tool_call_id for m in answers] == ["call_0"] * 5  # the state holds one answer per id and message
    refused = answers[3]
    assert DUPLICATE_CALL_ID in refused.content and refused.status == "error"
    # what the server was sent: the repeated call under a derived id, with the same refusal
    sent = server.requests[7]["messages"]
    at = next(i for i, m in enumerate(sent) if len(m.get("tool_calls") or []) == 2)
    first_id, second_id = (c["id"] for c in sent[at]["tool_calls"])
    assert first_id == "call_0" and second_id.startswith(REPEATED_ID_PREFIX)
    assert [(m["tool_call_id"], DUPLICATE_CALL_ID in m["content"]) for m in sent[at + 1:at + 3]] == [
        ("call_0", True), (second_id, True)]
    assert server.requests[8]["messages"][at]["tool_calls"][1]["id"] == second_id  # stable on the next call


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
async def test_ollama_arguments_that_are_not_json_are_refused_once_streamed_or_not(harness, stream):
    with RecordedServer("ollama_invalid_json") as server:
        _, _, messages = await run_turns(harness, server, "qwen2.5:7b", ["Apply 25.00 of store credit."],
                                         stream=stream, thread="t-ollama")

    assert_every_request_kept_the_rules(server, stream=stream, calls=3)
    first = next(m for m in messages if isinstance(m, AIMessage))
    assert [c["id"] for c in first.tool_calls] == ["functions.LookupCustomer:0"]
    assert [(c["id"], c["args"]) for c in first.invalid_tool_calls] == [
        ("functions.ApplyCredit:1", '{"customer_id": 1, "amount_cents": 25')]  # not completed to 25 cents
    answers = tool_answers(messages)
    assert [(m.tool_call_id, m.artifact["outcome"]) for m in answers] == [
        ("functions.LookupCustomer:0", "not_applied"), ("functions.ApplyCredit:1", "failed"),
        ("functions.LookupCustomer:0", "applied"), ("functions.ApplyCredit:1", "applied")]
    assert INVALID_JSON_ARGUMENTS in answers[1].content
    # the server got the cut-off text back as the call's arguments, answered by the refusal
    sent = server.requests[1]["messages"]
    assert sent[1]["tool_calls"][1]["function"]["arguments"] == '{"customer_id": 1, "amount_cents": 25'
    assert await scalar(harness, CREDIT) == 2500  # 25.00 once, never 25 cents
    assert await fetch(harness, LEDGER, ("t-ollama",)) == [
        ("functions.ApplyCredit:1", 1, "ApplyCredit", "2500"), ("functions.LookupCustomer:0", 1, "LookupCustomer", None)]


async def test_a_stopped_server_ends_the_run_with_one_clear_line_and_no_key(harness, monkeypatch):
    from agentlab.runtime.models import describe_model_error

    monkeypatch.setenv("VLLM_KEY", "sk-local-Sup3rSecretValue")
    with RecordedServer("vllm_qwen_null_ids") as server:
        base_url = server.base_url
    model = load_model("openai:Qwen/Qwen2.5-7B-Instruct", base_url=base_url, api_key_env="VLLM_KEY", max_retries=0,
                       timeout_s=5)
    sc = harness.scenario("refund")
    ep = await harness.run_episode(sc, "full", model=model)
    assert ep.error is not None and ep.error.startswith("the model server at http://127.0.0.1:")
    assert "could not be reached" in ep.error and "Sup3r" not in ep.error
    assert describe_model_error(ValueError("x"), model) is None
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 0
