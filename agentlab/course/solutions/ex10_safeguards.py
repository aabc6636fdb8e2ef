"""Exercises of notebook 10 (what each safeguard buys)."""

from __future__ import annotations

from agentlab import preset, run_experiment

LEDGER_KINDS = ("unreported_effect", "ledger_mismatch", "half_applied_batch")


async def knockout(h, switch: str, *, episodes: int = 2, seed: int = 0, faults=None):
    """Exercise 10.1: run every fault (or ``faults``) under ``full`` and under ``full`` with one safeguard
    switched off (``switch``: a field of :class:`agentlab.Safeguards` such as ``"outbox"``); return the
    violations per fault (rows) and preset (columns), only the faults where the knocked-out preset has some.

    Raises:
        ValueError: a switch that cannot be off alone (``transaction``: the ledger needs it).
    """
    without = preset("full").replace(**{switch: False}, name=f"full without {switch}")
    result = await run_experiment(episodes, presets=["full", without], faults=faults, seed=seed, url=h.url,
                                  progress=False)
    table = result.summary
    return table[table[without.name] > 0]


async def ledger_without_savepoints(h, *, episodes: int = 3, seed: int = 0):
    """Exercise 10.2: the ledger one rung lower, on ``transaction`` (no savepoints), against ``transaction``
    and ``ledger``, for a crash after the commit and a CHECK violation; return the violations per fault and
    preset, with the kinds the ledger is about (:data:`LEDGER_KINDS`) and all violations."""
    import pandas as pd

    lower = preset("transaction").replace(ledger=True, name="transaction+ledger")
    result = await run_experiment(episodes, presets=["transaction", lower, "ledger"],
                                  faults=["crash_before_checkpoint", "check_violation"], seed=seed, url=h.url,
                                  progress=False)
    kinds = result.by_kind()[list(LEDGER_KINDS)]
    kinds["all violations"] = result.by_kind().sum(axis=1)
    order = pd.MultiIndex.from_product([list(result.faults), list(result.presets)], names=["fault", "preset"])
    return kinds.reindex(order).astype(int)
