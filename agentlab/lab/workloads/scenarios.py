"""A domain's scenarios as the lab's workload: for one episode, the scenario the seed chooses among those the
fault fits (:func:`agentlab.lab.faults.fault_scenarios`), prepared by the fault, and the user's message.

Every client gets the same episode for one seed and fault: ``Lab.run`` and ``Yardstick.run`` both choose here.
"""

from __future__ import annotations

import random
from typing import Any

from agentlab.lab.faults import fault_scenarios
from agentlab.lab.loop import Workload


def choose(harness, fault, *, seed: int, scenario: Any = None, name: str | None = None) -> tuple[Any, random.Random]:
    """``(scenario, rng)``: ``scenario`` as given (a name or a value), else one of the fault's scenarios of
    ``harness.domain`` chosen by ``rng``, the episode's generator seeded by ``seed`` and the fault's name
    (``name``, default ``fault.name``); the fault prepares the scenario with the same ``rng``.

    Raises:
        ValueError: the fault does not fit the domain.
    """
    rng = random.Random(f"{seed}:{name or fault.name}")
    if scenario is None:
        scenario = rng.choice(fault_scenarios(fault, harness.domain))
    return scenario, rng


def prepared(harness, fault, scenario: Any, rng: random.Random) -> Any:
    """The domain's ``scenario`` (a name or a value), clean, then prepared by ``fault`` (:meth:`Fault.prepare`).

    Raises:
        ValueError: an unknown scenario name.
    """
    return fault.prepare(harness.scenario(scenario).clean(), rng)


def workload(scenario: Any, prompt: str) -> Workload:
    """The loop's :class:`agentlab.lab.loop.Workload` of a prepared scenario and the user's message."""
    return Workload(scenario, prompt)
