"""Kept import path: notebook 13's exercises moved to :mod:`agentlab.course.exercises.nb13`."""

from agentlab.course.exercises.nb13 import EXERCISES  # noqa: F401 (kept import path)
