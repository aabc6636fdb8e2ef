"""The failure lab shares an experiment out to worker processes for any domain a worker can import again by
its reference (a built-in name, ``package.module:NAME``), not for billing only; a domain made in place (a
notebook's, a ``dataclasses.replace`` copy) runs in one process, as a worker could not find it."""

from __future__ import annotations

import dataclasses

import pytest

from agentlab import run_experiment
from agentlab.domains.billing import DOMAIN as BILLING
from agentlab.runtime.domains import domain_reference, resolve_domain


def test_a_domain_reference_names_what_a_worker_can_import():
    assert domain_reference(BILLING) == "billing"
    assert domain_reference(resolve_domain("retail")) == "retail"
    assert domain_reference(resolve_domain("examples.payouts:DOMAIN")) == "examples.payouts:DOMAIN"
    assert domain_reference(dataclasses.replace(BILLING, name="copy")) is None


@pytest.mark.slow
async def test_an_imported_domain_runs_in_two_workers_with_the_rows_one_process_gives():
    domain = resolve_domain("examples.payouts:DOMAIN")
    args = dict(episodes=2, presets=["naive", "full"], faults=["none", "crash_mid_node"], seed=3, progress=False)
    one = await run_experiment(**args, domain=domain)
    two = await run_experiment(**args, domain=domain, workers=2)
    assert (one.workers, two.workers) == (1, 2)
    assert two.summary.equals(one.summary), (one.summary, two.summary)
    key = ["preset", "fault", "episode"]
    cols = [c for c in one.rows.columns if c in ("violations", "scenario", *key)]
    assert (two.rows[cols].sort_values(key).reset_index(drop=True)
            .equals(one.rows[cols].sort_values(key).reset_index(drop=True)))


async def test_a_domain_made_in_place_runs_in_one_process():
    copy = dataclasses.replace(BILLING, name="copy")
    result = await run_experiment(1, ["full"], ["none"], seed=0, progress=False, domain=copy, workers=2)
    assert result.workers == 1
