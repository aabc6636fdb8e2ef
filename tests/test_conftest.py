"""The suite's own scheduling (tests/conftest.py): files kept whole are exactly those with a module-scoped
fixture, and every unit of work keeps its tests in order."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import LONGEST_FIRST, WHOLE_FILES, _rank, _unit

ROOT = Path(__file__).resolve().parent.parent


def _module_scoped(path: Path) -> bool:
    """Whether ``path`` defines a fixture with ``scope="module"`` (or class or package)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.keyword) and node.arg == "scope" and isinstance(node.value, ast.Constant):
            if node.value.value in ("module", "class", "package"):
                return True
    return False


def test_the_files_kept_whole_are_those_with_a_module_scoped_fixture():
    found = {f"tests/{p.name}" for p in sorted((ROOT / "tests").glob("test_*.py")) if _module_scoped(p)}
    assert found == set(WHOLE_FILES)


def test_a_notebook_and_a_file_kept_whole_are_one_unit_every_other_test_its_own():
    assert _unit("notebooks/09_failure_lab.ipynb::Cell 3") == "notebooks/09_failure_lab.ipynb"
    assert _unit("tests/test_experiments.py::test_same_seed_same_table") == "tests/test_experiments.py"
    assert _unit("tests/test_saga.py::test_x[a]") == "tests/test_saga.py::test_x[a]"


def test_the_longest_units_rank_first_and_every_prefix_names_an_existing_file():
    assert _rank("tests/test_browser.py::test_browser_each_notebook_opens_unmodified[00_setup]") == 0
    assert _rank("tests/test_rerun_safety.py::test_each_code_cell_run_twice_prints_what_it_stored[20_the]") == 1
    assert _rank("tests/test_rerun_safety.py::test_each_code_cell_run_twice_prints_what_it_stored[19_your]") == 2
    assert _rank("tests/test_saga.py::test_x") == len(LONGEST_FIRST)
    for prefix in LONGEST_FIRST:
        assert (ROOT / prefix.split("::", 1)[0]).is_file(), prefix
