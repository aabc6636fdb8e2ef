"""Kept import path: the exercises moved to :mod:`agentlab.course.exercises` (the course is a layer above the lab).

``from agentlab.lab.exercises import check`` and ``agentlab.lab.exercises.nb02`` still work and give the
same objects; a module constant such as ``BAR_DELAY_S`` is read where it lives now, so set it on
:mod:`agentlab.course.exercises`.
"""

from agentlab.course.exercises import (  # noqa: F401 (kept import path)
    BAR_DELAY_S,
    DEFAULT_TIMEOUT_S,
    Case,
    Exercise,
    Verdict,
    check,
    exercises,
    get_exercise,
    reference,
    solution,
    solution_source,
)

__all__ = ["DEFAULT_TIMEOUT_S", "Case", "Exercise", "Verdict", "check", "exercises", "get_exercise", "reference",
           "solution", "solution_source"]
