"""Kept import path: notebook 11's exercises moved to :mod:`agentlab.course.exercises.nb11`."""

from agentlab.course.exercises.nb11 import EXERCISES  # noqa: F401 (kept import path)
