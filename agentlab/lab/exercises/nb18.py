"""Kept import path: notebook 18's exercises moved to :mod:`agentlab.course.exercises.nb18`."""

from agentlab.course.exercises.nb18 import EXERCISES, HOLD  # noqa: F401 (kept import path)
