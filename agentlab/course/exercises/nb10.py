"""Exercises of notebook 10 (what each safeguard buys): one safeguard knocked out of full, the ledger one rung lower."""

from __future__ import annotations

from agentlab.course.exercises import Case, Exercise


def _knocked_out(table) -> dict:
    """What 10.1's table says: its faults in order, and whether full holds each and the knocked-out preset not."""
    without = [c for c in table.columns if c != "full"]
    return {"faults": list(table.index), "full holds them": bool((table["full"] == 0).all()),
            "without the switch each breaks": bool(len(without) == 1 and (table[without[0]] > 0).all())}


def _ledger_table(table) -> dict:
    """10.2's table as the values the statement promises."""
    crash, violated = table.loc["crash_before_checkpoint"], table.loc["check_violation"]
    return {"crash: all violations": {k: int(v) for k, v in crash["all violations"].items()},
            "check: ledger_mismatch": {k: int(v) for k, v in violated["ledger_mismatch"].items()},
            "check: half_applied_batch": {k: int(v) for k, v in violated["half_applied_batch"].items()},
            "check: all violations": {k: int(v) for k, v in violated["all violations"].items()}}


EXERCISES = (
    Exercise(
        id="10.1", title="Knock one safeguard out of full", function="knockout",
        solution="agentlab.course.solutions.ex10_safeguards:knockout",
        cases=(
            Case(args=("outbox",), read=_knocked_out, expected={
                "faults": ["fk_violation", "provider_timeout", "worker_crash", "provider_forgot_key"],
                "full holds them": True, "without the switch each breaks": True}),
            Case(args=("isolation",), read=_knocked_out, expected={
                "faults": ["other_tenant_id"], "full holds them": True, "without the switch each breaks": True}),
            Case(args=("ledger",), read=_knocked_out, expected={
                "faults": ["crash_before_checkpoint"], "full holds them": True,
                "without the switch each breaks": True}),
        ),
        hints={
            "faults": "keep the rows of result.summary (faults x presets) whose knocked-out column is above 0, in "
                      "the summary's order",
            "full holds them": "run both presets in one run_experiment(episodes, presets=['full', without], "
                               "seed=seed, url=h.url, progress=False)",
            "without the switch each breaks": "return the summary with its two columns, full and "
                                              "f'full without {switch}', filtered to the rows that break",
            "*": "without = preset('full').replace(**{switch: False}, name=f'full without {switch}')",
        },
    ),
    Exercise(
        id="10.2", title="The ledger one rung lower", function="ledger_without_savepoints",
        solution="agentlab.course.solutions.ex10_safeguards:ledger_without_savepoints",
        cases=(
            Case(read=_ledger_table, expected={
                "crash: all violations": {"transaction": 17, "transaction+ledger": 0, "ledger": 0},
                "check: ledger_mismatch": {"transaction": 0, "transaction+ledger": 3, "ledger": 0},
                "check: half_applied_batch": {"transaction": 4, "transaction+ledger": 4, "ledger": 0},
                "check: all violations": {"transaction": 14, "transaction+ledger": 17, "ledger": 3}}),
        ),
        hints={
            "crash: all violations": "run_experiment(3, presets=['transaction', lower, 'ledger'], faults=["
                                     "'crash_before_checkpoint', 'check_violation'], seed=0, url=h.url); "
                                     "result.by_kind().sum(axis=1)",
            "check: ledger_mismatch": "the columns of result.by_kind() are the kinds; index (fault, preset)",
            "*": "return a DataFrame indexed by (fault, preset) with the columns unreported_effect, "
                 "ledger_mismatch, half_applied_batch and 'all violations'",
        },
    ),
)
