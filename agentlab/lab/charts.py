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
    """The fault x preset heatmap of an :class:`agentlab.lab.experiments.ExperimentResult`, titled with its size."""
    title = (f"Invariant violations: {result.episodes_per_cell} episode(s) per cell, seed {result.seed}")
    return heatmap(result.summary, ax=ax, title=title)


def save(fig, path: str | Path, *, dpi: int = 150) -> Path:
    """Write ``fig`` as a PNG to ``path``; return the path."""
    path = Path(path)
    fig.savefig(path, dpi=dpi, format="png")
    return path
