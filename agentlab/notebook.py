"""What a notebook's first cell needs: a fresh database, projector-sized charts, quiet logs.

``h = await open_notebook("01")`` creates a database of the notebook's own (dropped when the kernel
exits, so a notebook can be run again and again), opens a :class:`agentlab.harness.Harness` on it and
prints one line that holds nothing machine-specific, so stored outputs stay valid under nbval.
"""

from __future__ import annotations

import atexit
import logging

from agentlab import db
from agentlab.harness import Harness

PROJECTOR_STYLE = {
    "figure.figsize": (10, 4.8),
    "figure.dpi": 100,
    "font.size": 13,
    "axes.titlesize": 15,
    "axes.labelsize": 13,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.fontsize": 12,
}


def use_projector_style() -> None:
    """Large fonts and a wide figure, readable on a projector."""
    import matplotlib

    matplotlib.rcParams.update(PROJECTOR_STYLE)


async def open_notebook(name: str, *, keep: bool = False) -> Harness:
    """A :class:`Harness` on a fresh database for notebook ``name`` (e.g. ``"01"``).

    The database is dropped by ``await h.close()`` (the notebook's last cell) unless ``keep``, and, as a
    fallback, when the kernel exits without it (a kernel killed outright, as nbval stops its kernels,
    runs no exit hook: the last cell is what cleans up). Running the notebook again gives another
    fresh one. Raises :class:`agentlab.db.DatabaseUnavailable` with one actionable line.
    """
    import pandas as pd

    logging.getLogger("agentlab.events").setLevel(logging.ERROR)
    # a pool discarding a connection a fault killed is expected here, and its message names an address
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    use_projector_style()
    pd.set_option("display.max_colwidth", 90)
    pd.set_option("display.width", 160)
    h = await Harness.open(purpose=f"nb{name}", keep=keep)
    if not keep:
        atexit.register(_drop_quietly, h.url)
    print(f"notebook {name}: a fresh database is ready")
    return h


def _drop_quietly(url: str) -> None:
    try:
        db.drop_database(url)
    except Exception:  # the server may already be gone at interpreter exit
        pass
