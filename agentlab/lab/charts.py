"""Charts the CLI and the notebooks share (matplotlib).

:func:`heatmap` draws any table of counts (the fault x preset summary of an experiment, or its
violations by kind) as a labelled heatmap with the number in every cell; :func:`save` writes a
figure to a PNG. Nothing here opens a window: the CLI uses the ``Agg`` backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

HELD = "#e8f5e9"  # a cell with no violation
MARKERS, LINESTYLES = ("o", "s", "^", "D", "v", "P"), ("-", "--", "-.", ":")  # lines at the same rate stay apart
SAME_RATE_OFFSET_PT = 4  # rollback_rate_chart: a series on the same points as an earlier one is drawn this much higher


def heatmap(table: pd.DataFrame, *, ax=None, title: str | None = None, xlabel: str = "preset (each adds one safeguard)",
            ylabel: str = "fault", cbar_label: str = "invariant violations (count)"):
    """Draw ``table`` (rows x columns of counts) as a heatmap; return the matplotlib Figure.

    Zero cells are pale green with a ``0``; others go from light to dark red on a square-root scale
    (a few violations stay visible next to thousands).
    """
    import matplotlib.pyplot as plt
    import pandas as pd
    from matplotlib.colors import PowerNorm

    values = table.to_numpy(dtype=float)
    if ax is None:
        fig, ax = plt.subplots(figsize=(1.15 * len(table.columns) + 3.2, 0.42 * len(table.index) + 1.8))
    else:
        fig = ax.figure
    vmax = max(1.0, float(values.max()) if values.size else 1.0)
    cmap = plt.get_cmap("Reds").with_extremes(under=HELD)
    image = ax.imshow(values, cmap=cmap, norm=PowerNorm(0.5, vmin=0.5, vmax=vmax), aspect="auto")
    ax.set_xticks(range(len(table.columns)), labels=[str(c) for c in table.columns], rotation=30, ha="right")
    ax.set_yticks(range(len(table.index)), labels=[str(i) for i in table.index])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    for (r, c), v in pd.DataFrame(values).stack().items():
        dark = v > 0 and (v / vmax) ** 0.5 > 0.6
        ax.text(c, r, f"{int(v)}", ha="center", va="center", fontsize=10, color="white" if dark else "black")
    ax.set_xticks([x - 0.5 for x in range(1, len(table.columns))], minor=True)
    ax.set_yticks([y - 0.5 for y in range(1, len(table.index))], minor=True)
    ax.grid(which="major", visible=False)  # a style's grid would cross every cell
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    bar = fig.colorbar(image, ax=ax, extend="min")
    bar.set_label(cbar_label)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def experiment_heatmap(result, *, ax=None):
    """The fault x preset heatmap of an :class:`agentlab.lab.experiment_results.ExperimentResult`, titled with its size."""
    title = (f"Invariant violations: {result.episodes_per_cell} episode(s) per cell, seed {result.seed}")
    return heatmap(result.summary, ax=ax, title=title)


def save(fig, path: str | Path, *, dpi: int = 150) -> Path:
    """Write ``fig`` as a PNG to ``path``; return the path."""
    path = Path(path)
    fig.savefig(path, dpi=dpi, format="png")
    return path


def rollback_rates(history: pd.DataFrame) -> pd.DataFrame:
    """The rollback rate of each (fault, preset) over its episodes: one row per episode of the history
    with ``series`` ("fault · preset"), ``n`` (its episode number within the series) and ``rate_pct``
    (rolled-back batches per 100 batches, cumulative over the series' episodes so far)."""
    import pandas as pd

    if not len(history):
        return pd.DataFrame(columns=["series", "n", "rate_pct"])
    h = history.assign(series=history["fault"] + " · " + history["preset"])
    g = h.groupby("series", sort=False)
    out = h.assign(n=g.cumcount() + 1, cum_rollbacks=g["rollbacks"].cumsum(), cum_batches=g["batches"].cumsum())
    out["rate_pct"] = (100 * out["cum_rollbacks"] / out["cum_batches"].where(out["cum_batches"] > 0)).fillna(0.0)
    return out[["series", "n", "rate_pct"]].reset_index(drop=True)


def rollback_rate_chart(history: pd.DataFrame, *, ax=None):
    """Rolled-back batches per 100 batches for each fault and preset, over its episodes; return the Figure.

    A series with the same rates as one drawn before it (two presets at 0 %) is drawn a few points higher,
    so both lines show; the plotted data stay the exact rates. The legend sits outside the plot, right of
    it, where it covers no point."""
    import matplotlib.pyplot as plt
    from matplotlib.transforms import offset_copy

    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 4.8))
    else:
        fig = ax.figure
    rates = rollback_rates(history)
    drawn: dict[tuple, int] = {}  # a series' points -> how many series already lie on them
    for k, (series, part) in enumerate(rates.groupby("series", sort=False)):
        points = tuple(zip(part["n"], part["rate_pct"].round(6)))
        same = sum(n for pts, n in drawn.items() if set(points) <= set(pts))
        drawn[points] = drawn.get(points, 0) + 1
        (line,) = ax.plot(part["n"], part["rate_pct"], marker=MARKERS[k % len(MARKERS)], markersize=8, linewidth=2,
                          linestyle=LINESTYLES[k % len(LINESTYLES)], label=series)
        if same:  # after plot(), so the axes' limits still come from the data
            line.set_transform(offset_copy(ax.transData, fig=fig, y=SAME_RATE_OFFSET_PT * same, units="points"))
    ax.set_xlabel("episode of this fault and preset (count)")
    ax.set_ylabel("rolled-back batches (% of batches)")
    ax.set_ylim(-5, 105)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title("Rollback rate per fault, over episodes")
    if len(rates):
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0, fontsize=11)
    else:
        ax.text(0.5, 0.5, "no episode yet", transform=ax.transAxes, ha="center", va="center")
    fig.tight_layout()
    return fig


def ledger_chart(counts: pd.DataFrame, *, ax=None, title: str = "The ledger: applied vs replayed per tool"):
    """Per tool, calls applied (ledger rows) and calls replayed (answered from the ledger); return the Figure."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 4.8))
    else:
        fig = ax.figure
    tools = list(counts["tool"]) if len(counts) else []
    x = range(len(tools))
    width = 0.38
    for offset, col, color, label in ((-width / 2, "applied", "tab:blue", "applied (ledger rows)"),
                                      (width / 2, "replayed", "tab:orange", "replayed (stored result returned)")):
        values = [int(v) for v in counts[col]] if len(counts) else []
        bars = ax.bar([i + offset for i in x], values, width, color=color, label=label)
        ax.bar_label(bars, padding=2)
    ax.set_xticks(list(x), labels=tools)
    ax.set_ylabel("tool calls (count)")
    ax.yaxis.get_major_locator().set_params(integer=True)
    top = max([1, *(int(v) for v in counts["applied"]), *(int(v) for v in counts["replayed"])]) if len(counts) else 1
    ax.set_ylim(0, top * 1.25 + 0.5)
    ax.set_title(title)
    if tools and (counts["applied"].sum() + counts["replayed"].sum()) > 0:
        ax.legend(loc="upper right", fontsize=11)
    else:
        ax.text(0.5, 0.5, "the ledger is empty (this preset has no ledger, or nothing was applied)",
                transform=ax.transAxes, ha="center", va="center")
    fig.tight_layout()
    return fig


def violations_chart(table: pd.DataFrame, *, ax=None, figsize: tuple[float, float] = (9, 4.2)):
    """Invariant violations by kind for each fault and preset: one horizontal bar per row of ``table`` (rows
    "fault · preset", columns kinds, counts, as :meth:`agentlab.lab.session.LabSession.violations_by_kind`
    gives), split by kind; return the Figure. 9 x 4.2 inches by default (720 x 336 px as the widget draws it).

    It stands beside the rollback rate because a rate can hide what went wrong: ``provider_timeout`` under
    ``ledger`` rolls nothing back (0 %) while the card is charged twice (a ``payment_count`` violation)."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=figsize)
    else:
        fig = ax.figure
    series = [str(s) for s in table.index]
    left = [0] * len(series)
    colors = plt.get_cmap("tab10")
    for k, kind in enumerate(table.columns):
        values = [int(v) for v in table[kind]]
        if not any(values):
            continue
        bars = ax.barh(series, values, left=left, color=colors(k % 10), label=str(kind))
        ax.bar_label(bars, labels=[str(v) if v else "" for v in values], label_type="center", color="white")
        left = [a + b for a, b in zip(left, values)]
    ax.invert_yaxis()  # the first fault and preset run on top, as in the rollback chart's legend
    ax.set_xlabel("invariant violations (count, all episodes so far)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlim(0, max([1, *left]) * 1.1)
    ax.set_title("Violations by kind, per fault and preset")
    if any(left):
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0, fontsize=11)
    else:
        ax.text(0.5, 0.5, "no violations so far" if series else "run an episode to see its violations",
                transform=ax.transAxes, ha="center", va="center")
    fig.tight_layout()
    return fig
