"""OpenTelemetry traces after the GenAI semantic conventions, read with the SDK's own in-memory exporter.

A run is an ``invoke_agent`` span; each model call a ``chat`` span and each tool call an ``execute_tool`` span
under it, carrying what became of the call as stored (applied, failed with its SQLSTATE, not applied,
replayed), the savepoint it ran in and the node's attempt. Off (the default) there is no span, and the kit
imports nothing of OpenTelemetry; configured from the ``OTEL_*`` variables, a console exporter prints the
spans and an endpoint that does not answer costs one warning while the run goes on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import psycopg
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from agentlab.core import tracing
from agentlab.core.graph import build_graph, run_config
from agentlab.core.safeguards import preset
from agentlab.lab.observability import run_events
from agentlab.sim.model import ScriptedChatModel
from conftest import TurnModel, scalar

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def spans():
    """Tracing on for the test, into an in-memory exporter; off again after it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        yield exporter
    finally:
        tracing.disable()


def by_name(exporter, prefix: str) -> list:
    return sorted((s for s in exporter.get_finished_spans() if s.name.startswith(prefix)), key=lambda s: s.start_time)


async def test_a_refund_episode_is_one_invoke_agent_span_with_its_chat_and_execute_tool_spans(harness, spans):
    ep = await harness.run_episode("refund", "full")

    (run,) = by_name(spans, "invoke_agent")
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run.attributes["gen_ai.conversation.id"] == ep.thread_id and run.attributes["agentlab.preset"] == "full"
    chats, tools = by_name(spans, "chat"), by_name(spans, "execute_tool")
    assert len(chats) == 3 and all(s.attributes["gen_ai.usage.output_tokens"] > 0 for s in chats)
    assert all(s.parent.span_id == run.context.span_id for s in chats + tools)
    # the first batch: QueueRefund's customer id hallucinated, refused before any SQL, its siblings not applied;
    # the second: all three applied, each in its savepoint
    assert [(s.attributes["gen_ai.tool.name"], s.attributes["agentlab.outcome"]) for s in tools] == [
        ("CreateCreditMemo", "not_applied"), ("ApplyCredit", "not_applied"), ("QueueRefund", "failed"),
        ("CreateCreditMemo", "applied"), ("ApplyCredit", "applied"), ("QueueRefund", "applied")]
    assert [s.attributes.get("agentlab.savepoint") for s in tools] == [None] * 3 + ["tool_call"] * 3
    assert {s.attributes["agentlab.attempt"] for s in tools} == {1}
    assert tools[2].status.status_code is StatusCode.ERROR and tools[2].attributes["agentlab.category"] == (
        "invalid_arguments")
    assert all(s.end_time > s.start_time for s in tools[3:])  # a call that ran spans its own time
    # the events table, the durable record, holds the same calls
    events = await run_events(harness, ep.thread_id, kind="call")
    assert sorted(s.attributes["gen_ai.tool.call.id"] for s in tools) == sorted(events["tool_call_id"])


async def test_a_call_the_database_refused_carries_its_sqlstate_and_its_rolled_back_sibling_its_savepoint(
        harness, spans):
    over = AIMessage("", tool_calls=[
        {"name": "CreateCreditMemo", "args": {"customer_id": 1, "amount_cents": 100, "reference": "RMA-7"},
         "id": "memo", "type": "tool_call"},
        {"name": "ApplyCredit", "args": {"customer_id": 1, "amount_cents": 10**8}, "id": "over", "type": "tool_call"}])
    graph = build_graph(TurnModel([over]), harness.node(preset("full")), checkpointer=harness.saver)
    await graph.ainvoke({"messages": [HumanMessage("credit it")]}, run_config("t-trace-sql", tenant_id="acme"))

    memo, applied = by_name(spans, "execute_tool")
    assert applied.attributes["agentlab.outcome"] == "failed"
    assert applied.attributes["db.response.status_code"] == applied.attributes["error.type"] == "23514"
    assert applied.status.status_code is StatusCode.ERROR
    assert memo.attributes["agentlab.outcome"] == "not_applied" and memo.status.status_code is StatusCode.UNSET
    assert memo.attributes["agentlab.savepoint"] == "tool_call" and memo.end_time > memo.start_time  # it ran
    assert memo.attributes["agentlab.batch.rolled_back"] is True
    assert await scalar(harness, "SELECT count(*) FROM credit_memos WHERE reference = 'RMA-7'") == 0


async def test_a_retry_after_commit_is_the_second_attempt_and_its_calls_are_replayed_from_the_ledger(
        harness, spans):
    node = harness.node(preset("full"))
    lost = {"left": 1}

    def lose_the_connection_after_commit(calls):
        if lost["left"]:
            lost["left"] -= 1
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    node.hooks.after_commit.append(lose_the_connection_after_commit)
    scenario = harness.scenario("invoice")
    ids = await harness.create_customers(scenario, preset("full"))
    graph = build_graph(ScriptedChatModel(script=scenario.script(ids)), node, checkpointer=harness.saver)
    await harness.run_episode(scenario, "full", graph=graph)

    tools = by_name(spans, "execute_tool")
    replayed = [s for s in tools if s.attributes["agentlab.outcome"] == "replayed"]
    assert replayed and {s.attributes["agentlab.attempt"] for s in replayed} == {2}
    ids = [s.attributes["gen_ai.tool.call.id"] for s in tools]
    assert len(ids) == len(set(ids)), "the attempt that raised wrote no span: each call has one"


async def test_tracing_off_writes_no_span_and_the_graph_gets_no_callback(harness):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    tracing.disable()
    graph = harness.graph(preset("full"), ScriptedChatModel(script=[]))
    assert not any(isinstance(h, tracing.SpanCallback) for h in (graph.config or {}).get("callbacks") or [])
    await harness.run_episode("refund", "full")
    assert exporter.get_finished_spans() == () and not tracing.enabled()


EPISODE = textwrap.dedent("""
    import asyncio, sys
    from agentlab.runtime.harness import Harness

    async def main():
        h = await Harness.open(sys.argv[1])
        try:
            ep = await h.run_episode("refund", "full")
            print("episode", ep.error is None, flush=True)
        finally:
            await h.close()
    {before}
    asyncio.run(main())
    {after}
""")
IMPORTERS = """
import importlib.abc, sys
importers = set()
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith("<frozen"):
                frame = frame.f_back
            importers.add(frame.f_globals.get("__name__", "?") if frame is not None else "?")
        return None
sys.meta_path.insert(0, Watch())
"""


def run_script(database_url: str, before: str = "", after: str = "", **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    code = EPISODE.format(before=before, after=after)
    return subprocess.run([sys.executable, "-c", code, database_url], capture_output=True, text=True, timeout=120,
                          env={**clean, "PYTHONPATH": ROOT, **env}, cwd=ROOT)


def test_tracing_off_the_kit_imports_nothing_of_opentelemetry(database_url):
    """Other libraries may (langsmith looks for the SDK); no module of the kit does."""
    done = run_script(database_url, before=IMPORTERS, after="print('kit importers', sorted(i for i in importers "
                                                             "if i.startswith('agentlab')))")
    assert done.returncode == 0, done.stderr
    assert "episode True" in done.stdout and "kit importers []" in done.stdout


def test_otel_traces_exporter_console_prints_the_spans(database_url):
    done = run_script(database_url, OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="agentlab-test")
    assert done.returncode == 0, done.stderr
    assert '"name": "invoke_agent agentlab"' in done.stdout and '"name": "execute_tool QueueRefund"' in done.stdout
    assert '"agentlab.outcome": "applied"' in done.stdout and '"service.name": "agentlab-test"' in done.stdout


@pytest.mark.slow
def test_an_exporter_endpoint_that_does_not_answer_is_one_warning_and_the_run_goes_on(database_url):
    done = run_script(database_url, OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
                      OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http://127.0.0.1:9/v1/traces",
                      OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="2", OTEL_BSP_SCHEDULE_DELAY="50",
                      after="import time; time.sleep(3)")  # the background export fails meanwhile
    assert done.returncode == 0, done.stderr
    assert "episode True" in done.stdout
    warnings = [line for line in done.stderr.splitlines() if "OpenTelemetry" in line or "opentelemetry" in line]
    assert len(warnings) == 1 and "could not export" in warnings[0], done.stderr


def test_an_exporter_that_is_not_installed_turns_tracing_off_with_one_warning(database_url):
    done = run_script(database_url, OTEL_TRACES_EXPORTER="zipkin_json")
    assert done.returncode == 0 and "episode True" in done.stdout, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "OpenTelemetry" in line]
    assert len(warnings) == 1 and "traces are off" in warnings[0], done.stderr
