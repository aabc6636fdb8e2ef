"""Kept import path: notebook 05's exercises moved to :mod:`agentlab.course.exercises.nb05`."""

from agentlab.course.exercises.nb05 import EXERCISES  # noqa: F401 (kept import path)
