"""The workshop's figures agree wherever they are written: the exercises the kit registers (which
``tests/test_solutions.py`` holds to the notebooks' ``## Exercise N.M`` headings), the README's workshop
table and the sentence above it, and instructor/PLANS.md (its totals and both plans).

The exercise minutes follow one rule, stated in both texts: 10 for a notebook's first exercise, 15 for
each further one, and 15 for 16's only exercise.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from agentlab.course.exercises import exercises

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
README_WORDS = " ".join(README.split())  # the README's prose, line breaks as spaces
PLANS = (ROOT / "instructor" / "PLANS.md").read_text()
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PER_NOTEBOOK = Counter(int(e.id.split(".")[0]) for e in exercises())
ONLY_EXERCISE_MINUTES = {16: 15}  # an invariant written from an empty function: as long as a stretch


def exercise_minutes(count: int, notebook: int) -> int:
    if count == 1 and notebook in ONLY_EXERCISE_MINUTES:
        return ONLY_EXERCISE_MINUTES[notebook]
    return 0 if count == 0 else 10 + 15 * (count - 1)


def readme_table() -> dict[str, tuple[int, int]]:
    """``{"02_schema_constraints": (reading, with exercises)}`` from the README's workshop table."""
    rows = re.findall(r"^\| `(\d\d_\w+)` \| (\d+) / (\d+) \|", README, re.MULTILINE)
    return {stem: (int(reading), int(total)) for stem, reading, total in rows}


def totals() -> tuple[int, int, int]:
    table = readme_table().values()
    reading = sum(r for r, _ in table)
    everything = sum(t for _, t in table)
    return reading, everything - reading, everything


def test_the_readme_table_has_every_notebook_once_with_its_exercises_minutes():
    table = readme_table()
    assert list(table) == NOTEBOOKS
    for stem, (reading, total) in table.items():
        number = int(stem[:2])
        assert total - reading == exercise_minutes(PER_NOTEBOOK[number], number), (stem, PER_NOTEBOOK[number])


def test_the_readmes_sentence_states_the_tables_totals_and_the_number_of_exercises():
    reading, exercise, everything = totals()
    sentence = re.search(r"Reading all twenty-one takes (\d+) minutes \(([\d.]+) hours\), the (\d+) exercises (\d+) "
                         r"more: (\d+) minutes \(about ([\d.]+) hours\) in all", README_WORDS)
    assert sentence, "the README's sentence on the workshop's minutes"
    hours, count, minutes, all_minutes, all_hours = sentence.group(2, 3, 4, 5, 6)
    assert int(sentence.group(1)) == reading and float(hours) == reading / 60
    assert int(count) == sum(PER_NOTEBOOK.values()) and int(minutes) == exercise
    assert int(all_minutes) == everything and float(all_hours) == round(everything / 60 * 4) / 4
    assert len(NOTEBOOKS) == 21  # "all twenty-one"


def test_the_readme_says_which_notebooks_have_no_exercise():
    stated = re.search(r"Every notebook from 02 on ends with one to three exercises \(none in ([\d, ]+ and \d+)\)", README_WORDS)
    without = [int(s[:2]) for s in NOTEBOOKS if int(s[:2]) >= 2 and not PER_NOTEBOOK[int(s[:2])]]
    assert [int(n) for n in re.findall(r"\d+", stated.group(1))] == without
    assert set(PER_NOTEBOOK.values()) <= {1, 2, 3} and min(PER_NOTEBOOK) == 2


def test_plans_totals_are_the_readmes():
    reading, exercise, everything = totals()
    assert re.search(rf"\b{reading} minutes for all twenty-one\b", PLANS)
    count = sum(PER_NOTEBOOK.values())
    stated = re.search(r"(\d+) exercises \(two in each of 02-15\s+and 18, a third in\s+09, one in 16\): (\d+) minutes",
                       PLANS)
    assert stated and (int(stated.group(1)), int(stated.group(2))) == (count, exercise)
    two = {n for n in range(2, 16)} | {18}
    assert PER_NOTEBOOK == Counter({n: 2 for n in two} | {9: 3, 16: 1})  # what that parenthesis says
    assert re.search(rf"\*\*{everything} minutes, about {everything / 60:g} hours\*\*", PLANS)


def _plan(title: str) -> str:
    return PLANS.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def _numbers(text: str) -> set[int]:
    """``03, 04, 06 and 11-18`` as the notebook numbers it names."""
    found = set()
    for first, last in re.findall(r"\b(\d\d)(?:-(\d\d))?\b", text):
        found |= set(range(int(first), int(last or first) + 1))
    return found


@pytest.mark.parametrize("title", ["A full day", "Three hours"])
def test_each_plan_places_every_notebook_and_assigns_exercises_of_its_own_notebooks(title):
    plan = _plan(title)
    rows = re.findall(r"^\| (\d\d:\d\d) \| ([^|]+) \| ([^|]*) \|$", plan, re.MULTILINE)
    taught = {int(m.group(1)) for _, what, _ in rows if (m := re.match(r"(\d\d) ", what))}
    home = _numbers(re.search(r";([^;]*?)\sgo\s+home", plan.split("|", 1)[0], re.DOTALL).group(1))
    assert taught | home == {int(s[:2]) for s in NOTEBOOKS}, (title, sorted(taught), sorted(home))
    assert not taught & home, title
    known = {e.id for e in exercises()}
    for _, _, in_class in rows:
        for exercise in re.findall(r"\b(?:core|stretch|exercise) (\d+\.\d+)", in_class):
            assert exercise in known, (title, exercise)
            assert int(exercise.split(".")[0]) in taught, f"{title}: {exercise} without its notebook"
    clock = [int(t[:2]) * 60 + int(t[3:]) for t, _, _ in rows]
    assert clock == sorted(clock) and len(set(clock)) == len(clock), title
