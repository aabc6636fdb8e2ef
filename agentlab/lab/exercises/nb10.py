"""Kept import path: notebook 10's exercises moved to :mod:`agentlab.course.exercises.nb10`."""

from agentlab.course.exercises.nb10 import EXERCISES  # noqa: F401 (kept import path)
