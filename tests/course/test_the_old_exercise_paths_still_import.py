"""The exercises moved from ``agentlab.lab.exercises`` to ``agentlab.course.exercises`` and the reference
solutions from a top-level ``solutions`` package to ``agentlab.course.solutions``: the old module paths of
the exercises still import and give the same objects, and the wheel ships ``agentlab`` alone."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import tomllib
from pathlib import Path

import agentlab.course.exercises as course_exercises
import agentlab.lab.exercises as kept

ROOT = Path(__file__).resolve().parents[2]


def test_every_public_name_of_the_exercises_is_the_same_object_from_its_old_path():
    for name in (*course_exercises.__all__, "BAR_DELAY_S"):
        assert getattr(kept, name) is getattr(course_exercises, name), name
    assert kept.__all__ == course_exercises.__all__


def _defined_names(module) -> list[str]:
    """The public names ``module``'s own source binds at its top level (what it imported is not its own)."""
    tree = ast.parse(Path(module.__file__).read_text())
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return [n for n in names if not n.startswith("_")]


def test_each_exercise_module_keeps_its_old_path_with_the_same_public_names():
    modules = sorted(info.name for info in pkgutil.iter_modules(course_exercises.__path__))
    assert "nb02" in modules and "values" in modules
    for module in modules:
        new = importlib.import_module(f"agentlab.course.exercises.{module}")
        old = importlib.import_module(f"agentlab.lab.exercises.{module}")
        for name in _defined_names(new):
            assert getattr(old, name) is getattr(new, name), (module, name)


def test_the_old_module_paths_find_the_same_exercises():
    assert [e.id for e in kept.exercises()] == [e.id for e in course_exercises.exercises()]
    assert kept.get_exercise("2.1") is course_exercises.get_exercise("2.1")
    assert course_exercises.get_exercise("2.1").solution.startswith("agentlab.course.solutions.")


def test_the_wheel_ships_the_agentlab_package_alone():
    from setuptools import find_packages

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = find_packages(str(ROOT), include=include)
    assert {p.split(".")[0] for p in packages} == {"agentlab"}
    assert {"agentlab.course.exercises", "agentlab.course.solutions", "agentlab.lab.exercises"} <= set(packages)
    assert not (ROOT / "solutions").exists()
