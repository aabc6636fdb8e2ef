"""Kept import path: notebook 02's exercises moved to :mod:`agentlab.course.exercises.nb02`."""

from agentlab.course.exercises.nb02 import EXERCISES  # noqa: F401 (kept import path)
