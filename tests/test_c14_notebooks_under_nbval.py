"""Case C14: notebooks under nbval.

Input: cells with ``plt.plot(...);``, an ipywidgets control, a DataFrame with timestamps and ids.
Right result: ``pytest --nbval`` passes twice in a row on a fresh database; figure-size reprs, timestamps
and ids are sanitized (``notebooks/sanitize.cfg``); widget cells have a non-widget default path reaching
the same database state.
"""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import nbformat
import pytest

from agentlab.lab.session import LabSession
from agentlab.lab.widget import FailureLab
from agentlab.runtime import db
from agentlab.runtime.harness import Harness
from agentlab.runtime.notebook import honour_semicolons

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SANITIZE = ROOT / "notebooks" / "sanitize.cfg"
PAYMENT_ID = re.compile(r"\b(ch|re)_[0-9a-f]{16}\b")

# The C14 input as a notebook: a plot ended by ';', the failure lab widget driven by its button, a plain
# ipywidgets control, DataFrames holding timestamps, thread ids, tool call ids and payment ids.
C14_CELLS = [
    'from agentlab.runtime.notebook import open_notebook\nh = await open_notebook("c14")',
    "import matplotlib.pyplot as plt\nplt.plot([0, 1, 2], [3, 1, 2]);",
    "from agentlab.lab.widget import FailureLab\nlab = FailureLab(h)\nlab",
    ('lab.choose(fault="crash_before_checkpoint", preset="ledger", scenario="refund", seed=0)\n'
     "lab.run_button.click()\nresult = await lab.wait()\nprint(result.headline())"),
    "await h.df('SELECT thread_id, tool_call_id, tool_name, created_at FROM tool_executions ORDER BY tool_call_id')",
    "await h.df('SELECT id, kind, amount_cents, created_at FROM provider.payments')",
    "import ipywidgets\nipywidgets.IntSlider(value=3, description='episodes')",
    "await h.close()",
]


def sanitizers() -> list[tuple[re.Pattern, str]]:
    """The project's nbval sanitize file, read the way nbval reads it (sections of ``regex`` and ``replace``)."""
    parser = configparser.ConfigParser()
    parser.read(SANITIZE)
    return [(re.compile(parser[s]["regex"]), parser[s]["replace"]) for s in parser.sections()]


def sanitize(text: str) -> str:
    for regex, replace in sanitizers():
        text = regex.sub(replace, text)
    return text


def test_c14_the_sanitize_file_masks_figure_sizes_timestamps_and_ids():
    raw = ("<Figure size 1000x480 with 1 Axes> at 2026-03-01 12:34:56.789012+00:00 and 2026-03-01T12:34:56 "
           "crash_before_checkpoint-ledger-03e871c26ea1 call_f4da9d3c9b3a0c5752ba re_41acad012643b460 "
           "ch_0123456789abcdef agentlab_nb09_1a2b3c4d <psycopg.AsyncConnection at 0x7f125080ddd0>")
    assert sanitize(raw) == ("<FIGURE> at TIMESTAMP and TIMESTAMP crash_before_checkpoint-ledger-THREAD CALL_ID "
                             "PAYMENT_ID PAYMENT_ID DATABASE <psycopg.AsyncConnection at 0xADDRESS>")


def test_c14_a_trailing_semicolon_hides_the_value_when_the_cell_is_not_stored(capsys):
    """nbval runs cells with ``store_history=False``, where IPython reads the ';' from the previous stored
    cell (ipython#14162): ``plt.plot(...);`` showed its value under nbval only. ``open_notebook`` fixes it."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.hist_file = ":memory:"  # nothing written to the user's IPython profile
    shell = InteractiveShell(config=config)
    shell.run_cell("41", store_history=True)  # a stored cell without ';'
    capsys.readouterr()
    shell.run_cell("1;", store_history=False)
    assert "1" in capsys.readouterr().out  # the gap: the value is shown despite the ';'
    assert honour_semicolons(shell) and honour_semicolons(shell)  # idempotent
    shell.run_cell("1;", store_history=False)
    assert capsys.readouterr().out == ""
    shell.run_cell("2", store_history=False)
    assert "2" in capsys.readouterr().out
    shell.run_cell("3;", store_history=True)
    assert capsys.readouterr().out == ""


def _kernel_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run_nbval(cwd: Path, *notebooks: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    """``pytest --nbval`` on ``notebooks`` (names in ``cwd``), each in a kernel of its own, with ``cwd``'s
    ``sanitize.cfg``, in a process of its own; its output is the completed process's ``stdout``.

    The inner run is nbval's alone: a ``pytest.ini`` in ``cwd`` keeps the project's options out, and
    ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` the installed plugins (xdist, asyncio, hypothesis, langsmith), which
    it does not use and which cost about 2.5 s of CPU to load, per notebook. It also goes without
    ``rfc3987_syntax``: jsonschema, under nbformat, would import it for the ``iri`` formats the notebook
    schema does not use, and building its grammar costs another second."""
    (cwd / "pytest.ini").write_text("[pytest]\n")
    inner = "import sys; sys.modules['rfc3987_syntax'] = None; import pytest; sys.exit(pytest.main())"
    command = [sys.executable, "-c", inner, "-c", "pytest.ini", "--rootdir", ".", "-v", "-p", "no:cacheprovider",
               "-p", "nbval.plugin", "--nbval", "--nbval-current-env", "--nbval-sanitize-with", "sanitize.cfg",
               "--nbval-cell-timeout", "600", *notebooks]
    env = _kernel_env() | {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)


def test_c14_a_notebook_with_a_plot_a_widget_and_timestamps_passes_nbval_twice_in_a_row(tmp_path):
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in C14_CELLS]
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    path = tmp_path / "c14.ipynb"
    env = _kernel_env()
    old = dict(os.environ)
    os.environ.update(env)  # the kernel nbclient starts inherits this process's environment
    try:
        client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    nbformat.write(nb, path)
    nbformat.write(nb, tmp_path / "c14_again.ipynb")  # the same notebook, validated right after the first
    before = set(db.list_databases())
    (tmp_path / "sanitize.cfg").write_text(SANITIZE.read_text())  # the project's file, beside the notebooks
    done = run_nbval(tmp_path, "c14.ipynb", "c14_again.ipynb")
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    assert f"{2 * len(C14_CELLS)} passed" in done.stdout  # each copy in its own kernel and its own fresh database
    order = re.findall(r"^(c14(?:_again)?)\W+ipynb::Cell (\d+) PASSED", done.stdout, re.MULTILINE)
    assert order == [(name, str(n)) for name in ("c14", "c14_again") for n in range(len(C14_CELLS))]
    assert not {d for d in db.list_databases() if d.startswith("agentlab_nbc14_")} - before  # each run dropped its own


def _outputs(nb) -> list[tuple[int, dict]]:
    return [(i, o) for i, c in enumerate(nb.cells) if c.cell_type == "code" for o in c.get("outputs", [])]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_c14_each_committed_notebook_is_ready_for_nbval(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    # the first cell opens the notebook's database; a notebook that defines its own domain (16) opens it
    # right after defining it, before any other work
    opens = next(i for i, c in enumerate(code) if "open_notebook(" in c.source)
    assert opens == 0 or "Domain(" in "".join(c.source for c in code[:opens + 1])
    assert code[-1].source.strip() == "await h.close()"
    assert all(c.execution_count is not None for c in code if c.source.strip()), "every cell was run and stored"
    for i, out in _outputs(nb):
        ignored = "NBVAL_IGNORE_OUTPUT" in nb.cells[i].source or "NBVAL_SKIP" in nb.cells[i].source
        text = out.get("text", "") + out.get("data", {}).get("text/plain", "")
        assert out["output_type"] != "error", f"cell {i} stored an error"
        if ignored:
            continue
        assert "episodes/s" not in text and "wall" not in text, f"cell {i} shows a wall time"
        if "application/vnd.jupyter.widget-view+json" in out.get("data", {}):
            assert "model_id" not in text and "outputs=" not in text, f"cell {i}: a widget's text form holds state"
        clean = sanitize(text)
        assert not re.search(r"0x[0-9a-f]{6,}|<Figure size|[0-9a-f]{8}-[0-9a-f]{4}-", clean), f"cell {i}: {clean[:200]}"


async def _database_state(h: Harness, threads: list[str]) -> dict:
    """What the episodes left in the database, with the random parts named by position: thread ids by the
    order the episodes ran, payment ids masked; timestamps and the events' free text left out."""
    label = {t: f"thread-{n}" for n, t in enumerate(threads)}

    def norm(value):
        text = str(value)
        for t, name in label.items():
            text = text.replace(t, name)
        return PAYMENT_ID.sub("PAYMENT", text)

    queries = {
        "customers": "SELECT id, tenant_id, credit_cents FROM {s}.customers ORDER BY id",
        "invoices": "SELECT id, customer_id, billing_period, amount_cents, status FROM {s}.invoices ORDER BY id",
        "credit_memos": "SELECT id, customer_id, reference, amount_cents, invoice_id FROM {s}.credit_memos ORDER BY id",
        "refunds": "SELECT id, customer_id, reference, amount_cents, status FROM {s}.refunds ORDER BY id",
    }
    state: dict = {}
    for schema in ("public", "lax"):
        for name, query in queries.items():
            state[f"{schema}.{name}"] = [tuple(map(norm, r)) for r in (await h.df(query.format(s=schema))).values]
    for name, query in {
        "ledger": "SELECT thread_id, tool_call_id, tool_name, args, result, attempt FROM tool_executions",
        "outbox": "SELECT thread_id, topic, dedupe_key, status, attempts, provider_ref, payload FROM outbox",
        "payments": "SELECT kind, customer, amount_cents, reference, idempotency_key FROM provider.payments",
        "events": "SELECT thread_id, node, tool_name, tool_call_id, outcome, category, sqlstate, attempt FROM events",
        "checkpoints": "SELECT thread_id, count(*) FROM checkpoints GROUP BY thread_id",
    }.items():
        state[name] = sorted(tuple(map(norm, r)) for r in (await h.df(query)).values)
    return state


C14_ACTIONS = [
    {"fault": "crash_before_checkpoint", "scenario": "refund", "preset": "ledger", "seed": 0, "episodes": 1},
    {"fault": "provider_timeout", "scenario": "invoice", "preset": "full", "seed": 0, "episodes": 2},
    {"fault": "check_violation", "scenario": "batch", "preset": "transaction", "seed": 3, "episodes": 1},
    {"fault": "backend_killed", "scenario": "topup", "preset": "savepoints", "seed": 1, "episodes": 1},
]


@pytest.mark.slow
async def test_c14_the_widget_and_the_plain_calls_reach_the_same_database_state(database_url):
    """The same actions through the widget (dropdowns set, Run clicked) on one fresh database and through
    ``LabSession.run`` on another leave equal database states."""
    other_url = db.create_database("test")
    widget_h = await Harness.open(database_url)
    plain_h = await Harness.open(other_url)
    try:
        lab = FailureLab(widget_h)
        for action in C14_ACTIONS:
            lab.choose(**action)
            lab.run_button.click()
            await lab.wait()
        plain = LabSession(plain_h)
        for action in C14_ACTIONS:
            await plain.run(**action)
        assert [r.summary() for r in lab.session.results] == [r.summary() for r in plain.results]
        widget_state = await _database_state(widget_h, [r.thread_id for r in lab.session.results])
        plain_state = await _database_state(plain_h, [r.thread_id for r in plain.results])
        assert widget_state["ledger"] and widget_state["outbox"] and widget_state["payments"]  # something to compare
        assert widget_state == plain_state
    finally:
        await widget_h.close()
        await plain_h.close()
        db.drop_database(other_url)
