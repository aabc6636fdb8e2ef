"""Kept import path: notebook 06's exercises moved to :mod:`agentlab.course.exercises.nb06`."""

from agentlab.course.exercises.nb06 import EXERCISES  # noqa: F401 (kept import path)
