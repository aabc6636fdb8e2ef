"""Exercises of notebook 09 (the failure lab)."""

from __future__ import annotations

from agentlab import PRESETS, get_fault, lab_run


async def first_safe_preset(h, fault: str, *, seeds=(0, 1)) -> dict:
    """Exercise 9.1: run ``fault`` under every preset of the ladder for each seed; return the violations
    per preset (``{"violations": {preset: count}}``) and ``safe_from``: the lowest preset from which on
    every preset of the ladder has no violation (None when even ``full`` has some)."""
    violations = {}
    for name in PRESETS:
        violations[name] = 0
        for seed in seeds:
            violations[name] += len((await lab_run(h, preset=name, fault=fault, seed=seed)).violations)
    safe_from = None
    for name in reversed(list(PRESETS)):
        if violations[name]:
            break
        safe_from = name
    return {"violations": violations, "safe_from": safe_from}


async def violations_per_scenario(h, fault: str, preset: str, *, seed: int = 0) -> dict:
    """Exercise 9.2: run ``fault`` under ``preset`` once on every scenario it fits (same seed); return
    ``{scenario: sorted kinds of violation}``."""
    out = {}
    for scenario in get_fault(fault).scenarios:
        result = await lab_run(h, scenario=scenario, preset=preset, fault=fault, seed=seed)
        out[scenario] = sorted(set(result.violations["kind"]))
    return out


async def crash_before_commit(run) -> None:
    """Exercise 9.3: a nemesis of your own, the ``arm`` of a :class:`agentlab.Fault`. The process dies right
    after the batch's third call (index 2) ran, inside the transaction and before its COMMIT; the lab
    resumes the thread in a new process (the fault ``resumes``)."""

    async def die(call, index: int) -> None:
        if index == 2 and not run.notes.get("crashes"):  # once: the resumed process must get through
            raise run.crash("after the batch's last call, before its COMMIT")

    run.node.hooks.after_call.append(die)
