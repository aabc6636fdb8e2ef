"""The yardstick: the two documented baselines and the kit under the same faults, each checked against
what the database and the provider hold (credit, rows, payments), not against the lab's own counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.prebuilt import ToolNode

from agentlab.core.errors import AgentlabError
from agentlab.lab.agents import AgentContext, AgentSpec, baseline, resolve_agent
from agentlab.lab.agents.billing_tools import BASELINE_TOOL_NAMES, billing_tools
from agentlab.lab.faults import Fault
from agentlab.lab.yardstick import Yardstick, as_domain_messages
from agentlab.lab.yardstick_faults import YARDSTICK_FAULTS, register_fault
from agentlab.lab.yardstick_table import run_yardstick
from conftest import customer_state, fetch, scalar

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


async def state_of(h, run) -> dict:
    """What the database and the provider hold for the run's single customer."""
    (cid,) = run.customer_ids
    return await customer_state(h, cid)


def calls_and_answers(messages) -> tuple[int, int]:
    calls = sum(len(m.tool_calls) for m in messages if isinstance(m, AIMessage))
    return calls, sum(isinstance(m, ToolMessage) for m in messages)


async def test_the_prebuilt_toolnode_deducts_the_refund_twice_and_raises_with_three_calls_unanswered(harness):
    run = await Yardstick(harness).run("toolnode", "refund_story")
    assert run.status == "ran" and run.scenario.name == "refund"
    assert run.raised == "UniqueViolation (23505)"  # the resent credit memo meets its UNIQUE key
    assert await state_of(harness, run) == {"credit": 0, "memos": 1, "refunds": 1, "paid_refunds": 1}  # 5000 of 2500
    assert calls_and_answers(run.messages) == (6, 3)
    kinds = run.counts()
    assert kinds["balance_mismatch"] == 1 and kinds["unanswered_call"] == 3 and kinds["unreported_effect"] == 1


async def test_create_agent_leaves_a_refund_row_that_is_never_paid(harness):
    run = await Yardstick(harness).run("create_agent", "refund_story")
    assert run.raised == "UniqueViolation (23505)"
    assert await state_of(harness, run) == {"credit": 0, "memos": 1, "refunds": 1, "paid_refunds": 0}
    assert run.counts()["payment_count"] == 1 and run.counts()["balance_mismatch"] == 1


async def test_the_kit_under_full_ends_the_refund_story_as_intended(harness):
    run = await Yardstick(harness).run("kit", "refund_story")
    assert run.raised is None and run.violations == []
    assert await state_of(harness, run) == {"credit": 2500, "memos": 1, "refunds": 1, "paid_refunds": 1}
    ledger = await fetch(harness, "SELECT tool_name FROM tool_executions WHERE thread_id = %s ORDER BY tool_name",
                         (run.thread_id,))
    assert [r[0] for r in ledger] == ["ApplyCredit", "CreateCreditMemo", "QueueRefund"]


async def test_a_backend_killed_by_another_connection_mid_update(harness):
    ys = Yardstick(harness)
    naive = await ys.run("toolnode", "backend_killed", scenario="refund")
    assert naive.notes["terminated"] and naive.raised == "AdminShutdown (57P01)"
    # the UPDATE died with its backend; its siblings committed: the refund is paid, nothing deducted
    assert await state_of(harness, naive) == {"credit": 5000, "memos": 1, "refunds": 1, "paid_refunds": 1}
    killed = await scalar(harness, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (naive.notes["killed_pid"],))
    assert killed == 0
    kit = await ys.run("kit", "backend_killed", scenario="refund")
    assert kit.notes["terminated"] and kit.violations == []
    assert await state_of(harness, kit) == {"credit": 2500, "memos": 1, "refunds": 1, "paid_refunds": 1}


async def test_a_crash_at_the_checkpointer_replays_the_tools_step_of_the_baseline_not_of_the_kit(harness):
    ys = Yardstick(harness)
    base = await ys.run("toolnode", "crash_before_checkpoint", scenario="refund")
    assert base.crashed
    assert (await state_of(harness, base))["credit"] == 0  # applied again on resume
    kit = await ys.run("kit", "crash_before_checkpoint", scenario="refund")
    assert kit.crashed and kit.violations == []
    assert await state_of(harness, kit) == {"credit": 2500, "memos": 1, "refunds": 1, "paid_refunds": 1}
    replayed = await scalar(harness, "SELECT count(*) FROM events WHERE thread_id = %s AND outcome = 'replayed'",
                            (kit.thread_id,))
    assert replayed == 3


async def test_a_fault_that_needs_a_hook_is_na_for_a_foreign_agent_and_runs_for_the_kit(harness):
    ys = Yardstick(harness)
    base = await ys.run("toolnode", "crash_mid_node")
    assert base.status == "n/a" and "hook" in base.reason and base.customer_ids == [] and base.violations == []
    kit = await ys.run("kit", "crash_mid_node", scenario="refund")
    assert kit.status == "ran" and kit.crashed and kit.violations == []
    real = Yardstick(harness, model=lambda script, seed: None)  # a real model: hallucinations are not on cue
    run = await real.run("toolnode", "stray_quote")
    assert run.status == "n/a" and "real model" in run.reason


async def test_your_own_factory_runs_under_the_same_faults(harness):
    def my_agent(ctx: AgentContext):
        from agentlab.lab.agents.toolnode import build_toolnode_agent

        return build_toolnode_agent(ctx.model, billing_tools(ctx.pool, ctx.provider), checkpointer=ctx.checkpointer)

    spec = AgentSpec("mine", my_agent, BASELINE_TOOL_NAMES)
    run = await Yardstick(harness).run(spec, "none", scenario="refund")
    assert run.agent == "mine" and run.violations == []
    assert await state_of(harness, run) == {"credit": 2500, "memos": 1, "refunds": 1, "paid_refunds": 1}
    # a factory without a name map plays the domain's own tool names, which the baseline tools lack
    bare = await Yardstick(harness).run(my_agent, "none", scenario="refund")
    assert bare.raised is None and bare.counts()["record_count"] >= 1


def test_the_baselines_are_the_documented_defaults():
    tools = billing_tools(pool=None, provider=None)
    assert [t.name for t in tools] == list(BASELINE_TOOL_NAMES.values())
    schema = tools[1].tool_call_schema.model_json_schema()  # apply_credit: inferred from the signature
    assert schema["properties"]["customer_id"]["type"] == "integer" and "strict" not in json.dumps(schema)

    class Model:
        def bind_tools(self, tools):
            return self

    graph = baseline("toolnode").build(AgentContext(Model(), None, None, None, None))
    node = graph.nodes["tools"].bound
    assert isinstance(node, ToolNode) and node._handle_tool_errors.__name__ == "_default_handle_tool_errors"
    assert set(graph.nodes) == {"__start__", "chatbot", "tools"}


def test_names_resolve_and_a_wrong_one_says_what_exists():
    assert resolve_agent("kit").name == "kit:full" and resolve_agent("kit:naive").safeguards.name == "naive"
    assert resolve_agent("create_agent").tool_names == BASELINE_TOOL_NAMES
    for wrong in ("kit:nosuch", "nosuch", "agentlab.nosuch:f"):
        with pytest.raises(AgentlabError, match="agent"):
            resolve_agent(wrong)
    with pytest.raises(ValueError, match="already has"):
        register_fault(Fault("none", "control", "again", "-"))
    assert "crash_mid_node" in YARDSTICK_FAULTS


def test_messages_are_read_back_under_the_domains_tool_names():
    ai = AIMessage("", tool_calls=[{"name": "apply_credit", "args": {}, "id": "c1", "type": "tool_call"}])
    tm = ToolMessage("{}", tool_call_id="c1", name="apply_credit")
    back = as_domain_messages([ai, tm], BASELINE_TOOL_NAMES)
    assert back[0].tool_calls[0]["name"] == "ApplyCredit" and back[1].name == "ApplyCredit"
    assert ai.tool_calls[0]["name"] == "apply_credit"  # the originals stay as the agent wrote them


@pytest.mark.slow
async def test_the_same_seed_gives_the_same_table_and_the_kit_stays_at_zero():
    faults = ["refund_story", "wrong_order", "provider_timeout", "crash_mid_node"]
    one = await run_yardstick(["toolnode", "create_agent", "kit"], faults, seed=3)
    two = await run_yardstick(["toolnode", "create_agent", "kit"], faults, seed=3)
    assert one.deterministic_view().equals(two.deterministic_view())  # the costs vary with the clock
    summary = one.summary
    assert list(summary.columns) == ["toolnode", "create_agent", "kit:full"]
    assert (summary["kit:full"] == 0).all()
    assert summary.loc["crash_mid_node", "toolnode"] == "n/a"
    assert summary.loc["refund_story", "toolnode"] > 0 and summary.loc["refund_story", "create_agent"] > 0
    assert one.raised().loc["refund_story", "toolnode"] == "UniqueViolation (23505)"


@pytest.mark.slow
async def test_the_kits_full_column_is_zero_under_every_fault():
    result = await run_yardstick(["kit"])
    assert set(result.summary["kit:full"]) == {0}
    assert (result.rows["status"] == "ran").all()


def test_chaos_agent_prints_the_table_as_json_and_refuses_an_unknown_agent(tmp_path):
    (tmp_path / "my_agents.py").write_text(
        "from agentlab.lab.agents import baseline\n"
        "def factory(ctx):\n"
        "    return baseline('toolnode').build(ctx)\n"
        "from agentlab.lab.agents import AgentSpec\n"
        "from agentlab.lab.agents.billing_tools import BASELINE_TOOL_NAMES\n"
        "MINE = AgentSpec('mine', factory, BASELINE_TOOL_NAMES)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
    cmd = [sys.executable, "-m", "agentlab", "chaos", "--agent", "toolnode", "my_agents:MINE", "kit",
           "--presets", "full", "naive", "--faults", "refund_story", "crash_mid_node", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert list(data["summary"]) == ["toolnode", "mine", "kit:full", "kit:naive"]
    assert data["summary"]["kit:full"] == {"refund_story": 0, "crash_mid_node": 0}
    assert data["summary"]["toolnode"]["refund_story"] == data["summary"]["mine"]["refund_story"] > 0
    assert data["summary"]["toolnode"]["crash_mid_node"] == "n/a"
    assert "hook" in data["not_applicable"]["toolnode"]["crash_mid_node"]
    assert data["versions"]["langgraph-prebuilt"] and data["versions"]["langchain"]
    bad = subprocess.run([sys.executable, "-m", "agentlab", "chaos", "--agent", "nosuch"], capture_output=True,
                         text=True, timeout=120, env=env, check=False)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [bad.stderr.strip()] and "unknown agent 'nosuch'" in bad.stderr


@pytest.mark.parametrize("args, says", [
    (["--model", "openai:gpt-4o-mini"], "OPENAI_API_KEY, which is not set"),  # the catalog's experiment takes it too
    (["--agent", "toolnode", "--model", "nosuch"], "must look like 'provider:model'"),
    (["--agent", "toolnode", "--domain", "retail"], "runs the billing domain"),
])
def test_chaos_agent_refuses_a_model_or_domain_it_cannot_use_in_one_line(args, says):
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    out = subprocess.run([sys.executable, "-m", "agentlab", "chaos", *args], capture_output=True, text=True,
                         timeout=120, env=env, check=False)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and says in out.stderr
