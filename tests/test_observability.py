"""One structured event per node execution, read back from the events table."""

from __future__ import annotations

import matplotlib
import psycopg
import pytest

from agentlab.core.graph import build_graph
from agentlab.core.safeguards import preset
from agentlab.domains.billing.scenarios import get_scenario
from agentlab.lab.observability import episode_with_a_retry, node_summary, run_events, timeline_chart
from agentlab.sim.model import ScriptedChatModel

matplotlib.use("Agg")


async def test_one_node_event_per_node_execution_and_one_call_event_per_tool_call(harness, caplog):
    ep = await harness.run_episode("refund", "full")
    frame = await run_events(harness, ep.thread_id)
    nodes = frame[frame["kind"] == "node"]
    assert list(nodes["node"]) == ["agent", "tools", "agent", "tools", "agent"]
    assert list(nodes["step"]) == [1, 2, 3, 4, 5]
    assert set(nodes["outcome"]) == {"ok"} and nodes["latency_ms"].gt(0).all()
    agent = nodes[nodes["node"] == "agent"]
    assert agent["input_tokens"].notna().all() and agent["output_tokens"].gt(0).all()
    assert nodes[nodes["node"] == "tools"]["input_tokens"].isna().all()  # no model call, no tokens
    calls = frame[frame["kind"] == "call"]
    assert len(calls) == sum(len(m.tool_calls) for m in ep.messages if hasattr(m, "tool_calls")) == 6
    summary = node_summary(frame)
    assert summary.loc["agent", "executions"] == 3 and summary.loc["tools", "executions"] == 2
    logged = [r.agentlab_event for r in caplog.records if getattr(r, "agentlab_event", {}).get("kind") == "node"]
    assert len(logged) == 5  # the same events went to logging


async def test_each_retry_attempt_leaves_its_own_event(harness):
    scenario = get_scenario("invoice")
    sg = preset("full")
    ids = await harness.create_customers(scenario, sg)
    node = harness.node(sg)
    failures = {"left": 1}

    def lose_connection(call, index):
        if failures["left"]:
            failures["left"] -= 1
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    node.hooks.before_call.append(lose_connection)
    graph = build_graph(ScriptedChatModel(script=scenario.script(ids)), node, checkpointer=harness.saver)
    ep = await harness.run_episode(scenario, sg, graph=graph)
    frame = await run_events(harness, ep.thread_id, kind="node")
    tools = frame[frame["node"] == "tools"]
    first = tools.iloc[0]
    assert (first["attempt"], first["outcome"], first["error_class"]) == (1, "error", "psycopg.OperationalError")
    assert (tools.iloc[1]["attempt"], tools.iloc[1]["outcome"]) == (2, "ok")
    assert first["step"] == tools.iloc[1]["step"]  # the retry ran in the same super-step


async def test_timeline_chart_draws_one_bar_per_node_execution(harness):
    ep = await harness.run_episode("refund", "full")
    frame = await run_events(harness, ep.thread_id)
    fig = timeline_chart(frame)
    ax = fig.axes[0]
    assert len(ax.patches) == 5
    assert "ms" in ax.get_xlabel() and [t.get_text() for t in ax.get_yticklabels()] == ["agent", "tools"]


async def test_events_of_another_kind_are_refused(harness):
    with pytest.raises(ValueError):
        harness.events.record("agent", "ok", kind="span")
    assert harness.events.pending == 0


async def test_a_retry_leaves_the_final_state_of_a_clean_run_and_one_more_node_event(harness):
    clean = await harness.run_episode("refund", "full")
    retried = await episode_with_a_retry(harness)

    def outcomes(ep):
        return [m.artifact["outcome"] for m in ep.tool_messages]

    assert outcomes(retried) == outcomes(clean) and len(retried.messages) == len(clean.messages) == 10
    credits = await harness.df("SELECT id, credit_cents FROM customers WHERE id = ANY(%s) ORDER BY id",
                               ([clean.customer_ids[0], retried.customer_ids[0]],))
    assert list(credits.credit_cents) == [2500, 2500]
    nodes = await run_events(harness, retried.thread_id, kind="node")
    assert list(zip(nodes["node"], nodes["step"], nodes["attempt"], nodes["outcome"])) == [
        ("agent", 1, 1, "ok"), ("tools", 2, 1, "ok"), ("agent", 3, 1, "ok"), ("tools", 4, 1, "error"),
        ("tools", 4, 2, "ok"), ("agent", 5, 1, "ok")]
    assert nodes["error_class"].dropna().tolist() == ["psycopg.errors.LockNotAvailable"]
    # the lock was released: nobody waits on the customer's row any more
    assert (await harness.df("SELECT count(*) AS n FROM pg_locks WHERE NOT granted AND database = "
                             "(SELECT oid FROM pg_database WHERE datname = current_database())")).n[0] == 0


async def test_timeline_labels_of_close_bars_in_one_lane_do_not_share_a_row(harness):
    ep = await harness.run_episode("refund", "full")
    ax = timeline_chart(await run_events(harness, ep.thread_id)).axes[0]
    agent_labels = [t for t in ax.texts if "tok" in t.get_text()]
    assert len(agent_labels) == 3
    assert agent_labels[0].get_position()[1] != agent_labels[1].get_position()[1]
