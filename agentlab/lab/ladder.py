"""What each safeguard buys, rung by rung: an experiment's result read along the preset ladder.

The presets ``naive`` ... ``full`` form a ladder, each rung adding one safeguard
(:mod:`agentlab.core.safeguards`). Given an :class:`agentlab.lab.experiment_results.ExperimentResult` over the
ladder, :func:`rung_table` gives one row per rung (violations in all, the faults it holds from
there on, the kinds of violation that disappear with it, the (fault, kind) cells it brings to
zero) and :func:`ladder_chart` draws the violations per rung, split into what the database holds
(state), what the model was told against what happened (report) and the messages themselves::

    result = await run_experiment(1, faults=["wrong_type", "crash_before_checkpoint", "provider_timeout",
                                              "wrong_order"], seed=0)   # every preset: the whole ladder
    rung_table(result)
    ladder_chart(result)

Every count is the invariant checker's, read from the database, the provider and the messages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentlab.lab.invariants import KINDS, MESSAGE_KINDS, REPORT_KINDS, STATE_KINDS

if TYPE_CHECKING:
    import pandas as pd

RUNG_COLUMNS = ("adds", "violations", "faults_with_violations", "faults_held_from_here", "kinds_gone",
                "cells_fixed")
GROUPS = {"state (database, provider)": STATE_KINDS, "report (told vs happened)": REPORT_KINDS,
          "messages (unanswered, leaks)": MESSAGE_KINDS}
ADDS = {"naive": "(nothing: the first draft)", "constraints": "CHECK, UNIQUE, FOREIGN KEY",
        "validated": "strict argument models", "transaction": "one transaction per batch",
        "savepoints": "a savepoint per call", "ledger": "the idempotency ledger",
        "full": "outbox, sanitized errors, lock, timeouts, tenant isolation"}


def rung_table(result) -> pd.DataFrame:
    """One row per preset of ``result`` (in its order, a ladder), with :data:`RUNG_COLUMNS`:

    - ``adds``: what the rung adds to the one below;
    - ``violations``: all violations of the rung's episodes;
    - ``faults_with_violations``: how many faults still break something at this rung;
    - ``faults_held_from_here``: faults with violations on the rung below and none on this rung or any above;
    - ``kinds_gone``: kinds of violation present on the rung below (any fault) and absent here;
    - ``cells_fixed``: (fault, kind) cells with violations below and none here
      (:meth:`agentlab.lab.experiment_results.ExperimentResult.safeguard_effects`).
    """
    import pandas as pd

    presets = list(result.presets)
    rows = result.rows
    per_fault = result.summary  # fault x preset
    per_kind = rows.groupby("preset")[list(KINDS)].sum().reindex(presets, fill_value=0)
    effects = result.safeguard_effects()
    out = []
    for n, p in enumerate(presets):
        below = presets[n - 1] if n else None
        broken = per_fault[p] > 0
        held = []
        if below is not None:
            held = [f for f in per_fault.index
                    if per_fault.loc[f, below] > 0 and all(per_fault.loc[f, q] == 0 for q in presets[n:])]
        gone = [k for k in KINDS if below is not None and per_kind.loc[below, k] > 0 and per_kind.loc[p, k] == 0]
        out.append({"preset": p, "adds": ADDS.get(p, "custom"), "violations": int(per_fault[p].sum()),
                    "faults_with_violations": int(broken.sum()), "faults_held_from_here": ", ".join(held),
                    "kinds_gone": ", ".join(gone), "cells_fixed": int((effects["safeguard"] == p).sum())})
    return pd.DataFrame(out, columns=["preset", *RUNG_COLUMNS]).set_index("preset")


def by_group(result) -> pd.DataFrame:
    """Violations per preset (rows, in ``result``'s order) and group of kinds (columns: :data:`GROUPS`)."""
    import pandas as pd

    sums = result.rows.groupby("preset")[list(KINDS)].sum().reindex(list(result.presets), fill_value=0)
    return pd.DataFrame({g: sums[list(kinds)].sum(axis=1) for g, kinds in GROUPS.items()}).astype(int)


def ladder_chart(result, *, ax=None):
    """Violations per rung of the ladder, stacked by group of kinds; return the matplotlib Figure."""
    import matplotlib.pyplot as plt

    groups = by_group(result)
    if ax is None:
        fig, ax = plt.subplots(figsize=(11, 5))
    else:
        fig = ax.figure
    bottom = [0] * len(groups)
    colors = ("tab:red", "tab:orange", "tab:purple")
    for (name, values), color in zip(groups.items(), colors):
        ax.bar(list(groups.index), list(values), bottom=bottom, color=color, label=name)
        bottom = [b + int(v) for b, v in zip(bottom, values)]
    for x, total in enumerate(bottom):
        ax.text(x, total, f"{total:,}", ha="center", va="bottom")
    ax.set_ylim(0, max([1, *bottom]) * 1.15)
    ax.set_xlabel("preset (each adds one safeguard to the one on its left)")
    ax.set_ylabel("invariant violations (count)")
    ax.set_title(f"What each safeguard buys: {result.episodes_per_cell} episode(s) per fault and preset, "
                 f"{len(result.faults)} faults, seed {result.seed}")
    ax.legend(loc="upper right")
    fig.tight_layout()
    return fig

