"""open_notebook: a fresh database per notebook, dropped by the notebook's last cell (``await h.close()``)."""

from __future__ import annotations

import pytest

from agentlab.runtime import db
from agentlab.runtime.notebook import open_notebook


async def test_the_last_cell_drops_the_notebooks_database(capsys):
    h = await open_notebook("zz")
    name = db.dbname_of(h.url)
    assert capsys.readouterr().out == "notebook zz: a fresh database is ready\n"
    assert name.startswith("agentlab_nbzz_") and name in db.list_databases()
    await h.close()
    assert name not in db.list_databases()  # a kernel killed after this cell leaves nothing behind


async def test_keep_leaves_the_database_for_inspection():
    h = await open_notebook("zz", keep=True)
    name = db.dbname_of(h.url)
    await h.close()
    try:
        assert name in db.list_databases()
    finally:
        db.drop_database(name)


def test_each_committed_notebook_names_its_kernel_as_jupyterlab_writes_it():
    """Opening a notebook must not mark it modified: JupyterLab rewrites ``metadata.kernelspec`` from the
    kernel it starts (``display_name`` "Python 3 (ipykernel)", not "Python 3"), which an attendee's
    ``git status`` would then show. The browser test checks the same thing in a real JupyterLab."""
    import json
    from pathlib import Path

    from jupyter_client.kernelspec import get_kernel_spec

    spec = get_kernel_spec("python3")
    wanted = {"display_name": spec.display_name, "language": spec.language, "name": "python3"}
    notebooks = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert len(notebooks) >= 16
    differ = {p.name: json.loads(p.read_text())["metadata"]["kernelspec"] for p in notebooks}
    assert {n: k for n, k in differ.items() if k != wanted} == {}
    assert wanted["display_name"] == "Python 3 (ipykernel)"


def test_notebooks_and_solutions_import_the_kit_from_agentlab_only():
    """What a learner copies must use the public names (``from agentlab import ...``), never a submodule."""
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    pattern = re.compile(r"^\s*(from|import)\s+agentlab\.", re.MULTILINE)
    found = []
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code" and pattern.search("".join(cell["source"])):
                found.append(path.name)
    solutions = sorted((root / "agentlab/course/solutions").glob("ex*.py"))
    assert len(solutions) >= 16
    for path in solutions:
        if pattern.search(path.read_text()):
            found.append(path.name)
    assert found == []


def _notebook_needing(tmp_path, needs):
    import json

    path = tmp_path / "99_needs.ipynb"
    path.write_text(json.dumps({"cells": [], "metadata": {"agentlab": {"needs": needs}}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_a_notebook_whose_optional_module_is_missing_names_the_line_that_installs_it(tmp_path):
    from agentlab.runtime.notebook import missing_install

    path = _notebook_needing(tmp_path, {"agentlab_no_such_engine": "pip install -r requirements-engines.txt"})
    assert missing_install(path) == ("99_needs.ipynb needs agentlab_no_such_engine, an optional install: "
                                     "pip install -r requirements-engines.txt")
    assert missing_install(path, find_spec=lambda name: object()) is None  # installed: nothing to say
    assert missing_install(_notebook_needing(tmp_path, {})) is None


def test_notebook_20_needs_dbos_and_runs_where_it_is_installed():
    import importlib.util
    from pathlib import Path

    from agentlab.runtime.notebook import missing_install

    (path,) = (Path(__file__).resolve().parent.parent / "notebooks").glob("20_*.ipynb")
    assert missing_install(path, find_spec=lambda name: None) == (
        f"{path.name} needs dbos, an optional install: pip install -r requirements-engines.txt")
    assert (missing_install(path) is None) == (importlib.util.find_spec("dbos") is not None)


@pytest.mark.slow
def test_without_dbos_nbval_skips_notebook_20_with_the_install_line():
    """The collection of a pytest process where ``dbos`` cannot be imported: every cell of notebook 20 is skipped
    (no kernel started), with the install line as the reason."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    (path,) = (root / "notebooks").glob("20_*.ipynb")
    program = ("import sys; sys.modules['dbos'] = None; import pytest; "
               f"sys.exit(pytest.main(['-n', '0', '-q', '-rs', {str(path.relative_to(root))!r}]))")
    done = subprocess.run([sys.executable, "-c", program], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" not in done.stdout and " skipped" in done.stdout
    assert "needs dbos, an optional install: pip install -r requirements-engines.txt" in done.stdout


async def test_opening_notebook_20_without_the_engines_says_how_to_install_them(monkeypatch):
    """The notebook's first cell stops on one actionable line, before it makes a database, where DBOS is missing."""
    import sys

    import pytest

    from agentlab.core.errors import AgentlabError
    from agentlab.runtime.notebook import open_notebook

    monkeypatch.setitem(sys.modules, "dbos", None)  # `import dbos` fails, as without requirements-engines.txt
    with pytest.raises(AgentlabError, match=r"needs dbos, an optional install: pip install -r requirements-engines.txt"):
        await open_notebook("20")
