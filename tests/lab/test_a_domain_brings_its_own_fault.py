"""A domain brings its own fault beside its own invariant, and gets the treatment billing gets: the fault
table lists it, the chaos experiment runs it on the domain's scenarios through the lab's one runner, and the
checker reports the domain's invariant kind for it."""

from __future__ import annotations

import dataclasses
import random

import pytest
from test_domain_api import WALLETS

from agentlab import DomainError, fault_table, get_fault, run_experiment
from agentlab.core.domain import Fault
from agentlab.lab.faults import faults_for, injected_by_script


@dataclasses.dataclass(frozen=True)
class NegativeWithdrawal(Fault):
    """The model sends a withdrawal's amount negated (an LLM's sign slip): without validation the wallet
    grows; the strict argument model refuses it and the model sends the right amount."""

    def prepare(self, scenario, rng: random.Random):
        step, index, call = rng.choice([(s, k, c) for s, k, c in scenario.calls() if c.tool == "Withdraw"])
        return scenario.with_call(step, index, args={**call.args, "amount_cents": -call.args["amount_cents"]},
                                  fix=dict(call.args))


SIGN_SLIP = NegativeWithdrawal("negative_withdrawal", "hallucinated_argument", "a withdrawal sent negated",
                               "validation")
WALLETS_WITH_FAULT = dataclasses.replace(WALLETS, faults=("crash_before_checkpoint", SIGN_SLIP))


def test_the_fault_table_lists_the_domains_own_fault_with_the_domains_scenarios():
    rows = {r["fault"]: r for r in fault_table(WALLETS_WITH_FAULT)}
    assert set(rows) == {"none", "backend_killed", "crash_before_checkpoint", "crash_mid_node", "negative_withdrawal"}
    assert rows["negative_withdrawal"] == {"fault": "negative_withdrawal", "family": "hallucinated_argument",
                                           "title": "a withdrawal sent negated", "guarded_by": "validation",
                                           "scenarios": "pay"}
    assert get_fault("negative_withdrawal", WALLETS_WITH_FAULT) is SIGN_SLIP
    assert injected_by_script(SIGN_SLIP) and "negative_withdrawal" in faults_for(WALLETS_WITH_FAULT)
    with pytest.raises(ValueError, match="unknown fault 'negative_withdrawal'"):
        get_fault("negative_withdrawal")  # another domain's fault is not the catalog's


async def test_the_domains_own_fault_runs_through_the_lab_and_its_invariant_reports_it():
    result = await run_experiment(2, ["validated", "naive", "full"], ["negative_withdrawal"], seed=0, progress=False,
                                  domain=WALLETS_WITH_FAULT)
    by_preset = result.rows.groupby("preset")["wallet_balance"].sum()
    assert set(result.rows["fault"]) == {"negative_withdrawal"}
    assert by_preset["naive"] == 2, "without validation the negated withdrawal grows each episode's wallet"
    assert by_preset["validated"] == 0 and by_preset["full"] == 0
    assert result.rows.query("preset == 'full'")["violations"].sum() == 0


@pytest.mark.parametrize("faults, says", [
    (("none", "none"), "distinct names"),
    ((dataclasses.replace(SIGN_SLIP, scenarios=("refund",)),), "names scenarios it does not have (refund)"),
    ((SIGN_SLIP, dataclasses.replace(SIGN_SLIP, title="again")), "distinct names"),
])
def test_a_domain_with_clashing_or_misplaced_faults_is_refused(faults, says):
    with pytest.raises(DomainError, match=says.replace("(", r"\(").replace(")", r"\)")):
        dataclasses.replace(WALLETS, faults=faults)
