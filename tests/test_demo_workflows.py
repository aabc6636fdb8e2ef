"""``python -m agentlab demo --scenario saga | approval --json``: the final state, read back from the database."""

from __future__ import annotations

import json

from agentlab.__main__ import main


def run_cli(capsys, *args: str) -> dict:
    assert main(["demo", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_saga_demo_reports_the_three_recoveries(capsys):
    rep = run_cli(capsys, "--scenario", "saga")
    stories = {r["story"]: r for r in rep["runs"]}
    assert stories["forward recovery"]["status"] == "completed"
    assert [s["attempts"] for s in stories["forward recovery"]["steps"]] == [1, 1, 1, 2]
    assert stories["backward recovery"]["compensations"] == [3, 2, 1]
    assert stories["escalation"]["status"] == "parked" and len(stories["escalation"]["compensation_needed"]) == 1
    assert (rep["steps_done"], rep["compensations_run"], rep["escalations"]) == (10, 5, 1)
    assert rep["model_calls"] == 3
    assert rep["notifications"] == {"sent": 3, "corrections": 2}
    assert (rep["charges"], rep["refunds"]) == (0, 1)
    assert [r["credit_cents"]["final"] for r in rep["runs"]] == [2000, 5000, 2000]


def test_approval_demo_charges_once_after_three_days(capsys):
    rep = run_cli(capsys, "--scenario", "approval")
    assert rep["approval"]["requests"] == 1 and rep["approval"]["decisions"] == ["reject", "approve"]
    assert rep["approval"]["days_later"] == 3
    assert (rep["refunds"], rep["provider_refunds"], rep["charges"]) == (1, 1, 0)
    assert rep["tool_messages"] == rep["tool_calls"] == 2 and rep["unanswered_tool_calls"] == 0
    outcomes = [c["outcome"] for c in rep["steps"][0]["calls"]]
    assert outcomes == ["failed", "applied"]


def test_the_text_reports_render(capsys):
    assert main(["demo", "--scenario", "saga"]) == 0
    out = capsys.readouterr().out
    assert "compensations ran for steps 3, 2, 1 (in that order)" in out
    assert "compensation needed: step 1 (hold_credit)" in out
