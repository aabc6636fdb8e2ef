"""The instructor kit cannot rot: the slides' numbers come from the notebooks' stored outputs, every
name the one-page reference lists exists in the code (and every safeguard and hook is listed), and the
guide has a section for every notebook, naming exercises that exist in ``agentlab/course/solutions/``."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import agentlab
from agentlab.core.outbox import WorkerHooks
from agentlab.core.tools_node import NodeHooks
from agentlab.durable.saga import SagaHooks
from agentlab.runtime.harness import Episode, Harness

ROOT = Path(__file__).resolve().parent.parent
INSTRUCTOR = ROOT / "instructor"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _outputs(path: Path) -> str:
    parts = []
    for cell in json.loads(path.read_text())["cells"]:
        for output in cell.get("outputs", []):
            text = output.get("text") or output.get("data", {}).get("text/plain", "")
            parts.append(text if isinstance(text, str) else "".join(text))
    return "\n".join(parts)


def _slides(tmp_path: Path) -> str:
    out = tmp_path / "slides.md"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_slides.py"), "--out", str(out)],
                          check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return out.read_text()


def test_the_slides_script_writes_one_slide_per_notebook(tmp_path):
    text = _slides(tmp_path)
    named = re.findall(r"\*`notebooks/([^`]+)`\*", text)
    assert named == [p.name for p in NOTEBOOKS]


def test_each_slide_number_is_in_its_notebooks_stored_outputs(tmp_path):
    """The number on each slide, as stored (no thousands separator), appears in that notebook's outputs
    within the context the slide script searched: found again by the slide's own pattern, and as a
    bare number in the notebook's text outputs."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        make_slides = importlib.import_module("make_slides")
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    text = _slides(tmp_path)
    slides = text.split("\n---\n")[1:]
    assert len(slides) == len(make_slides.SLIDES)
    for slide, spec in zip(slides, make_slides.SLIDES):
        (shown,) = re.findall(r"^# (-?[\d,]+)$", slide, re.MULTILINE)
        number = shown.replace(",", "")
        (notebook,) = re.findall(r"\*`notebooks/([^`]+)`\*", slide)
        assert notebook.startswith(spec.notebook + "_")
        stored = _outputs(ROOT / "notebooks" / notebook)
        assert re.search(rf"(?<![\d-]){re.escape(number)}(?!\d)", stored), (notebook, number)
        assert re.search(spec.pattern, stored, re.MULTILINE).group(1) == number


def test_the_checked_in_slides_are_the_ones_the_script_writes(tmp_path):
    assert (INSTRUCTOR / "slides.md").read_text() == _slides(tmp_path), "run python scripts/make_slides.py"


# --------------------------------------------------------------------------- the reference page

REFERENCE = (INSTRUCTOR / "REFERENCE.md").read_text()
OWNERS = {"Harness": Harness, "Safeguards": agentlab.Safeguards, "Episode": Episode,
          "NodeHooks": NodeHooks, "WorkerHooks": WorkerHooks, "SagaHooks": SagaHooks}


def _listed() -> set[tuple[str, str]]:
    return set(re.findall(r"`(" + "|".join(OWNERS) + r")\.(\w+)", REFERENCE))


def _names_of(owner: type) -> set[str]:
    """Class attributes, dataclass fields and, for the harness, what ``__init__`` sets on ``self``."""
    names = set(dir(owner))
    if dataclasses.is_dataclass(owner):
        names |= {f.name for f in dataclasses.fields(owner)}
    if not dataclasses.is_dataclass(owner):  # a dataclass's __init__ is generated: it has no source
        names |= set(re.findall(r"self\.(\w+)\s*(?::[^=\n]+)?=", inspect.getsource(owner.__init__)))
    return names


def test_every_name_the_reference_lists_exists():
    listed = _listed()
    assert len(listed) > 40
    missing = sorted(f"{o}.{n}" for o, n in listed if n not in _names_of(OWNERS[o]))
    assert not missing


def test_every_call_in_the_reference_has_the_parameters_it_shows():
    for _owner, name, params in re.findall(r"`(Harness)\.(\w+)\(([^)]*)\)`", REFERENCE):
        signature = inspect.signature(getattr(Harness, name))
        shown = {p.strip().split("=")[0].lstrip("*") for p in params.split(",") if p.strip() not in ("", "*")}
        assert shown <= set(signature.parameters), (name, shown - set(signature.parameters))


@pytest.mark.parametrize("owner", ["Safeguards", "NodeHooks", "WorkerHooks", "SagaHooks"])
def test_the_reference_lists_every_field(owner):
    fields = {f.name for f in dataclasses.fields(OWNERS[owner])}
    assert fields <= {n for o, n in _listed() if o == owner}


def test_the_reference_lists_every_public_harness_method_a_notebook_uses():
    used = set()
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                used |= set(re.findall(r"\bh\.(\w+)\(", "".join(cell["source"])))
    methods = {n for n in used if callable(getattr(Harness, n, None))}
    assert methods, "the notebooks call harness methods"
    assert methods <= {n for o, n in _listed() if o == "Harness"}


def test_the_names_imported_in_the_reference_come_from_agentlab():
    for name in ("open_notebook", "preset", "PRESETS", "Policy", "SimulatedCrash", "episode_report", "render",
                 "TransactionalToolsNode", "OutboxWorker", "SagaRunner", "HarnessClosed", "check", "solution",
                 "check_invariant"):
        assert name in REFERENCE and hasattr(agentlab, name), name


# --------------------------------------------------------------------------- the guide

GUIDE = (INSTRUCTOR / "GUIDE.md").read_text()


def test_the_guide_has_a_section_per_notebook_with_its_parts():
    sections = re.split(r"^## ", GUIDE, flags=re.MULTILINE)[1:]
    by_file = {re.search(r"`(\d\d_\w+)\.ipynb`", s).group(1): s for s in sections}
    assert sorted(by_file) == [p.stem for p in NOTEBOOKS]
    for stem, section in by_file.items():
        for part in ("**Objective.**", "**Demo.**", "**Ask first.**", "**Common errors.**", "**Assign.**"):
            assert part in section, (stem, part)


def test_each_solutions_file_the_guide_names_comes_after_its_exercises_solution_call():
    """The attendee's path first: every ``agentlab/course/solutions/`` function the guide names is preceded,
    in the same parenthesis, by ``await solution("N.M")`` of the exercise whose reference solution it is, and the
    ``Exercise N.M`` the sentence assigns is that id."""
    from agentlab.course.exercises import get_exercise

    named = re.findall(r'Exercise (\d+\.\d+)(?:(?!Exercise)[^(])*\(`await solution\("(\d+\.\d+)"[^`]*`;\s+instructor\'s\s+copy\s+'
                       r"`agentlab/course/solutions/(ex\d\d_\w+)\.py:(\w+)`", GUIDE)
    assert len(named) == len(re.findall(r"`(?:\w+/)*solutions/ex\d\d_\w+\.py:\w+`", GUIDE)) == 32
    for assigned, called, module, function in named:
        assert assigned == called, (assigned, called)
        assert get_exercise(called).solution == f"agentlab.course.solutions.{module}:{function}", (called, module, function)


def test_the_exercises_the_guide_assigns_exist():
    """Every ``agentlab/course/solutions/exNN_x.py`` function the guide names exists (the file, and the function
    in the installed kit), and each notebook's exercise headings are assigned (core or stretch)."""
    for module, function in re.findall(r"`agentlab/course/solutions/(ex\d\d_\w+)\.py:(\w+)`", GUIDE):
        assert (ROOT / "agentlab/course/solutions" / f"{module}.py").is_file(), module  # the file the guide names
        module_path = f"agentlab.course.solutions.{module}"
        assert callable(getattr(importlib.import_module(module_path), function)), (module, function)
    for path in NOTEBOOKS:
        headings = set()
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                headings |= set(re.findall(r"^## Exercise (\d+\.\d+)", "".join(cell["source"]), re.MULTILINE))
        for number in headings:
            assert f"Exercise {number}" in GUIDE, (path.name, number)
