"""The failure lab read from the back of a room (issue 30, item 6): a tool message's line breaks show as line
breaks, not as a literal ``\\n``; and beside the rollback rate, a chart of the violations by kind, because a
rate of 0 % can hide a card charged twice (``provider_timeout`` under ``ledger``)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pandas as pd

from agentlab.lab.charts import violations_chart
from agentlab.lab.session import LabSession
from agentlab.lab.widget import FailureLab, figure_output, frame_output
from agentlab.sim.provider import customer_ref
from conftest import scalar


def test_a_cells_line_breaks_show_as_line_breaks_and_its_markup_stays_text():
    frame = pd.DataFrame({"text": ["FAILED [23514]\nthe credit balance cannot go below zero <b>"], "n": [1]})
    out = frame_output(frame)
    html = out["data"]["text/html"]
    assert "FAILED [23514]<br>the credit balance" in html and "\\n" not in html
    assert "&lt;b&gt;" in html and "<b>" not in html  # the model's text is never markup
    assert out["data"]["text/plain"] == frame.to_string()


def test_a_literal_backslash_n_in_the_arguments_stays_as_sent():
    frame = pd.DataFrame({"args": ['{"note": "a\\\\nb"}']})  # JSON of a note holding a backslash and an n
    assert "a\\\\nb" in frame_output(frame)["data"]["text/html"] and "<br>" not in frame_output(frame)["data"][
        "text/html"]


async def test_provider_timeout_under_ledger_rolls_nothing_back_and_the_chart_shows_its_violations(harness):
    session = LabSession(harness)
    await session.run(fault="none", preset="full", scenario="invoice", seed=0)
    timed_out = await session.run(fault="provider_timeout", preset="ledger", scenario="invoice", seed=0)
    assert timed_out.rolled_back == 0  # the rollback chart shows 0 % for it
    table = session.violations_by_kind()
    assert list(table.index) == ["none · full", "provider_timeout · ledger"]
    assert table.loc["none · full"].sum() == 0
    expected = timed_out.violations["kind"].value_counts().to_dict()
    assert {k: int(v) for k, v in table.loc["provider_timeout · ledger"].items() if v} == expected
    (customer,) = timed_out.run.episode.customer_ids
    charges = await scalar(harness, "SELECT count(*) FROM provider.payments WHERE customer = %s AND kind = 'charge'",
                           (customer_ref(customer),))
    assert charges == 2 and expected.get("payment_count") == 1  # charged twice: what the rate hides

    fig = violations_chart(table)
    ax = fig.axes[0]
    drawn = sum(p.get_width() for p in ax.patches)
    assert drawn == table.to_numpy().sum() == len(timed_out.violations)
    fig.canvas.draw()
    assert ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1  # beside the bars, over none
    width, height = map(int, figure_output(fig)["data"]["text/plain"].strip("<>").split()[-1].split("x"))
    assert width <= 720 and height <= 720


async def test_the_widget_draws_the_violations_chart_after_its_lab_charts(harness):
    lab = FailureLab(harness)
    lab.choose(fault="provider_timeout", preset="ledger", scenario="invoice")
    lab.run_button.click()
    await lab.wait()
    assert [o["data"]["text/plain"] for o in lab.charts.outputs] == ["<lab charts 720x672>", "<lab charts 720x336>"]
    plt.close("all")


def test_an_empty_session_draws_an_empty_chart_that_says_so():
    fig = violations_chart(pd.DataFrame())
    assert [t.get_text() for t in fig.axes[0].texts] == ["run an episode to see its violations"]
    plt.close(fig)
