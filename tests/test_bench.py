"""The bench: it runs, reports every named figure and ratio, and its plain psycopg batch sends exactly
the node's SQL. Figures are printed, never asserted: nothing here depends on the machine's speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agentlab.bench.batch import (
    NAIVE_ROUND_TRIPS,
    NODE_ROUND_TRIPS,
    BatchSource,
    create_bench_customer,
    naive_batch,
    node_batch,
    plain_batch,
    traced_statements,
)
from agentlab.bench.figures import ENGINE_FIGURES
from agentlab.bench.suite import FIGURES, GOALS, NETWORK_RTTS_MS, RATIOS, TAU2_FIGURES, network_figure
from agentlab.core.events import EventLog
from agentlab.core.safeguards import preset
from agentlab.core.tools_node import TransactionalToolsNode
from agentlab.domains.billing.tools import TOOLS
from agentlab.runtime import db
from conftest import scalar


def test_bench_quick_json_reports_every_named_figure_and_ratio():
    before = set(db.list_databases())
    # one repeat: every section measured once (what this test checks is the report, not a steady median)
    proc = subprocess.run([sys.executable, "-m", "agentlab", "bench", "--quick", "--repeats", "1", "--json"],
                          capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert set(out["figures"]) == set(FIGURES) - set(TAU2_FIGURES) - set(ENGINE_FIGURES)  # --quick leaves them out
    for name, fig in out["figures"].items():
        assert fig["unit"] == FIGURES[name]
        assert fig["repeats"] >= 1 and fig["min"] <= fig["median"] <= fig["max"], name
    assert out["figures"]["node_batch_ms"]["repeats"] == 1  # --repeats taken
    assert set(out["ratios"]) == set(RATIOS) and all(v is not None and v > 0 for v in out["ratios"].values())
    assert set(out["goals"]) == set(GOALS)
    assert all(g["met"] in (True, False) for n, g in out["goals"].items()
               if GOALS[n][0] not in (*TAU2_FIGURES, *ENGINE_FIGURES))
    assert out["notes"]["same_sql"] is True
    # behind the delay line every round trip takes at least the RTT asked for: lower bounds the delay forces
    assert out["notes"]["network"]["rtts_ms"] == list(NETWORK_RTTS_MS)
    for rtt_ms in NETWORK_RTTS_MS[1:]:
        fig = out["figures"]
        assert fig[network_figure(rtt_ms, "select1_ms")]["min"] >= rtt_ms
        assert fig[network_figure(rtt_ms, "node_ms")]["min"] >= NODE_ROUND_TRIPS * rtt_ms
        assert fig[network_figure(rtt_ms, "naive_ms")]["min"] >= NAIVE_ROUND_TRIPS * rtt_ms
    assert out["machine"]["cpus"] >= 1 and out["mode"] == "quick"
    assert "bench:" in proc.stderr  # progress goes to stderr, the JSON alone to stdout
    # every database the bench made for a section was dropped with it
    assert [d for d in set(db.list_databases()) - before if d.startswith("agentlab_bench")] == []


async def test_plain_psycopg_batch_sends_exactly_the_nodes_sql(harness):
    source = BatchSource(await create_bench_customer(harness.pool))
    node_sent = await traced_statements(harness.url, lambda pool: node_batch(
        TransactionalToolsNode(pool, preset("full"), toolset=TOOLS, events=EventLog(None)), source.next()))
    plain_sent = await traced_statements(harness.url, lambda pool: plain_batch(pool, source.next()))
    assert node_sent == plain_sent
    assert node_sent.statements[0] == "BEGIN" and node_sent.statements[-1] == "COMMIT"
    assert sum(s.startswith("SAVEPOINT") for s in node_sent.statements) == 3  # a savepoint per call
    # BEGIN + prelude + tenant + look-up pipelined; per call SAVEPOINT with the first statement and the previous
    # call's ledger row and RELEASE (QueueRefund reads one statement more: the outbox row); the last call's
    # ledger row and RELEASE go with COMMIT in the pipeline's Sync
    assert node_sent.round_trips == NODE_ROUND_TRIPS == 6
    # both batches applied: two memos, two refunds, six ledger rows
    assert await scalar(harness, "SELECT count(*) FROM credit_memos WHERE customer_id = %s", (source.customer_id,)) == 2
    assert await scalar(harness, "SELECT count(*) FROM tool_executions WHERE thread_id = %s", (source.thread_id,)) == 6


async def test_the_naive_nested_transactions_send_the_same_work_one_statement_at_a_time(harness):
    source = BatchSource(await create_bench_customer(harness.pool))
    node_sent = await traced_statements(harness.url, lambda pool: node_batch(
        TransactionalToolsNode(pool, preset("full"), toolset=TOOLS, events=EventLog(None)), source.next()))
    naive_sent = await traced_statements(harness.url, lambda pool: naive_batch(pool, source.next()))

    def work(sent):  # the statements but the savepoints' own (psycopg names its savepoints itself)
        return [s for s in sent.statements if not s.startswith(("SAVEPOINT", "RELEASE"))]

    assert work(naive_sent) == work(node_sent)
    assert sum(s.startswith("SAVEPOINT") for s in naive_sent.statements) == 3
    assert naive_sent.round_trips == NAIVE_ROUND_TRIPS == len(naive_sent.statements) == 18  # one wait each
    assert await scalar(harness, "SELECT count(*) FROM tool_executions WHERE thread_id = %s", (source.thread_id,)) == 6


async def test_the_reference_path_sends_the_pipelined_work_in_a_round_trip_each(harness):
    """The node's reference strategy (psycopg's nested transactions, ``core/batch/savepoints.py``) sends what
    the pipelined strategy sends, the same savepoint name included, one statement per round trip after the
    pipelined opening: what the bench's "reference path" row times."""
    from agentlab.core.batch import SavepointStrategy

    source = BatchSource(await create_bench_customer(harness.pool))
    sent = {name: await traced_statements(harness.url, lambda pool, strategy=strategy: node_batch(
        TransactionalToolsNode(pool, preset("full"), toolset=TOOLS, events=EventLog(None), strategy=strategy),
        source.next())) for name, strategy in (("pipelined", None), ("reference", SavepointStrategy()))}
    assert sent["reference"].statements == sent["pipelined"].statements
    # BEGIN + prelude + tenant + look-up in one; then SAVEPOINT, each statement, ledger row, RELEASE; COMMIT
    assert sent["reference"].round_trips == 1 + (3 + 3 + 4) + 3 + 1 == 15
    assert await scalar(harness, "SELECT count(*) FROM tool_executions WHERE thread_id = %s", (source.thread_id,)) == 6


@pytest.mark.parametrize("value, says", [("0", "must be at least 1, got 0"), ("-2", "must be at least 1, got -2"),
                                         ("two", "expected a whole number, got 'two'")])
def test_bench_repeats_below_one_or_not_a_number_is_a_usage_error(value, says, capsys):
    from agentlab.cli.main import build_parser

    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["bench", "--repeats", value])
    assert stop.value.code == 2
    assert f"argument --repeats: {says}" in capsys.readouterr().err
    assert build_parser().parse_args(["bench", "--quick", "--repeats", "1"]).repeats == 1


@pytest.mark.slow
async def test_the_engines_section_measures_each_engines_refund_rows_with_their_costs():
    from agentlab.bench import sections
    from agentlab.bench.figures import ENGINE_AGENTS, QUICK
    from agentlab.bench.report import Report, render
    from agentlab.lab.yardstick import ENGINE_FAULTS

    if missing := sections.engines_missing():
        pytest.skip(f"optional engines not installed: {', '.join(missing)} (pip install -r requirements-engines.txt)")
    report = Report(QUICK)
    await sections.bench_engines(report)
    engines = report.notes["engines"]
    assert report.figures["engines_table_s"].median > 0
    assert list(engines["violations"]) == list(ENGINE_AGENTS)
    assert engines["violations"]["kit:full"] == dict.fromkeys(ENGINE_FAULTS, 0)
    assert engines["violations"]["temporal:activities"]["stuck_retry"] > 0
    assert engines["verdicts"]["temporal:activities x stuck_retry"] == ["RUNNING"]
    assert all(c["round_trips_per_call"] >= 1 for c in engines["costs_per_tool_call"].values())
    text = render(report)
    assert "the durable engines on the refund story" in text and "engines_refund_rows_in_5_min" in text


async def test_the_engines_section_says_what_to_install_when_an_engine_is_missing(monkeypatch):
    from agentlab.bench import sections
    from agentlab.bench.figures import QUICK
    from agentlab.bench.report import Report, render

    monkeypatch.setattr(sections, "engines_missing", lambda: ["temporalio"])
    report = Report(QUICK)
    await sections.bench_engines(report)
    assert "engines_table_s" not in report.figures
    assert "pip install -r requirements-engines.txt" in render(report)
