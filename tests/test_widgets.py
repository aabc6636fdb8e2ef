"""The failure lab widget, driven headlessly: ipywidgets works without a front end, and ``button.click()``
calls the same handler a click does. Each test checks the widget's output against the database."""

from __future__ import annotations

import asyncio

import matplotlib

matplotlib.use("Agg")

import pytest

from agentlab.lab.session import LabSession
from agentlab.lab.widget import NO_LOOP, TAB_TITLES, FailureLab
from conftest import fetch, scalar


@pytest.fixture
async def labs(harness):
    """Build widgets on the test's harness. A run still going when the test ends (it failed before awaiting
    it) is waited for before the harness closes: a run cut off mid-way would leave its pools opening."""
    built: list[FailureLab] = []

    def make(target=None) -> FailureLab:
        built.append(FailureLab(harness if target is None else target))
        return built[-1]

    yield make
    pending = [lab.task for lab in built if lab.task is not None and not lab.task.done()]
    if pending:
        await asyncio.wait(pending, timeout=60)


async def test_run_from_the_button_runs_the_episode_and_fills_every_tab(harness, labs):
    lab = labs()
    lab.choose(fault="crash_before_checkpoint", preset="ledger", scenario="refund", seed=0)
    assert lab.choice() == {"scenario": "refund", "preset": "ledger", "fault": "crash_before_checkpoint",
                            "seed": 0, "episodes": 1}
    lab.run_button.click()
    assert lab.task is not None and not lab.task.done()  # scheduled on the running loop, not run yet
    assert lab.run_button.disabled
    result = await lab.wait()
    assert not lab.run_button.disabled and lab.error is None
    assert result is lab.session.last and result.run.crashed
    thread = result.thread_id
    ledger = await fetch(harness, "SELECT tool_name FROM tool_executions WHERE thread_id = %s ORDER BY 1", (thread,))
    assert ledger == [("ApplyCredit",), ("CreateCreditMemo",), ("QueueRefund",)]
    assert "ApplyCredit" in lab.table_text("ledger") and "QueueRefund" in lab.table_text("ledger")
    assert lab.table_text("tool messages").count("replayed") == 3
    (customer,) = result.run.episode.customer_ids
    credit = await scalar(harness, "SELECT credit_cents FROM customers WHERE id = %s", (customer,))
    assert str(credit) in lab.table_text("affected rows")
    assert lab.table_text("violations") == "(no violations)"
    assert lab.table_text("outbox") == "(no outbox)"
    assert "0 violations" in lab.status.value
    chart, by_kind = lab.charts.outputs  # the rollback rate and the ledger, then the violations by kind
    assert chart["data"]["image/png"] and chart["data"]["text/plain"].startswith("<lab charts")
    assert by_kind["data"]["image/png"] and by_kind["data"]["text/plain"].startswith("<lab charts")
    assert lab.seed.value == 1  # Run again plays a new episode
    assert set(TAB_TITLES) == {lab.tables.get_title(i) for i in range(len(TAB_TITLES))}


async def test_two_episodes_from_one_click_and_a_shared_session(harness, labs):
    session = LabSession(harness)
    lab = labs(session)
    lab.choose(fault="provider_timeout", preset="full", scenario="invoice", seed=5, episodes=2)
    lab.run_button.click()
    await lab.wait()
    assert [r.seed for r in session.results] == [5, 6]
    threads = [r.thread_id for r in session.results]
    assert await scalar(harness, "SELECT count(*) FROM outbox WHERE thread_id = ANY(%s) AND status = 'dispatched'",
                        (threads,)) == 2
    assert lab.seed.value == 7


async def test_the_scenario_list_follows_the_fault():
    lab = FailureLab(None)
    lab.choose(fault="wrong_order")
    assert lab.scenario.options == ("reorder",) and lab.scenario.value == "reorder"
    assert "wrong_order" in lab.about.value
    with pytest.raises(ValueError, match="fits the scenarios reorder"):
        lab.choose(scenario="refund")
    with pytest.raises(ValueError, match="unknown preset"):
        lab.choose(preset="careful")
    lab.choose(fault="lock_timeout", scenario="batch")
    lab.choose(fault="backend_killed")
    assert lab.scenario.value == "batch"  # kept when the new fault fits it too


async def test_an_error_is_shown_in_the_widget_and_raised_by_wait(harness, labs):
    async with harness.pool.connection() as conn:  # the ledger table is gone: reading it back fails
        await conn.execute("ALTER TABLE tool_executions RENAME TO tool_executions_moved")
    lab = labs()
    lab.choose(fault="none", preset="naive", scenario="refund")
    lab.run_button.click()
    with pytest.raises(Exception, match="tool_executions"):
        await lab.wait()
    assert "UndefinedTable" in lab.status.value
    (shown,) = lab.errors.outputs
    assert shown["name"] == "stderr" and "UndefinedTable" in shown["text"] and "Traceback" in shown["text"]
    assert not lab.run_button.disabled


def test_without_a_running_loop_the_button_says_what_to_do():
    lab = FailureLab(None)
    lab.run_button.click()
    assert isinstance(lab.error, RuntimeError) and lab.task is None
    assert lab.errors.outputs[0]["text"].strip() == NO_LOOP


async def test_a_second_click_while_running_is_refused(harness, labs):
    lab = labs()
    lab.choose(fault="none", preset="full", scenario="refund")
    lab.run_button.click()
    first = lab.task
    lab.run_button.click()
    assert lab.task is first and "still running" in lab.status.value
    await lab.wait()
    await asyncio.sleep(0)
    assert len(lab.session.results) == 1


async def test_the_text_form_of_the_displayed_widget_never_changes(harness, labs):
    lab = labs()
    before = lab._repr_mimebundle_()
    lab.choose(fault="none", preset="full", scenario="invoice")
    lab.run_button.click()
    await lab.wait()
    after = lab._repr_mimebundle_()
    assert before["text/plain"] == after["text/plain"] == "FailureLab(faults=17, presets=7)"
    assert "application/vnd.jupyter.widget-view+json" in after


def _history(*series: tuple[str, str, list[tuple[int, int]]]):
    import pandas as pd

    rows = [{"fault": f, "preset": p, "scenario": "refund", "seed": i, "batches": b, "rollbacks": r, "escalated": False,
             "crashed": False, "violations": 0} for f, p, points in series for i, (b, r) in enumerate(points)]
    return pd.DataFrame(rows)


def test_two_series_at_the_same_rate_are_drawn_apart_and_the_legend_covers_no_point():
    import matplotlib.pyplot as plt

    from agentlab.lab.session import rollback_rate_chart

    fig = rollback_rate_chart(_history(("crash_before_checkpoint", "ledger", [(1, 0), (1, 0)]),
                                       ("backend_killed", "transaction", [(1, 0), (1, 0)]),
                                       ("crash_before_checkpoint", "savepoints", [(3, 3), (3, 3)])))
    fig.canvas.draw()
    ax = fig.axes[0]
    first, second, third = ax.get_lines()
    assert list(first.get_ydata()) == list(second.get_ydata()) == [0.0, 0.0]  # the data stay the exact rates
    y1, y2 = (line.get_transform().transform(line.get_xydata())[:, 1] for line in (first, second))
    assert all(b - a >= 4 for a, b in zip(y1, y2))  # drawn at least 4 px apart: both lines show
    assert ax.transData.transform(third.get_xydata()).tolist() == third.get_transform().transform(
        third.get_xydata()).tolist()  # a line alone at its rate is drawn where it is
    legend, plot = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.x0 >= plot.x1  # beside the plot, over no point
    plt.close(fig)


def test_the_widget_charts_fit_a_1100_px_window_at_projector_size():
    import matplotlib.pyplot as plt

    from agentlab.lab.widget import figure_output
    from agentlab.runtime.notebook import PROJECTOR_STYLE, use_projector_style

    with plt.rc_context():
        use_projector_style()
        fig = lab_charts_for(_history(("crash_before_checkpoint", "ledger", [(1, 0)])))
        sizes = {t.get_fontsize() for ax in fig.axes for t in (ax.title, ax.xaxis.label, ax.yaxis.label,
                                                                *ax.get_xticklabels(), *ax.get_yticklabels())}
        out = figure_output(fig)
    width, height = map(int, out["data"]["text/plain"].strip("<>").split()[-1].split("x"))
    # a notebook's output column in a 1,100 px window (file browser open) is about 700 px: drawn at most
    # that wide, the chart is not scaled down and its text stays at the projector's size (>= 11 pt)
    assert width <= 720 and height <= 720
    assert min(sizes) >= 11 and PROJECTOR_STYLE["font.size"] in sizes


def lab_charts_for(history):
    """lab_charts on a session holding ``history`` (no database needed: the charts read only the results)."""
    from types import SimpleNamespace

    from agentlab.lab.session import lab_charts, sum_ledger_counts

    session = SimpleNamespace(history=lambda: history, last=None)
    fig = lab_charts(session)
    assert sum_ledger_counts([]).empty
    return fig
