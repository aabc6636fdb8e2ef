"""A domain hands the lab its races as a value (``Domain.races``); the lab never asks for it by name."""

from __future__ import annotations

import dataclasses

import pytest

from agentlab.core.errors import DomainError
from agentlab.core.races import Races
from agentlab.core.safeguards import preset
from agentlab.domains.billing import DOMAIN as BILLING
from agentlab.domains.billing.concurrency import CONCURRENCY as BILLING_RACES
from agentlab.domains.retail import DOMAIN as RETAIL
from agentlab.lab.faults import domain_races, fault_scenarios, get_fault
from agentlab.lab.runner import Lab
from agentlab.runtime.harness import Harness
from conftest import fetch, scalar

NO_LOCKS = preset("full").replace(row_locks=False, name="full-no-row-locks")


async def no_rows(conn, episode):
    return None


async def nothing_broken(conn, rows):
    return []


def test_a_renamed_domain_keeps_its_races():
    renamed = dataclasses.replace(RETAIL, name="shop")
    assert fault_scenarios(get_fault("lost_update"), renamed) == RETAIL.races.by_fault["lost_update"]
    with pytest.raises(ValueError, match="does not apply to domain 'shop'"):
        domain_races(renamed, "write_skew")


def test_billing_states_its_races_and_a_domain_without_races_has_none_to_play():
    assert BILLING.races is BILLING_RACES and BILLING_RACES.union and not RETAIL.races.union
    assert fault_scenarios(get_fault("lost_update"), BILLING) == ("redeem",)
    assert fault_scenarios(get_fault("write_skew"), BILLING) == ("capped_refund",)
    without = dataclasses.replace(BILLING, name="plain", races=None)
    with pytest.raises(ValueError, match="'plain' states no races"):
        fault_scenarios(get_fault("lost_update"), without)


async def test_billing_races_are_played_through_domain_races_and_checked_from_the_database(database_url):
    """A billing domain whose races' check is wrapped: the one runner creates the rows, plays the race and
    checks it through ``Domain.races``; the violations are what the database holds."""
    seen = []

    async def watched_check(conn, rows):
        found = await BILLING_RACES.check(conn, rows)
        seen.append((rows.ids, found))
        return found

    domain = dataclasses.replace(BILLING, races=dataclasses.replace(BILLING_RACES, check=watched_check))
    h = await Harness.open(database_url, domain=domain)
    try:
        async with Lab(h) as lab:
            run = await lab.run("lost_update", NO_LOCKS, seed=0)
        (cid,) = run.episode.customer_ids
        credit = await scalar(h, "SELECT credit_cents FROM customers WHERE id = %s", (cid,))
        redeemed = [a for a, in await fetch(h, "SELECT amount_cents FROM limits.credit_redemptions "
                                               "WHERE customer_id = %s ORDER BY amount_cents", (cid,))]
    finally:
        await h.close()
    assert redeemed == [1500, 2000] and credit in (3000, 3500)  # both applied, one deduction lost
    assert [ids for ids, _ in seen] == [[cid]]  # the domain's check ran once, on the episode's own customer
    assert run.notes["race"] == "redeem" and run.scenario.intended.final_credit_cents == (1500,)
    by_kind = {v.kind: v.detail for v in run.violations}
    assert set(by_kind) == {"lost_update", "balance_mismatch"}, run.violations
    assert by_kind["lost_update"] == (f"customer {cid}: balance {credit} cents, opening 5000 minus 2 redemption(s) "
                                      "of 3500 is 1500")
    assert by_kind["balance_mismatch"] == f"customer {cid}: balance {credit} cents, intended 1500"


def test_races_name_what_they_lack():
    races = Races(by_fault={"lost_update": ("one",)}, create=no_rows, scenarios=lambda race, rows: (None, None),
                  check=nothing_broken)
    assert races.names("lost_update") == ("one",)
    with pytest.raises(ValueError, match="no race for fault 'write_skew'"):
        races.names("write_skew", "toy")
    with pytest.raises(DomainError, match="races must be"):
        dataclasses.replace(RETAIL, races={"lost_update": ("one",)})
