"""What an experiment produced: its rows, the fault x preset table, what each safeguard buys, and its text.

:func:`agentlab.lab.experiments.run_experiment` runs the episodes; each checked episode becomes one row
(:func:`row`, columns :data:`ROW_COLUMNS`: the preset, fault, scenario, episode number and seed, the
rollbacks, whether it escalated or crashed, its error, its violations in all and per kind (:data:`KINDS`,
then any kind a domain's own invariants add), and its wall milliseconds), and an episode the lab could not run
a row with its error (:func:`lab_error_row`). :class:`ExperimentResult` holds the rows (a pandas DataFrame) and
the run's size and speed; :func:`summarize` is its fault x preset table of summed violations and
:func:`safeguard_effects` the cells each rung of the ladder (:data:`LADDER`) takes from some violations to none;
:func:`render` is the ``chaos`` command's text of a result.

Sources: pandas ("pivot_table", "groupby").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentlab.core.safeguards import PRESETS
from agentlab.lab.faults import FAULTS
from agentlab.lab.invariants import KINDS, count_by_kind

if TYPE_CHECKING:
    import pandas as pd

    from agentlab.lab.runner import FaultRun

ROW_COLUMNS = ("preset", "fault", "scenario", "episode", "seed", "rollbacks", "escalated", "crashed", "error",
               "violations", *KINDS, "wall_ms")
LADDER = tuple(PRESETS)  # naive ... full: each rung adds one safeguard
# the words in Fault.guarded_by that name what each rung adds (to list its own faults first)
RUNG_GUARDS = {"constraints": ("constraints",), "validated": ("validation",), "transaction": ("transaction",),
               "savepoints": ("savepoints",), "ledger": ("ledger",), "full": ("outbox", "timeouts")}


def kinds_of(rows: pd.DataFrame) -> list[str]:
    """The violation kinds ``rows`` count: :data:`KINDS`, then any a domain's own invariants added."""
    return [*KINDS, *(c for c in rows.columns if c not in ROW_COLUMNS)]


def row(run: FaultRun, episode: int) -> dict[str, Any]:
    """One DataFrame row for a checked episode."""
    ep = run.episode
    kinds = count_by_kind(run.violations)
    kinds.update(Counter(v.kind for v in run.violations if v.kind not in kinds))  # a domain's own kinds
    return {"preset": run.preset, "fault": run.fault, "scenario": run.scenario.name, "episode": episode,
            "seed": ep.seed, "rollbacks": ep.rollbacks_total, "escalated": ep.escalated, "crashed": run.crashed,
            "error": ep.error, "violations": len(run.violations), **kinds, "wall_ms": round(ep.wall_ms, 3)}


def lab_error_row(fault: str, preset_name: str, episode: int, seed: int, exc: BaseException) -> dict[str, Any]:
    """The row of an episode the lab could not run or check (its error column says why)."""
    return {"preset": preset_name, "fault": fault, "scenario": None, "episode": episode, "seed": seed,
            "rollbacks": 0, "escalated": False, "crashed": False, "error": f"lab error: {type(exc).__name__}: {exc}",
            "violations": 0, **dict.fromkeys(KINDS, 0), "wall_ms": 0.0}


@dataclass
class ExperimentResult:
    """What an experiment produced. ``rows``: one per episode (:data:`ROW_COLUMNS`); ``wall_s``: seconds
    from the first episode to the last; ``cpu_s``: CPU seconds of the processes that ran the episodes, over
    the same span; ``workers``: how many processes ran them."""

    rows: pd.DataFrame
    wall_s: float
    seed: int
    episodes_per_cell: int
    presets: tuple[str, ...]
    faults: tuple[str, ...]
    cpu_s: float = 0.0
    workers: int = 1

    @property
    def episodes(self) -> int:
        return len(self.rows)

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / self.wall_s if self.wall_s else 0.0

    @property
    def summary(self) -> pd.DataFrame:
        """Violations summed per fault (rows) and preset (columns), in catalog and ladder order."""
        return summarize(self.rows, self.presets, self.faults)

    def summary_of(self, kinds: Iterable[str]) -> pd.DataFrame:
        """As :attr:`summary`, counting only ``kinds`` (e.g. :data:`agentlab.lab.invariants.STATE_KINDS`)."""
        return summarize(self.rows, self.presets, self.faults, kinds=kinds)

    def by_kind(self) -> pd.DataFrame:
        """Violations per (fault, preset) and kind."""
        return self.rows.groupby(["fault", "preset"], sort=False)[kinds_of(self.rows)].sum()

    def safeguard_effects(self) -> pd.DataFrame:
        """What each safeguard buys: for every rung of the ladder, the (fault, kind) cells where the preset
        just below has violations and the rung has none."""
        return safeguard_effects(self.rows, self.presets)

    def deterministic_view(self) -> pd.DataFrame:
        """The rows without what may vary between identical runs, to compare two runs: wall times, and the
        rollback counts (on a loaded machine a lock or statement timeout can take one more retry)."""
        return self.rows.drop(columns=["wall_ms", "rollbacks"]).reset_index(drop=True)

    def to_json(self) -> dict[str, Any]:
        """The CLI's JSON: ``episodes`` (run in all), ``episodes_per_cell``, ``wall_s``, ``episodes_per_s``,
        ``workers``, ``seed``, ``summary`` (``{preset: {fault: violations}}``) and ``rows`` (one object per episode)."""
        summary = self.summary
        return {
            "episodes": self.episodes,
            "episodes_per_cell": self.episodes_per_cell,
            "wall_s": round(self.wall_s, 3),
            "episodes_per_s": round(self.episodes_per_s, 1),
            "workers": self.workers,
            "seed": self.seed,
            "summary": {p: {f: int(summary.loc[f, p]) for f in summary.index} for p in summary.columns},
            "rows": [{k: _plain(v) for k, v in r.items()} for r in self.rows.to_dict(orient="records")],
        }


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, float) and value != value:  # NaN
        return None
    return value


def summarize(rows: pd.DataFrame, presets: Sequence[str] | None = None, faults: Sequence[str] | None = None,
              *, kinds: Iterable[str] | None = None) -> pd.DataFrame:
    """The fault x preset table of summed violations (zeros where nothing broke); only ``kinds`` when given."""
    presets = list(presets or dict.fromkeys(rows["preset"]))
    faults = list(faults or dict.fromkeys(rows["fault"]))
    if kinds is not None:
        rows = rows.assign(violations=rows[list(kinds)].sum(axis=1))
    table = rows.pivot_table(index="fault", columns="preset", values="violations", aggfunc="sum", fill_value=0)
    table = table.reindex(index=faults, columns=presets, fill_value=0).astype(int)
    table.index.name, table.columns.name = "fault", "preset"
    return table


def safeguard_effects(rows: pd.DataFrame, presets: Sequence[str] | None = None) -> pd.DataFrame:
    """For each adjacent pair of ``presets`` (a ladder), the (fault, kind) cells that go from some
    violations below to none at the rung. Columns: safeguard (the rung), fault, kind, below, at."""
    presets = list(presets or dict.fromkeys(rows["preset"]))
    kinds = kinds_of(rows)
    sums = rows.groupby(["preset", "fault"])[kinds].sum()
    out = []
    for lower, upper in zip(presets, presets[1:]):
        cells = []
        for fault in dict.fromkeys(rows["fault"]):
            if (lower, fault) not in sums.index or (upper, fault) not in sums.index:
                continue
            meant = any(w in FAULTS[fault].guarded_by for w in RUNG_GUARDS.get(upper, ())) if fault in FAULTS else False
            for kind in kinds:
                below, at = int(sums.loc[(lower, fault), kind]), int(sums.loc[(upper, fault), kind])
                if below > 0 and at == 0:
                    cells.append((not meant, {"safeguard": upper, "fault": fault, "kind": kind, "below": below,
                                              "at": at}))
        out += [c for _, c in sorted(cells, key=lambda c: c[0])]  # the faults the rung is meant for first
    import pandas as pd

    return pd.DataFrame(out, columns=["safeguard", "fault", "kind", "below", "at"])


def render(result: ExperimentResult) -> str:
    """The CLI's text: the fault x preset table, what each safeguard buys, and the run's speed."""
    lines = [f"Invariant violations per fault (rows) and preset (columns): {result.episodes_per_cell} episode(s) "
             f"per cell, seed {result.seed}", "", result.summary.to_string(), ""]
    effects = result.safeguard_effects()
    if len(effects):
        lines.append("What each safeguard buys (violations just below it -> 0 with it):")
        for rung, part in effects.groupby("safeguard", sort=False):
            cells = [f"{r.fault}/{r.kind} {r.below}" for r in part.itertuples()][:4]
            more = f" (+{len(part) - 4} more)" if len(part) > 4 else ""
            lines.append(f"  {rung:<12} {', '.join(cells)}{more}")
        lines.append("")
    errors = int(result.rows["error"].notna().sum())
    lines.append(f"{result.episodes} episodes in {result.wall_s:.2f} s ({result.episodes_per_s:.1f} episodes/s, "
                 f"{result.cpu_s / max(result.episodes, 1) * 1000:.1f} ms of the lab's CPU per episode"
                 + (f", {result.workers} worker processes)" if result.workers > 1 else ")")
                 + (f"; {errors} episode(s) ended on an error" if errors else ""))
    return "\n".join(lines)

