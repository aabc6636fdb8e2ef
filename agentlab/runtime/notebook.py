"""What a notebook's first cell needs: a fresh database, projector-sized charts, quiet logs.

``h = await open_notebook("01")`` creates a database of the notebook's own (dropped when the kernel
exits, so a notebook can be run again and again), opens a :class:`agentlab.runtime.harness.Harness` on it and
prints one line that holds nothing machine-specific, so stored outputs stay valid under nbval::

    h = await open_notebook("01")    # prints "notebook 01: a fresh database is ready"
    await h.df("SELECT id, name, credit_cents FROM customers ORDER BY id")
    await h.close()                  # the notebook's last cell: drops the database
"""

from __future__ import annotations

import atexit
import logging

from agentlab.core.errors import AgentlabError
from agentlab.runtime import db
from agentlab.runtime.harness import Harness

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


_OPEN: dict[str, Harness] = {}  # the harness each notebook's first cell opened last in this kernel


async def open_notebook(name: str, *, keep: bool = False, domain=None) -> Harness:
    """A :class:`Harness` on a fresh database for notebook ``name`` (e.g. ``"01"``), for ``domain`` (a
    :class:`agentlab.core.domain.Domain` or its name; default billing).

    The database is dropped by ``await h.close()`` (the notebook's last cell) unless ``keep``, and, as a
    fallback, when the kernel exits without it (a kernel killed outright, as nbval stops its kernels,
    runs no exit hook: the last cell is what cleans up). Running the notebook again gives another
    fresh one; running the first cell again in the same kernel first closes the harness it opened
    before (and drops that database), so nothing is left reconnecting. Raises :class:`agentlab.runtime.db.DatabaseUnavailable` with one actionable line,
    and :class:`agentlab.core.errors.AgentlabError` with the install line when the notebook needs an optional
    install that is missing here (:func:`missing_install`; notebook 20: the durable engines).
    """
    import pandas as pd

    logging.getLogger("agentlab.core.events").setLevel(logging.ERROR)
    # a pool discarding a connection a fault killed is expected here, and its message names an address
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    use_projector_style()
    honour_semicolons()
    pd.set_option("display.max_colwidth", 90)
    pd.set_option("display.width", 160)
    needs = notebook_needs(name)
    if needs is not None:  # a notebook that needs an optional install says so before it starts anything
        raise AgentlabError(needs)
    previous = _OPEN.pop(name, None)
    if previous is not None:  # the first cell run again: the old harness's pools closed, its database dropped
        await previous.close()
    h = await Harness.open(purpose=f"nb{name}", keep=keep, domain=domain)
    _OPEN[name] = h
    if not keep:
        drop_at_exit(h.url)
    print(f"notebook {name}: a fresh database is ready")
    return h


def honour_semicolons(shell=None) -> bool:
    """Make a trailing ``;`` hide a cell's value even when the cell runs with ``store_history=False``.

    nbval (0.10 and later) runs every cell with ``store_history=False``; IPython then looks for the ``;``
    in the last cell *stored* in its history, not the one running (ipython/ipython#14162,
    computationalmodelling/nbval#194), so ``plt.plot(...);`` shows its value under nbval and not in
    Jupyter, and a chart appears twice. This remembers each running cell (a ``pre_run_cell`` event) and
    has the display hook read the ``;`` from it. Returns False outside IPython (nothing to do).
    Idempotent: a notebook can call it in every first cell.
    """
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        shell = get_ipython()
    if shell is None or getattr(shell.displayhook, "_agentlab_semicolons", False):
        return shell is not None
    hook, running = shell.displayhook, {"cell": None}
    stored_quiet = hook.quiet

    def remember(info) -> None:
        running["cell"] = None if info.store_history else info.raw_cell

    def quiet() -> bool:
        cell = running["cell"]
        if cell is None:
            return stored_quiet()
        try:
            return hook.semicolon_at_end_of_expression(shell.transform_cell(cell))
        except Exception:  # a cell the tokenizer cannot read: IPython's own answer
            return stored_quiet()

    shell.events.register("pre_run_cell", remember)
    hook.quiet = quiet
    hook._agentlab_semicolons = True
    return True


def drop_at_exit(url: str) -> None:
    """Drop the database at ``url`` when the interpreter (a notebook's kernel) exits, quietly: the fallback
    for a notebook whose last cell did not run. A kernel killed outright runs no exit hook."""
    atexit.register(_drop_quietly, url)


def _drop_quietly(url: str) -> None:
    try:
        db.drop_database(url)
    except Exception:  # the server may already be gone at interpreter exit
        pass


def notebook_needs(name: str, *, find_spec=None) -> str | None:
    """:func:`missing_install` for notebook ``name`` (``"20"``) of the repository's ``notebooks/`` folder; None when
    it needs nothing missing, or when the folder is not beside the package (an installed wheel)."""
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "notebooks"
    found = sorted(folder.glob(f"{name}_*.ipynb")) if folder.is_dir() else []
    return missing_install(found[0], find_spec=find_spec) if found else None


def missing_install(path, *, find_spec=None) -> str | None:
    """The line that installs what the notebook at ``path`` needs beyond ``requirements.txt`` when a module of
    it is not importable here, None when every one is (or the notebook names none).

    A notebook names its optional modules in its metadata, each with the line that installs it:
    ``{"agentlab": {"needs": {"dbos": "pip install -r requirements-engines.txt"}}}``. The repository's
    ``conftest.py`` skips such a notebook's nbval cells with this line, and the suite's runs of it (re-run
    safety, the browser) skip with it too, so a machine with ``requirements.txt`` alone skips notebook 20
    where CI, which installs the engines, runs it. ``find_spec`` (default :func:`importlib.util.find_spec`)
    decides what is importable.
    """
    import importlib.util
    import json
    from pathlib import Path

    find_spec = find_spec or importlib.util.find_spec
    needs = json.loads(Path(path).read_text()).get("metadata", {}).get("agentlab", {}).get("needs", {})
    for module, install in needs.items():
        try:
            found = find_spec(module)
        except (ImportError, ValueError):  # a parent package missing, or a module without a spec
            found = None
        if found is None:
            return f"{Path(path).name} needs {module}, an optional install: {install}"
    return None
