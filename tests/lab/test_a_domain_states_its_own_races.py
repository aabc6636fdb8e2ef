"""A domain hands the lab its races as a value (``Domain.races``); the lab never asks for it by name."""

from __future__ import annotations

import dataclasses

import pytest

from agentlab.core.errors import DomainError
from agentlab.core.races import Races
from agentlab.domains.retail import DOMAIN as RETAIL
from agentlab.lab.faults import domain_races, fault_scenarios, get_fault
from agentlab.runtime.domains import resolve_domain


async def no_rows(conn):
    return None


async def nothing_broken(conn, rows):
    return []


def test_a_renamed_domain_keeps_its_races():
    renamed = dataclasses.replace(RETAIL, name="shop")
    assert fault_scenarios(get_fault("lost_update"), renamed) == RETAIL.races.by_fault["lost_update"]
    with pytest.raises(ValueError, match="does not apply to domain 'shop'"):
        domain_races(renamed, "write_skew")


def test_a_domain_without_races_plays_the_default_ones():
    billing = resolve_domain("billing")
    assert billing.races is None
    assert fault_scenarios(get_fault("lost_update"), billing) == ("redeem",)
    with pytest.raises(ValueError, match="no races of its own"):
        domain_races(billing, "lost_update")


def test_races_name_what_they_lack():
    races = Races(by_fault={"lost_update": ("one",)}, create=no_rows, scenarios=lambda race, rows: (None, None),
                  check=nothing_broken)
    assert races.names("lost_update") == ("one",)
    with pytest.raises(ValueError, match="no race for fault 'write_skew'"):
        races.names("write_skew", "toy")
    with pytest.raises(DomainError, match="races must be"):
        dataclasses.replace(RETAIL, races={"lost_update": ("one",)})
