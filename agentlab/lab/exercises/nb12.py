"""Kept import path: notebook 12's exercises moved to :mod:`agentlab.course.exercises.nb12`."""

from agentlab.course.exercises.nb12 import EXERCISES  # noqa: F401 (kept import path)
