"""Kept import path: notebook 14's exercises moved to :mod:`agentlab.course.exercises.nb14`."""

from agentlab.course.exercises.nb14 import EXERCISES  # noqa: F401 (kept import path)
